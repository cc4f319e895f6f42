"""The recovery ledger's arithmetic (`api.ledger`). Pure.

* :func:`phase_seconds`: each phase's duration, from the end of the phase before it that
  the record holds (the onset for the first), so the durations of a complete record sum to
  its first step minus its onset, exactly: the recovery's wall time.
* :func:`start_up`: the new world's last phases from its ranks' milestones, as the progress
  sidecars served them. A milestone is the tenant's word: it is placed on the operator's
  clock through the report's ``pod_wall_time`` and held inside the bracket the operator saw
  itself (not before the old world stopped, not after the report arrived), so a wrong
  clock or a lie moves a phase's end only within what the operator's own polls allow.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from rtj_operator.api.ledger import LedgerPhase, RecoveryRecord
from rtj_operator.policy.observed import parse_time
from rtj_operator.policy.preflight import PREFLIGHT_INIT_CONTAINER
from rtj_operator.policy.progress import PodReport
from rtj_shim.wire.milestones import Milestone, Milestones, MilestonesError

PHASE_FIELDS: Mapping[LedgerPhase, str] = {
    LedgerPhase.DETECTED: "detected_at",
    LedgerPhase.DECIDED: "decided_at",
    LedgerPhase.STOPPED: "stopped_at",
    LedgerPhase.REPLACEMENT_READY: "replacement_ready_at",
    LedgerPhase.PREFLIGHT: "preflight_at",
    LedgerPhase.STARTED: "started_at",
    LedgerPhase.RENDEZVOUS: "rendezvous_at",
    LedgerPhase.RESTORED: "restored_at",
    LedgerPhase.FIRST_STEP: "first_step_at",
}


def phase_seconds(record: RecoveryRecord) -> list[tuple[LedgerPhase, float]]:
    """The record's phases with their durations, in order; a phase without its end is left
    out and its time counted in the next one that has one. Nothing before the onset."""
    out: list[tuple[LedgerPhase, float]] = []
    previous = record.failed_at
    for phase, name in PHASE_FIELDS.items():
        ended: datetime | None = getattr(record, name)
        if ended is None:
            continue
        if previous is not None:
            out.append((phase, max((ended - previous).total_seconds(), 0.0)))
        previous = ended if previous is None else max(previous, ended)
    return out


def wall_seconds(record: RecoveryRecord) -> float | None:
    """Onset to first step: what the phases sum to."""
    if record.failed_at is None or record.first_step_at is None:
        return None
    return max((record.first_step_at - record.failed_at).total_seconds(), 0.0)


@dataclass(frozen=True)
class StartUp:
    """When the new world's last rank reached each milestone (operator's clock, Unix s)."""

    rendezvous_at: float | None
    restored_at: float | None
    first_step_at: float
    resumed_step: int | None


def start_up(reports: Sequence[PodReport], since: float, ranks: int) -> StartUp | None:
    """The new world's start-up once every one of its `ranks` ranks completed a first step
    after `since` (when the old world had stopped, or the recovery was decided); None before
    that, or when a report holds no milestones (an older shim). A milestone before `since`
    is an older process's."""
    seen: list[Mapping[Milestone, float]] = []
    steps: list[int] = []
    for report in reports:
        for entry in _ranks(report.body):
            marks = _marks(report, entry, since)
            if marks is None or Milestone.FIRST_STEP not in marks[0]:
                return None
            seen.append(marks[0])
            if marks[1] is not None:
                steps.append(marks[1])
    if len(seen) < ranks or not seen:
        return None

    def last(name: Milestone) -> float | None:
        times = [m[name] for m in seen if name in m]
        return max(times) if len(times) == len(seen) else None

    rendezvous = last(Milestone.RENDEZVOUS) or last(Milestone.RESTORE_BEGAN)
    first = last(Milestone.FIRST_STEP)
    assert first is not None
    return StartUp(rendezvous, last(Milestone.RESTORED), first, min(steps) if steps else None)


def _ranks(body: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    ranks = body.get("ranks")
    if not isinstance(ranks, list):
        return []
    return [r for r in ranks if isinstance(r, Mapping) and r.get("state") != "exited"]


def _marks(
    report: PodReport, entry: Mapping[str, Any], since: float
) -> tuple[dict[Milestone, float], int | None] | None:
    """One rank's milestones on the operator's clock, clamped to [since, received_at], and
    the step it restored; None: none usable (absent, malformed, or no clock to place them)."""
    pod_wall = report.body.get("pod_wall_time")
    raw = entry.get("milestones")
    if raw is None or not isinstance(pod_wall, int | float) or isinstance(pod_wall, bool):
        return None
    try:
        parsed = Milestones.parse({"schema": 1, "pid": 0, "marks": raw})
    except MilestonesError:
        return None
    offset = report.received_at - float(pod_wall)  # operator clock minus the pod's
    out: dict[Milestone, float] = {}
    for name, mark in parsed.marks.items():
        at = mark.at + offset
        if at < since - CLOCK_SLACK:
            continue  # an older process of the rank wrote it
        out[name] = min(max(at, since), report.received_at)
    restored = parsed.marks.get(Milestone.RESTORED)
    return out, restored.step if restored is not None and Milestone.RESTORED in out else None


CLOCK_SLACK = 0.5
"""Seconds a milestone may seem to precede the trainers' start and still be the new
process's: the pod's clock is placed on the operator's through one report's timestamp."""


def preflight_passed_at(pods: Sequence[Mapping[str, Any]]) -> datetime | None:
    """When the last pod's preflight init container passed (the kubelet's time); None
    unless every pod ran one and it passed."""
    ends: list[datetime] = []
    for pod in pods:
        statuses = (pod.get("status") or {}).get("initContainerStatuses") or []
        done = next(
            (
                (s.get("state") or {}).get("terminated") or {}
                for s in statuses
                if isinstance(s, Mapping) and s.get("name") == PREFLIGHT_INIT_CONTAINER
            ),
            {},
        )
        finished = parse_time(done.get("finishedAt")) if done.get("exitCode") == 0 else None
        if finished is None:
            return None
        ends.append(finished)
    return max(ends) if ends else None


def at(seconds: float) -> datetime:
    """Unix seconds as the status's time."""
    return datetime.fromtimestamp(seconds, UTC)
