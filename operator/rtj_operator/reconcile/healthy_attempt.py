"""An attempt that has not failed: admission by Kueue, all workers running, success."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from rtj_operator.api.reasons import ConditionType, Phase, Reason
from rtj_operator.policy import ledger
from rtj_operator.policy.observed import parse_time
from rtj_operator.reconcile import ledger as recovery_ledger
from rtj_operator.reconcile.actions import DeleteJobSet
from rtj_operator.reconcile.builder import PlanBuilder, condition_true
from rtj_operator.reconcile.world import JobSetView, Json, get_in, pod_name

STALL_AFTER = timedelta(seconds=45)
"""How long after admission an attempt may take to get all its workers running before it
is reported Stalled (scheduling, image pulls and init containers fit well within it)."""
QUEUE_RECHECK = timedelta(seconds=60)
"""While a JobSet waits for admission, the job's LocalQueue is looked up this often."""


def follow_admission(b: PlanBuilder, js: JobSetView, pods: Sequence[Json]) -> None:
    """Admission by Kueue (or none: a JobSet without a queue label is created running and
    admitted as soon as it is seen), the workers getting to Running (or stalling on the
    way)."""
    n = b.status.attempt
    if js.suspended:
        _awaiting_admission(b, js)
        return
    if b.status.phase is Phase.PENDING:
        b.update(phase=Phase.ADMITTED)
        b.condition(
            ConditionType.ADMITTED,
            True,
            Reason.ATTEMPT_ADMITTED,
            f"Kueue admitted JobSet {js.name}"
            if js.queue_name
            else f"JobSet {js.name} runs without Kueue (spec.queueName unset)",
        )
        b.event(False, Reason.ATTEMPT_ADMITTED, f"attempt {n}: JobSet {js.name} admitted")
    running = sum(
        1
        for p in pods
        if get_in(p, "status", "phase") == "Running"
        and get_in(p, "metadata", "deletionTimestamp") is None
    )
    expected = b.status.world_size or b.rtj.spec.replicas  # spec.elastic may have resized it
    if running >= expected and b.status.phase is not Phase.RUNNING:
        b.update(phase=Phase.RUNNING)
        message = f"attempt {n}: all {running} workers of JobSet {js.name} are running"
        b.condition(ConditionType.RUNNING, True, Reason.ATTEMPT_RUNNING, message)
        b.event(False, Reason.ATTEMPT_RUNNING, message)
        passed = ledger.preflight_passed_at(pods)  # a new world's: what its ledger says
        recovery_ledger.note(b, **({"preflight_at": passed} if passed else {}))
        recovery_ledger.note(b, replacement_ready_at=b.now, started_at=b.now)
    if running >= expected:
        if condition_true(b.status, ConditionType.STALLED):
            b.condition(ConditionType.STALLED, False, Reason.PROGRESSING, "all workers running")
        return
    _watch_for_stall(b, js, pods)


def _unschedulable(pod: Json) -> str | None:
    """The scheduler's message if the pod is Pending with PodScheduled=False Unschedulable."""
    if get_in(pod, "status", "phase") not in (None, "Pending"):
        return None
    for c in get_in(pod, "status", "conditions") or []:
        if (c.get("type"), c.get("status"), c.get("reason")) == (
            "PodScheduled",
            "False",
            "Unschedulable",
        ):
            return str(c.get("message") or "Unschedulable")
    return None


def stall_of(b: PlanBuilder, pods: Sequence[Json]) -> tuple[Reason, str] | None:
    """Why an admitted attempt's workers are not all running (None: no sign of a stall)."""
    replicas = b.status.world_size or b.rtj.spec.replicas
    stuck = [(pod_name(p), why) for p in pods if (why := _unschedulable(p)) is not None]
    if stuck:
        name, why = stuck[0]
        return Reason.PODS_UNSCHEDULABLE, (
            f"{len(stuck)} of {replicas} workers cannot be scheduled although Kueue admitted "
            f"the group (quota is not capacity: quarantined or cordoned nodes, taints, "
            f"node selectors); {name}: {why}"
        )
    alive = [p for p in pods if get_in(p, "metadata", "deletionTimestamp") is None]
    if len(alive) < replicas:
        return Reason.PODS_NOT_CREATED, (
            f"{len(alive)} of {replicas} worker pods exist: the Job controller could not create "
            "the rest (see the Jobs' FailedCreate events: PodSecurity admission, "
            "ResourceQuota, LimitRange)"
        )
    return None


def _watch_for_stall(b: PlanBuilder, js: JobSetView, pods: Sequence[Json]) -> None:
    """An admitted attempt whose workers are not all running STALL_AFTER after admission
    gets Stalled=True with the reason and an Event, and nothing more: Kueue's
    waitForPodsReady (when the platform enables it) evicts and requeues such a workload,
    which the job survives as PodsReadyTimeout without spending its budget."""
    admitted = next(
        (c for c in b.status.conditions
         if c.type == ConditionType.ADMITTED.value and c.status == "True"),
        None,
    )  # fmt: skip
    since = admitted.last_transition_time if admitted is not None else b.now
    due = since + STALL_AFTER
    if b.now < due:
        b.requeue_in((due - b.now).total_seconds())
        return
    found = stall_of(b, pods)
    if found is None:
        b.requeue_in(STALL_AFTER.total_seconds())
        return
    reason, message = found
    was = next((c for c in b.status.conditions if c.type == ConditionType.STALLED.value), None)
    text = f"attempt {b.status.attempt}: JobSet {js.name}: {message}"
    if was is None or was.status != "True" or was.reason != reason.value:
        b.event(True, reason, text)
        b.notes.append(text)
    b.condition(ConditionType.STALLED, True, reason, text)
    b.requeue_in(STALL_AFTER.total_seconds())


def _awaiting_admission(b: PlanBuilder, js: JobSetView) -> None:
    """Kueue has not admitted the group yet. If spec.queueName names no LocalQueue it never
    will: say so in the Admitted condition (Kueue itself only tells its Workload)."""
    queue = b.snap.queue
    # the queue the JobSet was labelled with at creation (spec.queueName may change since)
    name, namespace = js.queue_name or b.rtj.spec.queue_name, b.rtj.metadata.namespace
    if name is None:  # suspended with no queue: by a Kueue that manages such jobs too
        b.condition(
            ConditionType.ADMITTED,
            False,
            Reason.AWAITING_ADMISSION,
            f"JobSet {js.name} is suspended although it names no LocalQueue "
            "(spec.queueName unset): it waits for what suspended it (a Kueue with "
            "manageJobsWithoutQueueName)",
        )
        return
    if queue is None or queue.name != name or b.now - queue.read_at >= QUEUE_RECHECK:
        b.needs_queue = name
        return
    b.requeue_in((queue.read_at + QUEUE_RECHECK - b.now).total_seconds())
    admitted = next(
        (c for c in b.status.conditions if c.type == ConditionType.ADMITTED.value), None
    )
    flagged = admitted is not None and admitted.reason == Reason.LOCAL_QUEUE_NOT_FOUND.value
    if queue.exists is False and not flagged:
        message = (
            f"LocalQueue {name} does not exist in namespace {namespace}; Kueue admits "
            f"JobSet {js.name} only once it does (spec.queueName)"
        )
        b.condition(ConditionType.ADMITTED, False, Reason.LOCAL_QUEUE_NOT_FOUND, message)
        b.event(True, Reason.LOCAL_QUEUE_NOT_FOUND, f"attempt {b.status.attempt}: {message}")
        b.notes.append(message)
    elif queue.exists is True and flagged:
        b.condition(
            ConditionType.ADMITTED,
            False,
            Reason.AWAITING_ADMISSION,
            f"JobSet {js.name} waits for Kueue to admit the whole group",
        )


IDLE_FINISH_GRACE = timedelta(seconds=30)
"""How long after every pod of the world succeeded the idle pods (warm spares, and the pods
whose rank a spare took) have to finish on order so the JobSet completes; past it (one could
not run: its Job's pod for a rank a spare took found no node), the job succeeds and the
JobSet is deleted, so it holds no quota."""


def finish_with_idle_pods(b: PlanBuilder, n: int, name: str, world: Sequence[Json]) -> bool:
    """With warm spares in the world (`status.spareRanks`): once every pod of the world
    succeeded, the idle pods are told to finish (`reconcile.in_place.restart_order`) and
    the JobSet completes. True when the job succeeded here instead (past
    IDLE_FINISH_GRACE), or while waiting for that."""
    if not b.status.spare_ranks or not world:
        return False
    if any(get_in(p, "status", "phase") != "Succeeded" for p in world):
        return False
    ended = [_finished_at(p) for p in world]
    last = max((t for t in ended if t is not None), default=b.now)
    if b.now - last < IDLE_FINISH_GRACE:
        b.notes.append("every pod of the world succeeded; waiting for the idle pods to finish")
        b.requeue_in((IDLE_FINISH_GRACE - (b.now - last)).total_seconds() + 0.5)
        return True
    succeed(b, n, name, f"attempt {n}: every pod of the world succeeded; the idle pods did "
            f"not all finish within {IDLE_FINISH_GRACE.total_seconds():.0f}s, so JobSet "
            f"{name} is deleted (it holds no quota)")  # fmt: skip
    b.after.append(DeleteJobSet(name))
    return True


def _finished_at(pod: Json) -> datetime | None:
    times = [
        parse_time(get_in(c, "state", "terminated", "finishedAt"))
        for c in get_in(pod, "status", "containerStatuses") or []
    ]
    return max((t for t in times if t is not None), default=None)


def succeed(b: PlanBuilder, n: int, name: str, message: str | None = None) -> None:
    record = b.status.current
    if record is not None:
        b.replace_current(record.model_copy(update={"ended_at": b.now}))
    b.update(phase=Phase.SUCCEEDED)
    message = message or f"attempt {n}: JobSet {name} completed"
    b.condition(ConditionType.COMPLETE, True, Reason.JOB_SUCCEEDED, message)
    b.condition(ConditionType.SUCCEEDED, True, Reason.JOB_SUCCEEDED, message)  # deprecated
    b.condition(ConditionType.RUNNING, False, Reason.JOB_SUCCEEDED, message)
    b.event(False, Reason.JOB_SUCCEEDED, message)
    b.notes.append(message)
