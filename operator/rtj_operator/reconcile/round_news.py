"""Whether a progress poll round can change a job's last plan. Pure.

Every answered round carries new steps; planning each one cost 1,000 jobs a plan every 5 s
(issue 49: decisions p99 2.76 s with every sidecar answering). What a plan reads from a
round is three kinds of thing:

* what changes a decision at once (`RoundDigest.shape`): the attempt, which pods did not
  answer, which reports are no report (stale or malformed), the ranks, whether each
  exited and whether each has stepped yet (a recovery's record completes on the new
  world's first steps, `ledger.settle`), the milestones and save tiers each pod's ranks
  have reported, the stragglers by rank and pod, and everything else the sidecars carry
  (supervisors, fast tier, peer replicas, drains, indexes, silences), compared whole;
* what turns into a decision as time passes (`RoundDigest.due`): a Hang, when a rank stays
  in its section past its allowance, and a report aging out of the evidence;
* what the plan only shows (`RoundDigest.summary`): the step every rank completed, written
  to status at most every `ranks.SUMMARY_EVERY` anyway.

A round whose shape is the planned one, before its due time, whose summary moved less than
`SUMMARY_EVERY` after the plan, is no news: steps that only advance cost no plan. `due` is
a lower bound (the earliest any rank could be judged hung), so a skipped round never hides
a Hang: the round after it is due is planned, and the plan judges it exactly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from functools import cached_property
from typing import Any

from rtj_operator.api.detection_spec import ProgressMonitoring
from rtj_operator.policy import progress as rank_progress
from rtj_operator.reconcile.ranks import SUMMARY_EVERY, step_allowances
from rtj_operator.reconcile.world import RankReadings, Snapshot


@dataclass(frozen=True)
class RoundDigest:
    """What a plan reads from one reading, split by how it changes (module docstring)."""

    shape: tuple[Any, ...]
    summary: tuple[int | None, int]
    """The step every running rank completed (None: one has none yet), and how many run."""
    due: float
    """Unix s: the earliest a rank could be past its allowance, or a fresh report stale."""


@dataclass(frozen=True)
class PlannedRound:
    """The reading a job's last plan was made from (None: it had none), when, and the
    progress spec its allowances came from. Its digest is taken when a round first asks
    for it: once per round, not once per plan (a recovery plans a job many times)."""

    reading: RankReadings | None
    at: datetime
    spec: ProgressMonitoring

    @cached_property
    def digest(self) -> RoundDigest | None:
        if self.reading is None:
            return None
        return round_digest(self.reading, self.spec, self.at.timestamp())


def unanswered_pods(reading: RankReadings) -> frozenset[str]:
    """The pods a round did not hear from (`RankReadings.unanswered` is "pod: why")."""
    return frozenset(line.partition(":")[0] for line in reading.unanswered)


def round_digest(reading: RankReadings, spec: ProgressMonitoring, now: float) -> RoundDigest:
    """`reading` as a plan at `now` would read it (one parse, shared with the plan's)."""
    max_age = rank_progress.DEFAULT_MAX_REPORT_AGE
    parsed = rank_progress.parse_reports(reading.reports, now)
    running = [r for r in parsed.ranks if not r.exited]
    allowances = step_allowances(spec, reading.reports, now)
    hang_at = min((r.section_since + allowances.for_section(r.section) for r in running),
                  default=math.inf)  # fmt: skip
    fresh = [r.received_at for r in reading.reports if now - r.received_at <= max_age]
    stale_at = min(fresh, default=math.inf) + max_age
    rest = replace(reading, reports=(), polled_at=0.0, unanswered=(), stragglers=())
    shape = (
        rest,
        unanswered_pods(reading),
        frozenset((s.rank, s.pod) for s in reading.stragglers),
        frozenset(parsed.bad_pods),
        tuple((r.rank, r.pod, r.exited, r.step is None) for r in parsed.ranks),
        reported_marks(reading),
    )
    summary = rank_progress.job_progress(reading.reports, now)
    return RoundDigest(shape, (summary.step, summary.ranks), min(hang_at, stale_at))


def reported_marks(reading: RankReadings) -> frozenset[tuple[str, str, str]]:
    """(pod, part, name) for each milestone a rank of the pod has reached and each save tier
    it has measured. The last start-up milestone completes a recovery's record
    (`ledger.settle`); a tier's first save cost lets `plannedIntervalSeconds: auto` choose
    (`reconcile.intervals`), later ones move its choice within the 30 s of the summary."""
    out: set[tuple[str, str, str]] = set()
    for report in reading.reports:
        ranks = report.body.get("ranks")
        for entry in ranks if isinstance(ranks, list) else ():
            if not isinstance(entry, Mapping):
                continue
            for part in ("milestones", "save_costs"):
                held = entry.get(part)
                if isinstance(held, Mapping):
                    out.update((report.pod, part, str(name)) for name in held)
    return frozenset(out)


def planned_round(snap: Snapshot) -> PlannedRound:
    """What the controller keeps of the plan it just made from `snap`."""
    return PlannedRound(snap.ranks, snap.now, snap.rtj.spec.progress)


def round_has_news(planned: PlannedRound, reading: RankReadings, now: datetime) -> bool:
    """Whether a plan at `now` from `reading` can decide or show anything the job's last
    plan did not (module docstring)."""
    was = planned.digest
    if was is None:
        return True
    at = now.timestamp()
    digest = round_digest(reading, planned.spec, at)
    if digest.shape != was.shape or at >= digest.due:
        return True
    return digest.summary != was.summary and now - planned.at >= SUMMARY_EVERY
