"""The recovery ledger in the plan (`status.recoveries`, `api.ledger`): a recovery opens its
record when its path is chosen, the plan notes each phase's end as it sees it, and once
every rank of the new world has completed a first step (their milestones,
`policy.ledger.start_up`) the record is completed and its phases recorded as histograms.

A record is written, never rewritten: `note` fills a field only while it is empty and the
record open, so a phase ends at the first plan that saw it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from rtj_operator.api.attempts import InPlacePhase
from rtj_operator.api.ledger import (
    MAX_RECOVERY_RECORDS,
    RecoveryPath,
    RecoveryRecord,
    Replacement,
)
from rtj_operator.api.reasons import FailureClass
from rtj_operator.policy import in_place, ledger
from rtj_operator.policy import progress as rank_progress
from rtj_operator.policy.observed import parse_time
from rtj_operator.reconcile.actions import MetricRecord
from rtj_operator.reconcile.builder import PlanBuilder
from rtj_operator.reconcile.world import Json, get_in, pod_name
from rtj_shim.wire.supervisor_report import STOPPED_STATES, SupervisorReport


def open_record(
    b: PlanBuilder,
    path: RecoveryPath,
    failure_class: FailureClass | None,
    failed_at: datetime | None,
    *,
    detected_at: datetime | None,
    replacement: Replacement = Replacement.NONE,
    generation: int = 0,
    attempt: int | None = None,
    stopped_at: datetime | None = None,
    decided_at: datetime | None = None,
) -> None:
    """A recovery's path is chosen now: its record goes first (an older one still open
    stays as it was: that recovery never completed)."""
    record = RecoveryRecord(
        attempt=attempt if attempt is not None else b.status.attempt,
        generation=generation,
        path=path,
        failure_class=failure_class,
        replacement=replacement,
        failed_at=failed_at,
        detected_at=detected_at,
        decided_at=decided_at or b.now,
        stopped_at=stopped_at,
        step_at_failure=step_reached(b),
    )
    b.update(recoveries=[record, *b.status.recoveries][:MAX_RECOVERY_RECORDS])


def step_reached(b: PlanBuilder) -> int | None:
    """The step every rank of the failed world had completed: its ranks' last reports
    (the failed rank's included) when the poller still holds them, else status.progress
    (refreshed less often, so it may say less)."""
    attempt = b.status.attempt
    readings = b.snap.ranks
    if readings is not None and readings.attempt == attempt and readings.reports:
        found = rank_progress.job_progress(readings.reports, b.now.timestamp()).step
        if found is not None:
            return found
    progress = b.status.progress
    return progress.step if progress is not None and progress.attempt == attempt else None


def open_for(b: PlanBuilder) -> RecoveryRecord | None:
    """The newest record when it is open and belongs to the world running now."""
    records = b.status.recoveries
    if not records or records[0].complete:
        return None
    record = records[0]
    if record.attempt != b.status.attempt or record.generation != b.status.attempt_generation:
        return None
    return record


def note(b: PlanBuilder, **ends: datetime) -> None:
    """Phases seen ending now (or at the times given): each field set only while empty."""
    record = open_for(b)
    if record is None:
        return
    fresh = {k: v for k, v in ends.items() if getattr(record, k) is None}
    if fresh:
        _replace_newest(b, record.model_copy(update=fresh))


def settle(b: PlanBuilder) -> None:
    """Complete the open record once every rank of the new world stepped (its milestones)."""
    record = open_for(b)
    readings = b.snap.ranks
    if record is None or readings is None:
        return
    since = record.stopped_at or record.decided_at
    if since is None:
        return
    if readings.attempt != b.status.attempt or readings.unanswered:
        return
    world = b.status.world_size or b.rtj.spec.replicas
    if len(readings.reports) < world:
        return
    found = ledger.start_up(readings.reports, since.timestamp(), world)
    if found is None:
        return
    first = ledger.at(found.first_step_at)
    earliest = min(t for t in (found.rendezvous_at, found.restored_at, found.first_step_at) if t)
    started = record.started_at or ledger.at(earliest)
    retrained = (
        max(record.step_at_failure - found.resumed_step, 0)
        if record.step_at_failure is not None and found.resumed_step is not None
        else None
    )
    done = record.model_copy(update={
        "started_at": min(started, ledger.at(earliest)),  # they ran before it was seen
        "rendezvous_at": ledger.at(found.rendezvous_at) if found.rendezvous_at else None,
        "restored_at": ledger.at(found.restored_at) if found.restored_at else None,
        "first_step_at": first, "resumed_step": found.resumed_step,
        "steps_retrained": retrained, "complete": True,
    })  # fmt: skip
    _replace_newest(b, done)
    for phase, seconds in ledger.phase_seconds(done):
        b.metrics.append(MetricRecord("ledger_phase", value=seconds, phase=phase, path=done.path))
    if retrained is not None:
        b.metrics.append(MetricRecord("steps_retrained", value=retrained, path=done.path))


def note_old_world_stopped(
    b: PlanBuilder, state: InPlacePhase, live: Sequence[Json],
    reports: Mapping[str, SupervisorReport], old: Sequence[Json],
) -> None:  # fmt: skip
    """The ledger's `stoppedAt`: every pod that ran the old world (not a replacement, which
    the Job created after the restart began) stopped it, and every replaced pod is gone."""
    began = state.since.replace(microsecond=0)  # creation times are whole seconds
    ran = [pod_name(p) for p in live
           if (made := parse_time(get_in(p, "metadata", "creationTimestamp"))) is None
           or made < began]  # fmt: skip
    if not old and not in_place.reported(reports, ran, state.generation, STOPPED_STATES):
        note(b, stopped_at=b.now)


def _replace_newest(b: PlanBuilder, record: RecoveryRecord) -> None:
    b.update(recoveries=[record, *b.status.recoveries[1:]])
