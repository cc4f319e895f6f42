"""What the operator knows of the job's checkpoints: the newest verified step, store readings
and their freshness, the init container's verdict, and the checkpoint-age condition."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from rtj_operator.api import keys
from rtj_operator.api.reasons import ConditionType, Phase, Reason
from rtj_operator.api.status import ResilientTrainingJobStatus, VerifiedCheckpoint
from rtj_operator.policy.intervals import planned_seconds
from rtj_operator.policy.observed import parse_time
from rtj_operator.reconcile.actions import MetricRecord
from rtj_operator.reconcile.builder import PlanBuilder, condition_true
from rtj_operator.reconcile.world import Json, StoreReading, get_in
from rtj_operator.selection import (
    operator_reads_store,
    parse_init_result,
)

STORE_FRESH = timedelta(seconds=10)
"""A store reading older than this is re-read before an attempt is started."""


STORE_RETRY_SECONDS = 30.0
"""The longest wait before an unreadable store is read again."""


STORE_RETRY_MIN_SECONDS = 2.0
"""The first wait after a store turned unreadable. The wait then grows with the outage (it
about doubles) up to STORE_RETRY_SECONDS: a blip delays a restart by seconds, a long outage
costs one read per STORE_RETRY_SECONDS."""


STALE_FACTOR = 2
"""CheckpointStale when the newest verified step is older than this many planned intervals."""


def note_verified(
    b: PlanBuilder, step: int, uri: str, committed_at: datetime, verified_at: datetime
) -> None:
    if step in b.status.bad_steps:
        return  # a step marked bad is never verified again, whatever a reading says
    current = b.status.last_verified_checkpoint
    superseded = current is not None and current.step in b.status.bad_steps
    if current is not None and current.step > step and not superseded:
        return  # a newer verified step is known (a step marked bad is not verified)
    if current is not None and current.step == step and current.uri == uri:
        return
    b.update(
        last_verified_checkpoint=VerifiedCheckpoint(
            step=step, uri=uri, committed_at=committed_at, verified_at=verified_at
        )
    )


def read_since(b: PlanBuilder, store: StoreReading | None, since: datetime | None) -> bool:
    """Whether a pin may come from ``store``: a reading begun after ``since`` (the failure: a
    step published just before it counts) that covers every step marked bad since (a step
    marked bad is never pinned)."""
    if store is None or (since is not None and store.read_at < since):
        return False
    return store.covers(b.status.bad_steps)


def store_stale(b: PlanBuilder, store: StoreReading) -> bool:
    """Whether to read the store again before deciding: a good reading after STORE_FRESH,
    an error when its retry is due."""
    if store.error is not None:
        return b.now >= store_retry_at(b.status, store)
    return store.read_at < b.now - STORE_FRESH


def store_retry_at(status: ResilientTrainingJobStatus, store: StoreReading) -> datetime:
    """When an unreadable store is read again: after as long as it has been unreadable when
    it was last read (STORE_RETRY_MIN_SECONDS at first, STORE_RETRY_SECONDS at most)."""
    cond = next(
        (
            c
            for c in status.conditions
            if c.type == ConditionType.CHECKPOINT_UNREADABLE.value and c.status == "True"
        ),
        None,
    )
    since = min(cond.last_transition_time, store.read_at) if cond else store.read_at
    outage = (store.read_at - since).total_seconds()
    wait = min(max(outage, STORE_RETRY_MIN_SECONDS), STORE_RETRY_SECONDS)
    return store.read_at + timedelta(seconds=wait)


def store_unreadable(b: PlanBuilder, error: str, blocking: str) -> None:
    already = condition_true(b.status, ConditionType.CHECKPOINT_UNREADABLE)
    message = f"checkpoint store {b.rtj.spec.checkpoint.uri} cannot be read: {error}; {blocking} "
    message += "(an unreadable store is never treated as 'no checkpoint')"
    b.condition(
        ConditionType.CHECKPOINT_UNREADABLE, True, Reason.CHECKPOINT_STORE_UNREADABLE, message
    )
    if not already:
        b.event(True, Reason.CHECKPOINT_STORE_UNREADABLE, message)
    b.requeue_in(STORE_RETRY_SECONDS)
    b.notes.append(message)


def store_readable(b: PlanBuilder) -> None:
    if condition_true(b.status, ConditionType.CHECKPOINT_UNREADABLE):
        b.condition(
            ConditionType.CHECKPOINT_UNREADABLE,
            False,
            Reason.CHECKPOINT_READABLE,
            "the checkpoint store was read successfully",
        )
        b.event(False, Reason.CHECKPOINT_READABLE, "the checkpoint store is readable again")


def read_init_results(b: PlanBuilder, pods: Sequence[Json]) -> None:
    """file:// roots: the init container tells which step it verified and resumed from."""
    for pod in pods:
        for raw in get_in(pod, "status", "initContainerStatuses") or []:
            if not isinstance(raw, Mapping) or raw.get("name") != keys.RESUME_INIT_CONTAINER:
                continue
            term = get_in(raw, "state", "terminated")
            if not isinstance(term, Mapping) or term.get("exitCode") != 0:
                continue
            result = parse_init_result(str(term.get("message") or ""))
            if result is None or result.error is not None:
                continue
            record = b.status.current
            if record is not None and record.resumed_from_step is None and result.step is not None:
                known = (
                    b.status.last_verified_checkpoint.step
                    if b.status.last_verified_checkpoint
                    else None
                )
                lost = lost_steps(known, result.step)
                b.replace_current(
                    record.model_copy(update={"resumed_from_step": result.step, "lost_steps": lost})
                )
                if lost:
                    b.metrics.append(MetricRecord("lost_steps", None, float(lost)))
            if result.step is not None:
                at = parse_time(term.get("finishedAt")) or b.now
                note_verified(b, result.step, result.uri or b.rtj.spec.checkpoint.uri, at, at)
            return


def refresh_checkpoint(b: PlanBuilder) -> None:
    """s3:// roots: the latest periodic reading moves lastVerifiedCheckpoint forward."""
    store = b.snap.store
    if store is not None and operator_reads_store(b.rtj.spec.checkpoint.uri):
        if store.error is not None:
            store_unreadable(b, store.error, blocking="restarts are blocked until it is")
        else:
            store_readable(b)
            sel = store.selection if store.covers(b.status.bad_steps) else None
            if sel is not None and sel.step is not None and sel.committed_at is not None:
                note_verified(b, sel.step, sel.uri or "", sel.committed_at, store.read_at)
    _checkpoint_age(b)


def _checkpoint_age(b: PlanBuilder) -> None:
    """CheckpointStale while running and the newest verified step is too old. Unknown for
    file:// roots: the operator cannot read a volume only the pods mount, so it knows the
    step each attempt resumed from, not the steps published since (and claims nothing)."""
    if b.status.phase is not Phase.RUNNING:
        return
    if not operator_reads_store(b.rtj.spec.checkpoint.uri):
        b.condition(
            ConditionType.CHECKPOINT_STALE,
            None,
            "CheckpointAgeUnknown",
            "the operator cannot read a file:// root (a volume only the pods mount): it knows "
            "the step this attempt resumed from, not the steps published since; the age "
            "condition and alert need an s3:// root",
        )
        return
    interval = planned_seconds(
        b.rtj.spec.checkpoint.planned_interval_seconds,
        b.status.checkpoint_intervals,
        b.snap.intervals.max_seconds,
    )
    limit = timedelta(seconds=STALE_FACTOR * interval)
    ckpt = b.status.last_verified_checkpoint
    running = next(
        (
            c
            for c in b.status.conditions
            if c.type == ConditionType.RUNNING.value and c.status == "True"
        ),
        None,
    )
    if running is None:
        return
    reference = running.last_transition_time
    if ckpt is not None and ckpt.committed_at > reference:
        reference = ckpt.committed_at
    age = b.now - reference
    stale = age > limit
    what = f"step {ckpt.step}" if ckpt is not None else "no verified checkpoint since the start"
    message = (
        f"{what}; age {int(age.total_seconds())}s, planned interval {interval}s "
        f"(stale beyond {STALE_FACTOR}x)"
    )
    was = condition_true(b.status, ConditionType.CHECKPOINT_STALE)
    if stale != was:
        reason = "CheckpointTooOld" if stale else "CheckpointFresh"
        b.condition(ConditionType.CHECKPOINT_STALE, stale, reason, message)
    if not stale:
        b.requeue_in((limit - age).total_seconds() + 1)


def lost_steps(known: int | None, resumed: int | None) -> int:
    """Verified steps passed over: the newest known before the start minus the one resumed."""
    if known is None:
        return 0
    return max(known - (resumed if resumed is not None else 0), 0)
