"""Restart in place (spec.recovery.inPlace, issue 15). Pure.

Rendering: the trainer container's command runs under ``rtj-shim supervise`` and the
progress sidecar takes the operator's restart orders for it (``POST /control``, checked with
the job's control key) through a shared memory-backed control volume; the key is in the
sidecar's environment only.

Deciding: a failure that implicates no node (a rank's process dying, a hang) is restarted
inside the attempt's pods when every pod runs, answers the progress poll and has a
supervisor. A failure that implicates nodes (a GPU fault, a lost node) or takes pods away (an
eviction: a node drain, a NoExecute taint, the Eviction API) replaces the pods concerned and
restarts the others in place. Anything else (a pod deleted by hand, a user error, a Kueue
preemption of the whole workload) is the whole-world path as before.

The fast checkpoint tier that an in-place restart resumes from: `policy.fast_tier`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from rtj_operator.api import keys
from rtj_operator.api.reasons import FailureCategory, FailureClass, InPlaceStage
from rtj_operator.api.resource import ResilientTrainingJob
from rtj_operator.policy.classify import Classification
from rtj_shim.wire.control import Order
from rtj_shim.wire.supervisor_report import SupervisorReport, SupervisorState

Obj = dict[str, Any]
CONTROL_VOLUME_SIZE = "1Mi"
ORDER_DEADLINE_MARGIN = 30
"""The supervisor waits this much longer than the operator's in-place deadline for an order
after its command fails, then exits with the command's code (the pod fails: the whole-world
path takes over if the operator never ordered anything)."""
STOP_GRACE_SECONDS = 1
"""SIGTERM to SIGKILL when a pod's trainers are stopped for an in-place restart: a world
that lost a rank or hung cannot make a consistent emergency save (as HANG_TEARDOWN_GRACE)."""
IN_PLACE_CLASSES = frozenset(
    {FailureClass.UNKNOWN, FailureClass.NETWORK_FAULT, FailureClass.HANG,
     FailureClass.CHECKPOINT_CORRUPT}
)  # fmt: skip
"""What a restart inside the same pods can cure: a process that died or hung, a collective
that broke, a pinned step the restarted trainers refused (marked bad, not pinned again). A
GPU or node fault needs another node (replace); a user error or OOM would only repeat."""


def supervise(spec: Obj, rtj: ResilientTrainingJob, trainer_name: str) -> bool:
    """Wrap the trainer's command in the supervisor and let the sidecar take orders (the
    rendered pod spec, changed in place; the sidecar already holds the job's key and uid,
    `render.progress_sidecar`). False (nothing changed) without a command or a sidecar: the
    whole-world path is then the only one."""
    trainer = next((c for c in spec["containers"] if c.get("name") == trainer_name), None)
    sidecar = next(
        (c for c in spec.get("initContainers", []) if c.get("name") == keys.PROGRESS_SIDECAR),
        None,
    )
    if trainer is None or sidecar is None or not trainer.get("command"):
        return False
    deadline = rtj.spec.recovery.in_place_deadline_seconds + ORDER_DEADLINE_MARGIN
    grace = rtj.spec.checkpoint.emergency_save_seconds
    trainer["command"] = [
        "rtj-shim", "supervise", "--control-dir", keys.CONTROL_DIR, "--grace", str(grace),
        "--stop-grace", str(STOP_GRACE_SECONDS), "--order-deadline", str(deadline),
        *(["--preload", ",".join(preload)] if (preload := rtj.spec.recovery.in_place_preload)
          else []),
        "--", *trainer["command"],
    ]  # fmt: skip
    mount = {"name": keys.CONTROL_VOLUME, "mountPath": keys.CONTROL_DIR}
    failures = f"metadata.annotations['{keys.JOB_INDEX_FAILURE_COUNT}']"
    trainer["env"] = [
        *trainer.get("env", []),
        {"name": keys.ENV_CONTROL_DIR, "value": keys.CONTROL_DIR},
        {"name": keys.ENV_INDEX_FAILURES, "valueFrom": {"fieldRef": {"fieldPath": failures}}},
    ]
    trainer["volumeMounts"] = [*trainer.get("volumeMounts", []), dict(mount)]
    sidecar["command"] = [*sidecar["command"], "--control-dir", keys.CONTROL_DIR]
    sidecar["volumeMounts"] = [*sidecar.get("volumeMounts", []), dict(mount)]
    spec["volumes"] = [
        *spec.get("volumes", []),
        {"name": keys.CONTROL_VOLUME,
         "emptyDir": {"medium": "Memory", "sizeLimit": CONTROL_VOLUME_SIZE}},
    ]  # fmt: skip
    return True


def supervised(pod: Mapping[str, Any]) -> bool:
    """Whether the pod was rendered with the supervisor (its own annotation says so, not
    the job's spec, which may have changed since)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return annotations.get(keys.SUPERVISED_ANNOTATION) == "true"


REPLACE_CLASSES = frozenset({FailureClass.GPU_FAULT, FailureClass.NODE_LOST})
"""What replacing the pods of the implicated nodes cures (the others restart in place)."""
REPEAT_CLASSES = frozenset({FailureClass.UNKNOWN, FailureClass.NETWORK_FAULT, FailureClass.HANG})
"""A process that died or hung, a collective that broke: the failures that a restart in the
same pods cures, unless the pod's node is what breaks them (`repeat_offender`)."""
REPEAT_WINDOW = timedelta(minutes=5)
"""A pod whose trainer fails first again this soon after its last in-place restart began
is re-created instead of restarted in its pod."""
EVICTION_CLASSES = frozenset({FailureClass.EVICTED})
"""What replacing the evicted pods cures (the others restart in place): the platform took
those pods, not the world's health. No node is quarantined: a drain cordons its node itself,
and the replacement avoids it (a warm spare on another node, or the Job's new pod)."""


@dataclass(frozen=True)
class InPlaceChoice:
    """Whether a failure is restarted in place (`refused` None), and which pods are replaced."""

    refused: str | None
    replace: tuple[str, ...] = ()
    quiet: tuple[str, ...] = ()  # pods whose supervisor has not reported (a lost node's?)
    repeated: str | None = None  # re-created: it failed first again (`repeat_offender`)


def repeat_offender(rtj: ResilientTrainingJob, found: Classification) -> str | None:
    """The pod to re-create rather than restart in place: its trainer failed first in the
    attempt's last in-place restart and fails first again, of a class a restart in the same
    pod should cure, less than `REPEAT_WINDOW` after that restart began and before the
    restarted world completed a step (the recovery ledger's `firstStepAt`). A node that breaks
    every trainer put on it (a GPU that fails without an XID, a flapping NIC) looks so; a
    new pod runs the platform's preflight, which judges the node (a failed check quarantines
    it). No node is quarantined on this rule: it rests on the tenant's exits, and only
    re-creates the tenant's own pod, paid from its own restart budget."""
    record = rtj.status.current
    last = record.in_place_restarts[-1] if record and record.in_place_restarts else None
    first = found.first_failed
    if last is None or first is None or found.failure_class not in REPEAT_CLASSES:
        return None
    before = last.first_failed
    if before is None or before.pod != first.pod or last.failure_class not in REPEAT_CLASSES:
        return None
    began = last.started_at or last.detected_at
    failed = found.failed_at
    if failed is None or failed - began > REPEAT_WINDOW:
        return None
    ledger = next((r for r in rtj.status.recoveries if r.attempt == rtj.status.attempt
                   and r.generation == last.generation), None)  # fmt: skip
    if ledger is not None and ledger.first_step_at is not None and ledger.first_step_at < failed:
        return None  # the restarted world trained: a new fault, not the same one again
    return first.pod


def choose(
    rtj: ResilientTrainingJob,
    found: Classification,
    pods: Sequence[Mapping[str, Any]],
    reports: Mapping[str, SupervisorReport],
    quarantined: Collection[str] = (),
    gone: Sequence[Mapping[str, Any]] = (),
) -> InPlaceChoice:
    """A failure that implicates no node restarts every pod in place; one that implicates
    nodes (a GPU fault, a lost node), once they are quarantined, replaces the pods on them,
    and an eviction replaces the evicted pods (`gone`: the world's pods already deleted), at
    most spec.recovery.inPlaceMaxReplacedPods; the others restart in place."""
    recovery = rtj.spec.recovery
    if not recovery.in_place:
        return InPlaceChoice("spec.recovery.inPlace is off")
    nodes = set(found.nodes_to_quarantine)
    evicted = found.failure_class in EVICTION_CLASSES
    curable = IN_PLACE_CLASSES | EVICTION_CLASSES | (REPLACE_CLASSES if nodes else frozenset())
    if found.failure_class not in curable or found.category is FailureCategory.USER:
        return InPlaceChoice(
            f"{found.failure_class.value} needs more than a restart in the same pods"
        )
    world = {**{_name(p): p for p in gone}, **{_name(p): p for p in pods}}
    offender = repeat_offender(rtj, found) if not nodes and not evicted else None
    repeated = offender if offender in world else None  # a pod of this world, or no one
    if repeated is not None:
        replace: tuple[str, ...] = (repeated,)
        what = f"pod {repeated} failed first again"
    elif evicted:
        taken = sorted(n for n, p in world.items() if n not in _names(pods) or disrupted(p))
        if not taken:
            return InPlaceChoice("no evicted pod of the world is known yet")
        replace = tuple(taken)
        what = f"it evicts {len(replace)} pods"
    else:
        replace = tuple(sorted(_name(p) for p in pods if node_of(p) in nodes))
        what = f"it implicates nodes {', '.join(sorted(nodes))} with {len(replace)} pods on them"
    if nodes or evicted or repeated:
        limit = recovery.in_place_max_replaced_pods
        if len(replace) > limit:
            return InPlaceChoice(f"{what}; spec.recovery.inPlaceMaxReplacedPods is {limit}")
        if waiting := sorted(nodes - set(quarantined)):
            return InPlaceChoice(f"nodes {', '.join(waiting)} are not quarantined yet")
        for name in replace:
            if not replaceable(world[name]):
                return InPlaceChoice(f"pod {name} cannot be replaced by its Job")
    there = len(world) if evicted else len(pods)  # an evicted pod may be gone already
    expected = rtj.status.world_size or rtj.spec.replicas  # spec.elastic may have resized it
    if there != expected:
        return InPlaceChoice(f"{there} of {expected} pods are there")
    quiet = []
    for pod in pods:
        name = _name(pod)
        if name in replace:
            continue
        if (pod.get("status") or {}).get("phase") != "Running" or (pod.get("metadata") or {}).get(
            "deletionTimestamp"
        ):
            return InPlaceChoice(f"pod {name} is not running")
        if not supervised(pod):
            return InPlaceChoice(f"pod {name} has no supervisor (created before inPlace was set)")
        if name not in reports:
            quiet.append(name)
    if quiet:
        return InPlaceChoice(f"pod {quiet[0]}'s supervisor has not reported", quiet=tuple(quiet))
    return InPlaceChoice(None, replace, repeated=repeated)


def disrupted(pod: Mapping[str, Any]) -> bool:
    """A pod the platform is taking away: marked for it (the DisruptionTarget condition,
    which the Eviction API and the taint manager add before they delete the pod), being
    deleted, or failed by its kubelet's eviction (`status.reason: Evicted`)."""
    status = pod.get("status") or {}
    if (pod.get("metadata") or {}).get("deletionTimestamp") or status.get("reason") == "Evicted":
        return True
    return any(
        c.get("type") == "DisruptionTarget" and c.get("status") == "True"
        for c in status.get("conditions") or ()
    )


def _names(pods: Sequence[Mapping[str, Any]]) -> set[str]:
    return {_name(p) for p in pods}


def replaceable(pod: Mapping[str, Any]) -> bool:
    """Whether the pod's Job creates it again when it is deleted (backoffLimitPerIndex: the
    Job controller annotates its pods with the index's failure count)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return supervised(pod) and keys.JOB_INDEX_FAILURE_COUNT in annotations


def _name(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name", ""))


def node_of(pod: Mapping[str, Any]) -> str | None:
    """The node a pod is bound to (None: not scheduled yet)."""
    node = (pod.get("spec") or {}).get("nodeName")
    return node if isinstance(node, str) else None


def order(
    rtj: ResilientTrainingJob,
    index: int | None = None,
    *,
    rank: bool = False,
    master_addr: str | None = None,
    world_size: int | None = None,
) -> Order | None:
    """The order the job's pod serving rank `index` is to carry out now (None: no in-place
    restart). Every pod gets the same one, except that a run order with a fast step names,
    for a pod that does not hold the step itself, the peer replica it copies it from
    (`status.inPlace.fastSources`); with `rank`, the rank it takes (a warm spare serving a
    replaced pod's); with `master_addr`, the rendezvous host (rank 0 moved to a spare);
    with `world_size`, the world a spec.elastic resize made."""
    state = rtj.status.in_place
    if state is None:
        return None
    if state.phase == InPlaceStage.STOPPING:
        return Order(rtj.metadata.uid, state.generation, "stop",
                     save_seconds=save_grace(rtj, state.generation))  # fmt: skip
    source = state.fast_sources.get(str(index)) if index is not None else None
    return Order(rtj.metadata.uid, state.generation, "run", rtj.status.attempt, state.step,
                 state.fast_step, source if state.fast_step is not None else None,
                 index if rank else None, master_addr,
                 state.fast_lineage if state.fast_step is not None else None,
                 world_size, fast_every_steps=state.fast_every_steps)  # fmt: skip


def save_grace(rtj: ResilientTrainingJob, generation: int) -> int | None:
    """The stop's grace for the trainers to save at their next boundary: for a generation no
    failure began (a grow-back) or an eviction began (the evicted trainer's SIGTERM started
    the world's emergency save, which every rank is alive to join), the emergency save's
    deadline, at most half the in-place deadline; None for a failure's (a world that lost a
    rank or hung cannot save consistently: the supervisor's short grace)."""
    record = rtj.status.current
    entry = next((e for e in reversed(record.in_place_restarts) if e.generation == generation),
                 None) if record is not None else None  # fmt: skip
    seconds = min(rtj.spec.checkpoint.emergency_save_seconds,
                  rtj.spec.recovery.in_place_deadline_seconds // 2)  # fmt: skip
    healthy = entry is not None and entry.failure_class in (None, *EVICTION_CLASSES)
    if not healthy or seconds < 1:
        return None
    return seconds


def reported(reports: Mapping[str, SupervisorReport], pods: Sequence[str],
             generation: int, states: frozenset[SupervisorState]) -> list[str]:  # fmt: skip
    """The pods whose supervisor has not yet reported one of `states` for `generation`."""
    return [p for p in pods if (r := reports.get(p)) is None or not r.shows(generation, states)]
