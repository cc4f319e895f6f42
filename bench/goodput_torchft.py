"""The goodput soak's TorchFT baseline (c): `python -m bench.goodput_baseline --launcher
torchft` (`bench.baseline_torchft` has the JobSet and the judge).

The same seeded faults as (b), aimed at a replica group's current pod (the schedule's rank
is the group): a killed, evicted or XID-hit group's Job starts a new pod, which rejoins the
quorum and heals live from a peer; a lost node's group waits for Kubernetes to evict its pod;
a hung (SIGSTOPped) group is dropped from the quorum after the lighthouse's heartbeat
timeout and never comes back (nothing restarts it); corrupt_newest kills the group, then
flips a byte of the newest durable file; a Kueue preemption stops every group, and the
re-admitted ones resume from the newest file.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from bench import baseline_jobset as bj
from bench import baseline_torchft as btf
from bench import goodput
from bench.goodput_baseline import Flavour, Injector
from e2e.demo import story


class TorchftInjector(Injector):
    """The soak's injector, aimed at a replica group's current pod."""

    def _world_pod(self, rank: int) -> dict[str, Any] | None:
        pods = btf.group_pods(
            self.api.list_pods(story.NAMESPACE, f"{bj.JOBSET_LABEL}={bj.NAME}"), rank
        )
        alive = [p for p in pods if self._trainer(p) is not None]
        return next(iter(alive or pods), None)

    def _trains(self, pod: dict[str, Any], rank: int) -> bool:
        log = story._pod_dir(self.opts, pod) / "volumes" / "train-logs" / f"group-{rank}.jsonl"
        with contextlib.suppress(OSError):
            return '"loss"' in log.read_text()
        return False


def group_logs(platform: story.Options) -> list[tuple[int, list[str]]]:
    """`(group, lines)` of every group pod's log, the oldest pod first."""
    root = platform.state / "runner" / "pods" / story.NAMESPACE
    out = []
    for f in root.glob(f"{bj.NAME}-{btf.GROUP}-*/volumes/train-logs/group-*.jsonl"):
        lines = f.read_text().splitlines()
        if lines:
            out.append((int(f.stem.split("-")[1]), lines))
    return sorted(out, key=lambda run: run[1][0])


def _last_step(runs: list[tuple[int, list[str]]]) -> tuple[float, int] | None:
    return max(((c.time, c.step) for c in btf.commits(runs)), default=None)


def _judge(
    created: float, stopped: float, completed: str | None, runs: list[tuple[int, list[str]]],
    injected: list[dict[str, Any]], stall: str | None, opts: goodput.SoakOptions,
) -> dict[str, Any]:  # fmt: skip
    facts = btf.judge(created, stopped, completed, runs, injected, stall, opts.steps, goodput.RANKS)
    facts["ddp_hook_crashes"] = ddp_hook_crashes(opts.work / "state")
    if facts["ddp_hook_crashes"]:
        facts["findings"].append(
            f"{len(facts['ddp_hook_crashes'])} group pods failed in torchft's DDP comm hook "
            "(`assert fut._fut`, torchft/ddp.py) when a peer failed during the all-reduce: "
            "a survivor restarted too"
        )
    return facts


DDP_HOOK_ASSERT = "assert fut._fut"
"""torchft 0.2.0's DDP comm hook (ddp.py `_comm_hook`) when the manager's all-reduce failed:
its future was never set (docs/baselines.md)."""


def ddp_hook_crashes(state: Path) -> list[str]:
    """The group pods whose trainer failed in torchft's DDP comm hook."""
    root = state / "runner" / "pods" / story.NAMESPACE
    out = []
    for log in sorted(root.glob(f"{bj.NAME}-{btf.GROUP}-*/containers/trainer/log")):
        with contextlib.suppress(OSError):
            if DDP_HOOK_ASSERT in log.read_text(errors="replace"):
                out.append(log.parents[2].name.rsplit("-", 1)[0])
    return out


def _trained_out(platform: story.Options) -> bool:
    """A group logged the end (its log's last bytes): the model is trained (a hung group
    never ends its Job)."""
    root = platform.state / "runner" / "pods" / story.NAMESPACE
    for log in root.glob(f"{bj.NAME}-{btf.GROUP}-*/volumes/train-logs/group-*.jsonl"):
        with contextlib.suppress(OSError), log.open("rb") as f:
            f.seek(max(0, f.seek(0, 2) - 256))
            if b'"done"' in f.read():
                return True
    return False


FLAVOUR = Flavour(
    lambda args: btf.jobset(story.NAMESPACE, story.QUEUE, goodput.RANKS, args),
    TorchftInjector, group_logs, _last_step, _judge, _trained_out,
)  # fmt: skip
