"""Starting the next attempt: adopt a JobSet created before a crash, wait for the old world
and the backoff, read the store, pin the resume step, render and create the JobSet."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from rtj_operator.api.attempts import AttemptRecord
from rtj_operator.api.ledger import RecoveryPath, Replacement
from rtj_operator.api.reasons import ConditionType, Phase, Reason
from rtj_operator.policy import control_key
from rtj_operator.policy.decide import StartAttempt, Wait, decide
from rtj_operator.policy.preflight import with_preflight
from rtj_operator.policy.render import jobset_name, owner_reference, render_jobset
from rtj_operator.reconcile import ledger as recovery_ledger
from rtj_operator.reconcile.actions import CreateJobSet, CreateKeySecret, MetricRecord
from rtj_operator.reconcile.builder import PlanBuilder
from rtj_operator.reconcile.checkpoints import (
    lost_steps,
    note_verified,
    read_since,
    store_readable,
    store_retry_at,
    store_stale,
    store_unreadable,
)
from rtj_operator.reconcile.converge import converge
from rtj_operator.reconcile.lifecycle import suspended_since
from rtj_operator.reconcile.world import Snapshot, preflight_image, read_jobset
from rtj_operator.selection import (
    Selection,
    operator_reads_store,
    pin_for,
)

MAX_ATTEMPT_RECORDS = 32
"""Older records are trimmed (`status.restarts` keeps the counts)."""


def plan_next_attempt(b: PlanBuilder) -> None:
    snap, status = b.snap, b.status
    n = status.attempt + 1
    name = jobset_name(b.rtj.metadata.name, n)
    views = [read_jobset(js) for js in snap.jobsets]
    uid = b.rtj.metadata.uid
    mine = next(
        (v for v in views if v.name == name and not v.deleting and v.owner_uid == uid), None
    )
    if mine is not None:  # created before a crash or a lost status patch: adopt it
        b.notes.append(f"adopt {name}")
        record_started(b, n, name, mine.created_at or b.now, mine.resume_step, adopted=True)
        b.event(
            False,
            Reason.ATTEMPT_STARTED,
            f"attempt {n}: adopted JobSet {name} (created before the operator restarted)",
        )
        return
    if converge(b, views):
        return
    action = decide(b.rtj.spec, status, None, b.now)
    if isinstance(action, Wait):
        if action.until is not None:
            b.requeue_in((action.until - b.now).total_seconds())
        b.condition(ConditionType.RESTARTING, True, action.reason, action.message)
        b.notes.append(action.message)
        return
    if not isinstance(action, StartAttempt):  # decide never returns more here
        b.notes.append(f"unexpected {type(action).__name__} before an attempt")
        return
    uri = b.rtj.spec.checkpoint.uri
    selection: Selection | None = None
    if operator_reads_store(uri):
        store = snap.store
        failed = status.current.ended_at if status.current is not None else None
        if store is None or store_stale(b, store) or not read_since(b, store, failed):
            b.needs_store = True
            return
        if store.error is not None:
            store_unreadable(b, store.error, blocking=f"attempt {n} is blocked")
            b.requeue_in((store_retry_at(b.status, store) - b.now).total_seconds())
            return
        selection = store.selection
        store_readable(b)
    if _rejected(b, name):
        return
    pin = pin_for(uri, selection, action.resume_step)
    if selection is not None and selection.step is not None and selection.committed_at:
        note_verified(b, selection.step, selection.uri or uri, selection.committed_at, b.now)
    rendered = b.rtj.model_copy(update={"status": b.status})
    if snap.control_key:  # its pods read it from the job's key Secret
        owner = owner_reference(b.rtj)
        meta = b.rtj.metadata
        secret = control_key.key_secret(meta.name, meta.uid, snap.control_key, owner)
        b.before.append(CreateKeySecret(secret))
    b.before.append(
        CreateJobSet(_with_preflight(snap, render_jobset(rendered, n, pin, snap.control_key)))
    )
    where = f"step {pin}" if pin is not None else "the newest step the init container verifies"
    detail = f" (store: {selection.summary()})" if selection is not None else ""
    b.event(
        False,
        Reason.ATTEMPT_STARTED,
        f"attempt {n} ({action.message.partition(':')[0]}): JobSet {name} resumes from "
        f"{where}{detail}",
    )
    record_started(b, n, name, b.now, pin, adopted=False)


def record_started(
    b: PlanBuilder, n: int, name: str, started: datetime, pin: int | None, *, adopted: bool
) -> None:
    status = b.status
    attempts = list(status.attempts)
    previous = attempts[-1] if attempts else None
    if (
        previous is not None
        and previous.failure_class is not None
        and previous.recovery_seconds is None
    ):
        onset = (
            previous.first_failed.finished_at if previous.first_failed else None
        ) or previous.ended_at
        if onset is not None and not suspended_since(status, onset):  # a pause, no recovery
            seconds = max((started - onset).total_seconds(), 0.0)
            attempts[-1] = previous.model_copy(update={"recovery_seconds": round(seconds, 3)})
            b.metrics.append(MetricRecord("recovery", previous.failure_class, seconds))
            recovery_ledger.open_record(
                b, RecoveryPath.WHOLE_WORLD, previous.failure_class, onset,
                detected_at=previous.ended_at, decided_at=previous.ended_at, attempt=n,
                stopped_at=started, replacement=Replacement.POD,
            )  # fmt: skip
    before = b.snap.rtj.status.last_verified_checkpoint  # as known before this plan
    known = before.step if before is not None else None
    # file:// roots: the step resumed is known once the init container reports it
    lost = lost_steps(known, pin) if operator_reads_store(b.rtj.spec.checkpoint.uri) else None
    if lost:
        b.metrics.append(MetricRecord("lost_steps", None, float(lost)))
    attempts.append(
        AttemptRecord(
            attempt=n, job_set=name, started_at=started, resumed_from_step=pin, lost_steps=lost
        )
    )
    b.update(
        attempt=n,
        attempts=attempts[-MAX_ATTEMPT_RECORDS:],
        phase=Phase.PENDING,
        next_attempt_at=None,
    )
    message = f"attempt {n} started: JobSet {name}" + (" (adopted)" if adopted else "")
    b.condition(ConditionType.RESTARTING, False, Reason.ATTEMPT_STARTED, message)
    b.condition(
        ConditionType.ADMITTED,
        False,
        Reason.AWAITING_ADMISSION,
        f"JobSet {name} waits for Kueue to admit the whole group"
        if b.rtj.spec.queue_name is not None
        else f"JobSet {name} created running, without Kueue (spec.queueName unset): JobSet "
        "alone starts the group",
    )
    b.condition(
        ConditionType.RUNNING, False, Reason.AWAITING_ADMISSION, f"attempt {n} not running yet"
    )
    b.notes.append(message)


def _rejected(b: PlanBuilder, name: str) -> bool:
    """The API server refused this JobSet for this generation of the job: say so (a
    condition and one Event) and wait for the spec to change, instead of re-sending the
    same refused object forever."""
    refused = b.snap.rejection
    generation = b.rtj.metadata.generation
    if refused is None or refused.jobset != name or refused.generation != generation:
        return False
    message = (
        f"JobSet {name} was refused by the API server: {refused.message}; fix "
        "spec.template (or the cluster's policy) and the job retries with the new spec"
    )
    already = any(
        c.type == ConditionType.ADMITTED.value and c.reason == Reason.JOBSET_REJECTED.value
        for c in b.status.conditions
    )
    if not already:
        b.event(True, Reason.JOBSET_REJECTED, message)
    b.condition(ConditionType.ADMITTED, False, Reason.JOBSET_REJECTED, message)
    b.notes.append(message)
    return True


def _with_preflight(snap: Snapshot, jobset: dict[str, Any]) -> dict[str, Any]:
    """The attempt's JobSet with the platform's preflight in its pods, where the job keeps
    it enabled and the platform has an image for it (`policy.preflight`)."""
    spec = snap.rtj.spec.preflight
    image = preflight_image(snap)
    if image is None:
        return jobset
    node = snap.preflight.node_command
    return with_preflight(jobset, image, node, spec.timeout_seconds, spec.bandwidth_factor)
