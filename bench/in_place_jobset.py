"""The JobSet path of `bench.in_place`: the same trainer and fault without the operator, as a
user would run it (`bench.baseline_jobset`: a JobSet with `RestartJobSet` on any failed Job,
torchrun, plain `torch.save` every 40 steps to a shared volume, resume from the newest file).
Recovery is measured as for the operator's paths: from the fault to the first training step
completed after the resume, from rank 0's own log.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import baseline_jobset as bj
from bench import rank0_logs
from e2e.cluster import faults
from e2e.demo import drills, story
from e2e.operator_proc import wait_for

STEP_SLEEP = 0.05
"""The example job's own `--step-sleep` (examples/resilient-training-job.yaml)."""


@dataclass(frozen=True)
class JobSetTrial:
    recovery: float
    restored: int
    killed_at_step: int
    pods_created: int
    source: str
    restarts: int


def _records(opts: story.Options, name: str) -> list[dict[str, Any]]:
    """Rank 0's log records over every JobSet restart (each restart logs into its own
    directory), in time order."""
    root = opts.state / "runner" / "pods" / story.NAMESPACE
    pattern = f"{name}-{bj.RJOB}-0-0-*/volumes/train-logs/restart-*/rank-0.jsonl"
    return rank0_logs.records(root, pattern)


def _last_step(opts: story.Options, name: str) -> int:
    return rank0_logs.last_step(_records(opts, name))


def _resumed(opts: story.Options, name: str, after: float) -> tuple[int, float, str] | None:
    return rank0_logs.resumed(_records(opts, name), after)


def _pods(kube: Any, name: str) -> list[dict[str, Any]]:
    selector = f"{bj.JOBSET_LABEL}={name}"
    items = kube.core.list_namespaced_pod(story.NAMESPACE, label_selector=selector).items
    return [kube.api.sanitize_for_serialization(p) for p in items]


def trial(platform: drills.Platform, fault: str, n: int, workers: int, xid: int) -> JobSetTrial:
    """One JobSet trial; the GPU fault's node is cordoned after it, as the operator's trials'
    are (the JobSet itself never avoids it: it knows nothing of node health)."""
    kube, opts = platform.kube, platform.opts
    name, claim = f"{fault}-jobset-{n}", f"ckpt-{fault}-{n}"
    core: Any = kube.core  # plain dict bodies
    pv, pvc = bj.shared_volume(story.NAMESPACE, claim=claim)
    core.create_persistent_volume(pv)
    core.create_namespaced_persistent_volume_claim(story.NAMESPACE, pvc)
    trainer = ["--steps=100000", "--save-every=40", f"--step-sleep={STEP_SLEEP}"]
    body = bj.jobset(story.NAMESPACE, story.QUEUE, workers, trainer, name=name, claim=claim)
    kube.jobset_create(body, story.NAMESPACE)
    try:
        wait_for(f"{name} past step 90", lambda: _last_step(opts, name) >= 90, 600, 0.2)
        before = {p["metadata"]["uid"] for p in _pods(kube, name)}
        victim = bj.current_pod(_pods(kube, name), 0, 1)
        assert victim is not None, f"{name}: no running rank 1"
        node = victim["spec"]["nodeName"]
        pid = drills.trainer_pid(opts, victim)
        step = _last_step(opts, name)
        if fault == "gpu":
            faults.gpu_xid(kube, node, xid)
        hit = time.time()
        os.kill(pid, signal.SIGKILL)
        restored, first, source = wait_for(f"{name}'s first step after the resume",
                                           lambda: _resumed(opts, name, hit), 240, 0.1)  # fmt: skip
        after = {p["metadata"]["uid"] for p in _pods(kube, name)}
        restarts = int((kube.jobset_get(name, story.NAMESPACE).get("status") or {})
                       .get("restarts") or 0)  # fmt: skip
        if fault == "gpu":
            core.patch_node(node, {"spec": {"unschedulable": True}})
        label = f"plain file ({Path(source).name})" if source else "plain file"
        return JobSetTrial(first - hit, restored, step, len(after - before), label, restarts)
    finally:
        _delete(kube, name, claim)


def _delete(kube: Any, name: str, claim: str) -> None:
    kube.custom.delete_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", story.NAMESPACE, "jobsets", name,
        body={"propagationPolicy": "Foreground"},
    )  # fmt: skip
    wait_for(f"{name}'s pods gone", lambda: not _pods(kube, name), 120, 0.5)
    kube.core.delete_namespaced_persistent_volume_claim(claim, story.NAMESPACE)
    kube.core.delete_persistent_volume(f"{story.NAMESPACE}-{claim}")
