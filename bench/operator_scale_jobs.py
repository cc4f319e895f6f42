"""The operator with many jobs at once (issue 49): `bench.operator_scale` at 10, 100 and 1,000
small ResilientTrainingJobs, and how each figure grows with the number of jobs.

Each size runs on a fresh KWOK cluster of its own: `--workers` pods a job (1 GPU each, one
per node), enough 8-GPU nodes for every job and its next world, and one GPU fault a second
(a rank's container ended with an NCCL error in its termination message, as the kubelet
writes it) on as many jobs as the minute holds (`--faults`, at most one per job). Reported
per size, from `bench.operator_scale`'s own measurements:

- decision latency: the victim's Failed status written -> the job's attempt record carries
  a failure class (what the operator decided), p50 / p99;
- recovery: the same Failed -> every pod of the next world Running, p50 / p99;
- operator CPU seconds per recovery (user + system in the fault window, over the faults);
- operator resident memory, steady (before the faults) and peak (sampled every 0.25 s);
- API requests per recovery, the operator's own (its lease calls apart) and the cluster's
  (all clients, the quiet rate taken off);
- each as a ratio to the smallest size: flat in the number of jobs is the goal.

    python -m bench.operator_scale_jobs [--sizes 10,100,1000] [--workers 2] [--faults 60]
        [--progress unanswered|off|answered] [--markdown bench/results/operator-scale-jobs.md]
        [--profile DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import large_cluster, operator_scale
from bench.operator_scale_report import INJECTOR_REQUESTS_PER_FAULT, QUIET_SECONDS
from bench.operator_scale_workload import PROGRESS_MODES
from bench.scale_probes import percentile
from e2e.operator_proc import REPO

GPUS_PER_NODE = 8
GOALS = {"decision p99 s": 2.0, "peak RSS MiB": 1024.0}
"""The issue's goals at 1,000 jobs; CPU per recovery: flat in the number of jobs."""


@dataclass
class Size:
    jobs: int
    pods: int
    nodes: int
    faults: int
    decision_p50: float
    decision_p99: float
    recovery_p50: float
    recovery_p99: float
    cpu_per_recovery: float
    rss_steady_mib: float
    rss_peak_mib: float
    operator_requests_per_recovery: float
    reconciles_per_recovery: float
    cluster_requests_per_recovery: float
    startup_seconds: float
    problems: list[str]
    idle_cpu_share: float = math.nan
    """The operator's CPU in the quiet window before the faults, as a share of one core:
    what its watches, progress rounds and checkpoint refresh cost with nothing failing."""
    progress_reads_per_second: float = math.nan
    """Progress reads the pods' sidecars answered a second in the fault window (0: none
    answers; NaN: a run from before they were counted)."""
    recovery_cpu: float = math.nan
    namespace_events: float = math.nan
    """Events in the jobs' namespace when the faults began."""
    event_list_ms: float = math.nan
    """The API server's mean time answering a LIST of Events in the fault window."""
    """CPU-s per recovery less the quiet window's rate over the fault window: what the
    recoveries themselves cost (`cpu_per_recovery` holds every routine look in between)."""


def nodes_for(jobs: int, workers: int) -> int:
    """Nodes enough for every job's world and a next world for each (1 GPU a pod), at least
    `workers` + 1 (one pod of a job a node)."""
    return max(workers + 1, math.ceil(jobs * workers * 1.25 / GPUS_PER_NODE))


def measure(
    jobs: int,
    workers: int,
    faults: int,
    work: Path,
    profile: Path | None = None,
    progress: str = "unanswered",
) -> Size:
    out = work / f"scale-{jobs}.json"
    nodes = nodes_for(jobs, workers)
    n_faults = min(faults, jobs)
    args = ["--jobs", str(jobs), "--workers", str(workers), "--nodes", str(nodes),
            "--faults", str(n_faults), "--stagger", "1", "--skip-baseline",
            "--json", str(out), "--progress", progress]  # fmt: skip
    if jobs * workers > 500:  # many pods on a small machine (bench.large_cluster)
        args += ["--lease", "40", "--pods-ready-timeout", large_cluster.LARGE_PODS_READY_TIMEOUT]
    if profile is not None:
        args += ["--profile", str(profile)]
    if operator_scale.main(args) != 0:
        raise RuntimeError(f"operator_scale {' '.join(args)} failed")
    if profile is not None:  # the run's own report beside its profile, every fault in it
        shutil.copy(out, profile / out.name)
    return summarize(json.loads(out.read_text()), jobs, workers, nodes)


def summarize(report: dict[str, Any], jobs: int, workers: int, nodes: int) -> Size:
    """One size's figures from `bench.operator_scale --json`'s report."""
    (phase,) = report["phases"]
    faults = phase["faults"]
    decided = [f["detected"] for f in faults if f["detected"] is not None]
    recovered = [f["recovered"] for f in faults if f["recovered"] is not None]
    n = max(len(faults), 1)
    window = float(phase["window_seconds"])
    cluster = (float(phase["cluster_requests"]) - INJECTOR_REQUESTS_PER_FAULT * len(faults)
               - phase["quiet_rate"] * window)  # as `Phase.requests_per_recovery`  # fmt: skip
    own = phase["operator_requests"] - phase["operator_lease_requests"]
    cpu = phase["cpu_window"].get("operator", math.nan)
    idle = phase.get("cpu_quiet", {}).get("operator", math.nan) / QUIET_SECONDS
    missing = len(faults) - len(decided)
    problems = list(phase["problems"]) + ([f"{missing} faults never decided"] if missing else [])
    return Size(
        jobs=jobs, pods=jobs * workers, nodes=nodes, faults=len(faults),
        decision_p50=percentile(decided, 0.5), decision_p99=percentile(decided, 0.99),
        recovery_p50=percentile(recovered, 0.5), recovery_p99=percentile(recovered, 0.99),
        cpu_per_recovery=cpu / n, idle_cpu_share=idle, recovery_cpu=(cpu - idle * window) / n,
        progress_reads_per_second=phase.get("progress_answered", math.nan) / window,
        namespace_events=phase.get("namespace_events", math.nan),
        event_list_ms=1000 * phase.get("event_list_seconds", math.nan)
        / max(phase.get("event_lists", 0), 1),
        rss_steady_mib=phase["rss_steady"], rss_peak_mib=phase["rss_peak"],
        operator_requests_per_recovery=own / n, cluster_requests_per_recovery=cluster / n,
        # absent from runs before it was counted (the 300- and 600-job JSON of 2026-12-07)
        reconciles_per_recovery=phase.get("operator_reconciles", math.nan) / n,
        startup_seconds=phase["startup_seconds"], problems=problems,
    )  # fmt: skip


COLUMNS = (
    ("decision p50 s", "decision_p50"), ("decision p99 s", "decision_p99"),
    ("recovery p50 s", "recovery_p50"), ("recovery p99 s", "recovery_p99"),
    ("operator CPU-s / recovery", "cpu_per_recovery"),
    ("  less the quiet rate", "recovery_cpu"),
    ("operator CPU share, quiet", "idle_cpu_share"),
    ("progress reads answered / s", "progress_reads_per_second"),
    ("steady RSS MiB", "rss_steady_mib"), ("peak RSS MiB", "rss_peak_mib"),
    ("operator requests / recovery", "operator_requests_per_recovery"),
    ("operator reconciles / recovery", "reconciles_per_recovery"),
    ("cluster requests / recovery", "cluster_requests_per_recovery"),
    ("Events in the namespace", "namespace_events"),
    ("API server ms / Event LIST", "event_list_ms"),
    ("jobs up s", "startup_seconds"),
)  # fmt: skip


PROGRESS_WORDS = {
    "unanswered": "progress monitoring on as rendered, nothing answering (KWOK starts no "
    "sidecar: the operator's poll of every pod every 5 s finds nothing)",
    "off": "progress monitoring off (`spec.progress.enabled: false`: nothing polled)",
    "answered": "progress monitoring on, every pod's sidecar answered by `bench.sidecar_sim` "
    "(pods on loopback addresses), polled every 5 s",
}


def markdown(
    sizes: list[Size], workers: int, load: tuple[float, float], progress: str = "unanswered"
) -> str:
    first = sizes[0]
    lines = [
        "# The operator with many jobs at once (issue 49)",
        "",
        f"`python -m bench.operator_scale_jobs --sizes {','.join(str(s.jobs) for s in sizes)} "
        f"--workers {workers} --progress {progress}` on {os.cpu_count()} CPUs (load average "
        f"{load[0]:.1f} before, "
        f"{load[1]:.1f} after), every size on a fresh KWOK cluster; one GPU fault a second "
        "(an NCCL error in a rank's termination message), at most one a job. The operator "
        f"as its own process; Kueue and JobSet as pinned; {PROGRESS_WORDS[progress]}.",
        "",
        "| figure | " + " | ".join(f"{s.jobs} jobs ({s.pods} pods, {s.nodes} nodes, "
                                    f"{s.faults} faults)" for s in sizes) + " |",
        "|---|" + "---|" * len(sizes),
    ]  # fmt: skip
    for title, key in COLUMNS:
        cells = []
        for s in sizes:
            value, base = getattr(s, key), getattr(first, key)
            ratio = f" ({value / base:.2f}x)" if s is not first and base else ""
            cells.append(f"{value:.3g}{ratio}")
        goal = GOALS.get(title)
        lines.append(f"| {title}{f' (goal < {goal:g})' if goal else ''} | " + " | ".join(cells)
                     + " |")  # fmt: skip
    for s in sizes:
        if s.problems:
            lines.append(f"\n{s.jobs} jobs: problems: {'; '.join(s.problems)}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="10,100,1000")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--faults", type=int, default=60, help="one a second: a minute of faults")
    p.add_argument(
        "--profile",
        type=Path,
        default=None,
        metavar="DIR",
        help="sample the operator with py-spy over each size's fault window into DIR",
    )
    p.add_argument(
        "--progress",
        choices=PROGRESS_MODES,
        default="unanswered",
        help="the jobs' progress monitoring (bench.operator_scale --progress)",
    )
    p.add_argument("--markdown", type=Path,
                   default=REPO / "bench" / "results" / "operator-scale-jobs.md")  # fmt: skip
    a = p.parse_args(argv)
    try:
        sizes = [int(x) for x in a.sizes.split(",")]
    except ValueError:
        p.error(f"--sizes: expected numbers of jobs separated by commas, got {a.sizes!r}")
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="rtj-scale-jobs-") as tmp:
        found = [measure(n, a.workers, a.faults, Path(tmp), a.profile, a.progress) for n in sizes]
    text = markdown(found, a.workers, (load0, os.getloadavg()[0]), a.progress)
    a.markdown.parent.mkdir(parents=True, exist_ok=True)
    a.markdown.write_text(text)
    a.markdown.with_suffix(".json").write_text(
        json.dumps([vars(s) for s in found], indent=2) + "\n"
    )
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
