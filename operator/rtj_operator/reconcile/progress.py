"""An attempt that has not failed: admission by Kueue, all workers running, success."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from rtj_operator.api.reasons import ConditionType, Phase, Reason
from rtj_operator.reconcile.builder import PlanBuilder
from rtj_operator.reconcile.world import JobSetView, Json, get_in

QUEUE_RECHECK = timedelta(seconds=60)
"""While a JobSet waits for admission, the job's LocalQueue is looked up this often."""


def progress(b: PlanBuilder, js: JobSetView, pods: Sequence[Json]) -> None:
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
            f"Kueue admitted JobSet {js.name}",
        )
        b.event(False, Reason.ATTEMPT_ADMITTED, f"attempt {n}: JobSet {js.name} admitted")
    running = sum(
        1
        for p in pods
        if get_in(p, "status", "phase") == "Running"
        and get_in(p, "metadata", "deletionTimestamp") is None
    )
    if running >= b.rtj.spec.replicas and b.status.phase is not Phase.RUNNING:
        b.update(phase=Phase.RUNNING)
        message = f"attempt {n}: all {running} workers of JobSet {js.name} are running"
        b.condition(ConditionType.RUNNING, True, Reason.ATTEMPT_RUNNING, message)
        b.event(False, Reason.ATTEMPT_RUNNING, message)


def _awaiting_admission(b: PlanBuilder, js: JobSetView) -> None:
    """Kueue has not admitted the group yet. If spec.queueName names no LocalQueue it never
    will: say so in the Admitted condition (Kueue itself only tells its Workload)."""
    queue = b.snap.queue
    # the queue the JobSet was labelled with at creation (spec.queueName may change since)
    name, namespace = js.queue_name or b.rtj.spec.queue_name, b.rtj.metadata.namespace
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


def succeed(b: PlanBuilder, n: int, name: str) -> None:
    record = b.status.current
    if record is not None:
        b.replace_current(record.model_copy(update={"ended_at": b.now}))
    b.update(phase=Phase.SUCCEEDED)
    message = f"attempt {n}: JobSet {name} completed"
    b.condition(ConditionType.SUCCEEDED, True, Reason.JOB_SUCCEEDED, message)
    b.condition(ConditionType.RUNNING, False, Reason.JOB_SUCCEEDED, message)
    b.event(False, Reason.JOB_SUCCEEDED, message)
    b.notes.append(message)
