"""Elastic N-k against waiting when no node can be had (issue 45): the scarce-capacity soak.

The platform has `--workers` + 1 nodes, the extra one cordoned: the cluster is full. The job
trains ``examples/elastic_train.py`` on `--workers` pods (restart in place with the
operator's defaults, a fast tier every 10 steps, durable saves every 50), with
``--sample-sleep``: a step takes longer the more samples a rank trains, so a shrunk world
trains at (N-1)/N of the full rate, as compute-bound GPUs would (the global batch is kept by
``ElasticBatchSampler``). Once rank 0 has trained `--lose-at` steps, rank 1's node powers off
(its processes die, its Lease goes stale); the cordoned node is freed `--scarce-seconds`
after the loss. Runs, one after the other on fresh platforms:

- ``no fault``: the same job, nothing lost (how long the training takes undisturbed);
- ``waiting``: no ``spec.elastic``: the world waits for its replacement (today's path);
- ``elastic``: ``spec.elastic: {minReplicas: workers - 1}``, ``waitForReplacementSeconds``
  the operator's default (30 s): the survivors shrink, train on, and grow back.

Reported per run: the wall time from the job's creation to `Succeeded`, goodput as the
no-fault run's wall time over the run's (the time-to-train ratio: the same steps and
samples), the steps trained at each world size, the seconds no step was trained (the
longest gap), the steps trained again, every epoch's samples consumed exactly once, and the
loss's largest distance from a no-fault run of `--workers` ranks against the distance a
no-fault run of one rank fewer keeps from it.

    python -m bench.elastic_scarce [--workers 4] [--steps 800] [--scarce-seconds 120]
        [--markdown bench/results/elastic-scarce.md]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from e2e.demo import drills, elastic_logs, story
from e2e.operator_proc import REPO, wait_for

SAMPLES, GLOBAL_BATCH, MICRO = 96, 12, 4  # 12 = 4 x 3 = 3 x 4: any world of 3 or 4 ranks
SAVE_EVERY, FAST_EVERY = 50, 10
VICTIM_RANK = 1
RUNS = ("no fault", "waiting", "elastic")
RECORDED = ("failureClass", "worldSize", "resumedFromStep", "resumedFromFastStep",
            "fastTierFallback")  # fmt: skip
"""What the report shows of each in-place restart the job's status records."""


@dataclass(frozen=True)
class Settings:
    workers: int = 4
    steps: int = 800
    lose_at: int = 150
    scarce_seconds: float = 120.0
    sample_sleep: float = 0.04

    def trainer_args(self) -> list[str]:
        return [f"--steps={self.steps}", f"--samples={SAMPLES}",
                f"--global-batch={GLOBAL_BATCH}", f"--micro-batch={MICRO}",
                f"--save-every={SAVE_EVERY}", f"--sample-sleep={self.sample_sleep}"]  # fmt: skip


@dataclass
class Run:
    name: str
    wall_seconds: float
    steps_by_world: dict[int, int]
    longest_gap_seconds: float
    trained_again: int
    attempts: int
    epochs_not_once: list[str]
    max_loss_drift: float
    lost_at: float | None
    in_place_restarts: list[dict[str, Any]]


def job_body(name: str, s: Settings, elastic: bool) -> dict[str, Any]:
    body = drills.job(name, recovery={"inPlace": True}, replicas=s.workers)
    if elastic:
        body["spec"]["elastic"] = {"minReplicas": s.workers - 1}
    body["spec"]["checkpoint"]["fastTier"] = {"everySteps": FAST_EVERY}
    container = body["spec"]["template"]["spec"]["containers"][0]
    container["command"] = ["python", elastic_logs.EXAMPLE, "--root=$(RTJ_CHECKPOINT_URI)",
                            "--log-dir=/var/log/train", *s.trainer_args()]  # fmt: skip
    return body


def run(work: Path, run_name: str, s: Settings, clean: dict[int, float]) -> Run:
    """One run on a fresh platform (`RUNS`)."""
    name = "scarce-" + run_name.replace(" ", "-")
    work.mkdir(parents=True, exist_ok=True)
    with drills.controlling_platform(work, "rtj-scarce", s.workers + 1) as platform:
        opts, api, kube = platform.opts, platform.api, platform.kube
        nodes = sorted(n.metadata.name for n in kube.core.list_node().items)
        free = nodes[-1]
        kube.core.patch_node(free, {"spec": {"unschedulable": True}})  # the cluster is full
        created = time.time()
        api.create_rtj(story.NAMESPACE, job_body(name, s, elastic=run_name == "elastic"))
        before = drills.scheduled(api, name, s.workers)
        lost_at = None
        if run_name != "no fault":
            log0 = drills.rank_log(opts, drills.rank_pod(before, 0), 0)
            wait_for(f"{s.lose_at} steps", lambda: drills.trained(log0) >= s.lose_at, 600, 0.1)
            victim = drills.rank_pod(before, VICTIM_RANK)
            off = opts.state / "runner" / "power-off" / victim["spec"]["nodeName"]
            off.parent.mkdir(parents=True, exist_ok=True)
            off.touch()  # the runner's next heartbeat powers the node off
            lost_at = time.time()
            while time.time() < lost_at + s.scarce_seconds:
                time.sleep(0.5)
            kube.core.patch_node(free, {"spec": {"unschedulable": False}})
        wait_for(f"{name} to finish", lambda: drills.status(api, name).get("phase")
                 in ("Succeeded", "Failed"), 1800, 1.0)  # fmt: skip
        status = drills.status(api, name)
        finished = time.time()
        root = opts.state / "runner" / "pods" / story.NAMESPACE
        dirs = sorted(root.glob(f"{name}-a*"))
        records = elastic_logs.newest_records(dirs)
        trained = list(elastic_logs.step_records(dirs))
    if status.get("phase") != "Succeeded":
        raise RuntimeError(f"{name}: {status.get('phase')}: {status.get('conditions')}")
    return judge(run_name, s, records, trained, status, finished - created, lost_at, clean)


def judge(
    run_name: str,
    s: Settings,
    records: dict[int, list[dict[str, Any]]],
    trained: list[dict[str, Any]],
    status: dict[str, Any],
    wall: float,
    lost_at: float | None,
    clean: dict[int, float],
) -> Run:
    """The run's figures from its ranks' records (`elastic_logs.newest_records`)."""
    if sorted(records) != list(range(1, s.steps + 1)):
        raise RuntimeError(f"{run_name}: the steps trained are not 1..{s.steps}")
    worlds = Counter(records[step][0]["world"] for step in records)
    times = [max(r["time"] for r in records[step]) for step in sorted(records)]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    rank0 = [r for r in trained if r["rank"] == 0]
    attempts = status.get("attempts") or []
    return Run(
        name=run_name,
        wall_seconds=round(wall, 1),
        steps_by_world=dict(sorted(worlds.items())),
        longest_gap_seconds=round(max(gaps, default=0.0), 1),
        trained_again=len(rank0) - len({r["step"] for r in rank0}),
        attempts=len(attempts),
        epochs_not_once=elastic_logs.epochs_exactly_once(records, SAMPLES, GLOBAL_BATCH),
        max_loss_drift=max(abs(records[step][0]["loss"] - clean[step]) for step in clean),
        lost_at=lost_at,
        in_place_restarts=[
            {k: e.get(k) for k in RECORDED}
            for a in attempts
            for e in a.get("inPlaceRestarts") or []
        ],
    )


def markdown(runs: list[Run], s: Settings, tolerance: float, load: tuple[float, float]) -> str:
    base = next(r for r in runs if r.name == "no fault").wall_seconds
    lines = [
        "# Elastic N-k against waiting, with no free node (issue 45)",
        "",
        f"`python -m bench.elastic_scarce --workers {s.workers} --steps {s.steps} "
        f"--lose-at {s.lose_at} --scarce-seconds {s.scarce_seconds:g} "
        f"--sample-sleep {s.sample_sleep:g}` on {os.cpu_count()} CPUs (load average "
        f"{load[0]:.1f} before, {load[1]:.1f} after): {s.workers} pods of "
        f"`examples/elastic_train.py` (gloo, a global batch of {GLOBAL_BATCH} samples, "
        f"{s.sample_sleep * 1000:g} ms per sample a rank trains), fast tier every {FAST_EVERY} "
        f"steps, durable every {SAVE_EVERY}; {s.workers + 1} nodes, one cordoned; rank "
        f"{VICTIM_RANK}'s node powered off at step {s.lose_at}, the cordoned node freed "
        f"{s.scarce_seconds:g} s later. Goodput: the no-fault run's wall time over the run's.",
        "",
        "| run | wall s | goodput | steps by world size | longest stall s | steps again "
        "| attempts | epochs exactly once | loss drift |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        worlds = ", ".join(f"{w}: {n}" for w, n in r.steps_by_world.items())
        lines.append(
            f"| {r.name} | {r.wall_seconds:.1f} | {base / r.wall_seconds * 100:.1f}% | {worlds} "
            f"| {r.longest_gap_seconds:.1f} | {r.trained_again} | {r.attempts} "
            f"| {'yes' if not r.epochs_not_once else ', '.join(r.epochs_not_once)} "
            f"| {r.max_loss_drift:.2g} |"
        )
    lines += [
        "",
        f"Loss drift: the largest distance of a run's loss from a no-fault run of {s.workers} "
        f"ranks; a no-fault run of {s.workers - 1} ranks keeps {tolerance:.2g} from it.",
        "",
        "The recoveries, as the job's status records them:",
        "",
    ]
    for r in runs:
        for e in r.in_place_restarts:
            lines.append(f"- {r.name}: {json.dumps(e)}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=Settings.workers)
    p.add_argument("--steps", type=int, default=Settings.steps)
    p.add_argument("--lose-at", type=int, default=Settings.lose_at)
    p.add_argument("--scarce-seconds", type=float, default=Settings.scarce_seconds)
    p.add_argument("--sample-sleep", type=float, default=Settings.sample_sleep)
    p.add_argument("--runs", default=",".join(RUNS), help="which runs, in order")
    p.add_argument("--markdown", type=Path, default=REPO / "bench/results/elastic-scarce.md")
    a = p.parse_args(argv)
    if a.workers < 2 or GLOBAL_BATCH % a.workers or GLOBAL_BATCH % (a.workers - 1):
        p.error(f"--workers: expected 2, 3 or 4 (a global batch of {GLOBAL_BATCH} split "
                "evenly over the full and the shrunk world)")  # fmt: skip
    s = Settings(a.workers, a.steps, a.lose_at, a.scarce_seconds, a.sample_sleep)
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="rtj-scarce-") as tmp:
        work = Path(tmp)
        clean = elastic_logs.no_fault_losses(work, s.workers, s.trainer_args())
        shrunk = elastic_logs.no_fault_losses(work, s.workers - 1, s.trainer_args())
        tolerance = max(abs(clean[k] - shrunk[k]) for k in clean)
        runs = []
        for name in a.runs.split(","):
            runs.append(run(work / name.replace(" ", "-"), name, s, clean))
            sys.stdout.write(json.dumps(asdict(runs[-1])) + "\n")
    text = markdown(runs, s, tolerance, (load0, os.getloadavg()[0]))
    a.markdown.parent.mkdir(parents=True, exist_ok=True)
    a.markdown.write_text(text)
    a.markdown.with_suffix(".json").write_text(json.dumps(
        {"settings": asdict(s), "tolerance": tolerance, "runs": [asdict(r) for r in runs]},
        indent=2) + "\n")  # fmt: skip
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
