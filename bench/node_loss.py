"""Silent node loss, side by side (issue 12): how long a job of 8 workers (real training
through the pod runner) waits after one of its nodes goes silent, judged by the operator
from both signals (Lease overdue + the node's pods quiet), from the Lease alone (progress
monitoring off), and by the node lifecycle controller.

    python -m bench.node_loss [--workers 8] [--markdown bench/results/node-loss.md]

Each trial: the demo platform (local control plane, S3 server, pod runner, operator) with
one node more than workers; the example trainer under torchrun, one rank per pod, one pod
per node; once it trains past step 45, one worker's node is cut off with its processes
frozen (`PodRunner.cut_off_file` with ``freeze``: no Lease renewal, no status, SIGSTOP).
Measured from the freeze: the operator's NodeLost record, the node controller's
Ready=Unknown (this harness runs it with a 20 s `--node-monitor-grace-period` and 20 s
Leases; Kubernetes' defaults are read from the pinned source and projected), and the next
attempt's first training step.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from bench import soak_accounting as acc
from e2e.cluster.cluster import NODE_MONITOR_GRACE
from e2e.demo import drills, story
from e2e.operator_proc import REPO, wait_for

JOB = "node-loss"
K8S = "k8s.io/kubernetes v1.35.4"
DEFAULTS = {
    # pkg/controller/nodelifecycle/config/v1alpha1/defaults.go
    "node_monitor_grace": 50,
    # plugin/pkg/admission/defaulttolerationseconds/admission.go (unreachable, not-ready)
    "toleration": 300,
    # pkg/kubelet/apis/config/v1beta1/defaults.go: NodeLeaseDurationSeconds (renewed every 1/4)
    "lease": 40,
}


@dataclass
class Trial:
    signals: str
    to_record: float
    evidence: str
    to_unknown: float | None
    to_first_step: float | None


def _ready_unknown(kube: Any, node: str) -> bool:
    n = kube.core.read_node(node)
    return any(c.type == "Ready" and c.status == "Unknown" for c in n.status.conditions or [])


def _first_step(opts: story.Options, attempt: int) -> float | None:
    """The wall time of the attempt's first logged step (rank 0's log), if any."""
    root = opts.state / "runner" / "pods" / story.NAMESPACE
    for log in root.glob(f"{JOB}-a{attempt}-worker-0-0-*/volumes/train-logs/rank-0.jsonl"):
        steps = acc.parse_attempt(attempt, log.read_text().splitlines()).steps
        if steps:
            return min(steps.values())
    return None


def trial(workers: int, progress: bool, work: Path) -> Trial:
    shutil.rmtree(work, ignore_errors=True)
    with drills.running_platform(
        work, "rtj-nodeloss", workers + 1,
        "--progress-poll-seconds", "1",
        timeout=300,
    ) as platform:  # fmt: skip
        opts, kube, api = platform.opts, platform.kube, platform.api
        spec: dict[str, Any] = {"replicas": workers}
        spec["progress"] = {"hangTimeoutSeconds": 120} if progress else {"enabled": False}
        api.create_rtj(story.NAMESPACE, drills.job(JOB, **spec))

        def trained() -> bool:
            logs = list((opts.state / "runner" / "pods" / story.NAMESPACE).glob(
                f"{JOB}-a1-worker-0-0-*/volumes/train-logs/rank-0.jsonl"))  # fmt: skip
            return (
                bool(logs)
                and max(acc.parse_attempt(1, logs[0].read_text().splitlines()).steps, default=0)
                >= 45
            )

        wait_for("training past step 45", trained, 600, 0.5)
        victim = drills.rank_pod(drills.pods(api, JOB, 1), min(3, workers - 1))
        node = victim["spec"]["nodeName"]
        cut = opts.state / "runner" / "cut-off" / node
        cut.parent.mkdir(parents=True, exist_ok=True)
        cut.write_text("freeze")
        frozen, frozen_wall = time.monotonic(), time.time()

        def recorded() -> dict[str, Any] | None:
            attempts = drills.status(api, JOB).get("attempts") or []
            return attempts[0] if attempts and attempts[0].get("failureClass") else None

        record = wait_for("the NodeLost record", recorded, 120, 0.1)
        to_record = time.monotonic() - frozen
        to_unknown = first = None
        with contextlib.suppress(TimeoutError):
            wait_for("Ready=Unknown", lambda: _ready_unknown(kube, node), 60, 0.2)
            to_unknown = time.monotonic() - frozen
        with contextlib.suppress(TimeoutError):
            first = wait_for("attempt 2's first step", lambda: _first_step(opts, 2), 300, 0.5)
        cut.unlink()
        return Trial(
            "Lease overdue + pods quiet" if progress else "Lease alone (progress off)",
            to_record, " ".join(record.get("evidence") or [])[:300], to_unknown,
            first - frozen_wall if first is not None else None,
        )  # fmt: skip


def markdown(trials: list[Trial], workers: int, load: tuple[float, float]) -> str:
    grace = float(NODE_MONITOR_GRACE.rstrip("s"))
    d = DEFAULTS
    interval = d["lease"] / 4
    out = [
        "# Silent node loss, side by side (issue 12)",
        "",
        f"Generated by `python -m bench.node_loss --workers {workers}` on {platform.node()} "
        f"({os.cpu_count()} CPUs), {datetime.now():%Y-%m-%d %H:%M}; load average (1 min) "
        f"{load[0]:.1f} at the start, {load[1]:.1f} at the end.",
        "",
        f"{workers} workers of the example trainer (one rank per pod, one pod per node, gloo "
        "on CPU) through the operator on pod-runner nodes; one worker's node is cut off with "
        "its processes frozen (no Lease renewal, no status, SIGSTOP). The pod runner renews "
        "40 s Leases every 3 s; the harness's node lifecycle controller calls a node Unknown "
        f"{grace:.0f} s after its last renewal.",
        "",
        "| judged by | freeze -> NodeLost record | freeze -> node controller's Ready=Unknown "
        "(harness) | freeze -> next attempt's first step |",
        "|---|---|---|---|",
    ]
    for t in trials:
        unknown = f"{t.to_unknown:.1f} s" if t.to_unknown is not None else "not within 60 s"
        first = f"{t.to_first_step:.1f} s" if t.to_first_step is not None else "none"
        out.append(f"| {t.signals} | **{t.to_record:.1f} s** | {unknown} | {first} |")
    out += [
        "",
        f"With Kubernetes' defaults ({K8S}: kubelet Lease {d['lease']} s renewed every "
        f"{interval:.0f} s, `--node-monitor-grace-period` {d['node_monitor_grace']} s, "
        f"`DefaultTolerationSeconds` {d['toleration']} s), a job that waits for Kubernetes "
        f"sees the node Unknown {d['node_monitor_grace'] - interval:.0f}-"
        f"{d['node_monitor_grace']} s after the machine died, and its pods evicted "
        f"{d['node_monitor_grace'] + d['toleration'] - interval:.0f}-"
        f"{d['node_monitor_grace'] + d['toleration']} s after; with no kubelet to confirm, "
        "those pods then stay Terminating until someone deletes the Node or force-deletes them. "
        "The operator, on the same defaults: from both signals 1-11 s after the death (plus one "
        "poll), from the Lease alone 10-20 s; its quarantine taint at once and the pods "
        "force-deleted 10 s later. The next attempt's first step also pays the fence (10 s), "
        "the teardown and the start of every worker (a Python process importing torch, per "
        "pod, on this machine's cores).",
        "",
        "Evidence of each record (truncated):",
        "",
        *[f"- {t.signals}: {t.evidence}" for t in trials],
        "",
    ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--work", type=Path, default=Path("/tmp/rtj-node-loss"))
    p.add_argument("--markdown", type=Path, default=REPO / "bench" / "results" / "node-loss.md")
    args = p.parse_args(argv)
    before = os.getloadavg()[0]
    trials = [trial(args.workers, progress, args.work) for progress in (True, False)]
    text = markdown(trials, args.workers, (before, os.getloadavg()[0]))
    args.markdown.parent.mkdir(parents=True, exist_ok=True)
    args.markdown.write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
