"""Stragglers from the ranks' progress reports. Pure.

A rank is slow in a window when its median busy time per step (step time minus time in
waiting sections, `policy.progress.WAITING_SECTIONS`, as the progress server reports it)
exceeds the median of the *other* ranks' divided by ``ratio``; it is a straggler after
``windows`` consecutive slow windows. The state between windows is returned, never kept.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rtj_operator.policy.progress import DEFAULT_MAX_REPORT_AGE, PodReport, parse_reports


@dataclass(frozen=True)
class RankWindows:
    pod: str
    steps_completed: int
    slow_windows: int


@dataclass(frozen=True)
class StragglerState:
    """Per rank: where it was seen last and for how many consecutive windows it was slow.
    Returned anew by every :func:`stragglers` call; pass it to the next one."""

    ranks: Mapping[int, RankWindows] = field(default_factory=dict)


@dataclass(frozen=True)
class Straggler:
    rank: int
    pod: str
    busy_seconds: float  # this rank's median busy time per step
    reference_seconds: float  # the median of the other ranks' busy times
    slow_windows: int

    @property
    def ratio(self) -> float:
        return self.busy_seconds / self.reference_seconds if self.reference_seconds else 0.0


@dataclass(frozen=True)
class StragglerResult:
    stragglers: tuple[Straggler, ...]
    state: StragglerState


def _median_without(ordered: Sequence[float], value: float) -> float:
    """The median of `ordered` (sorted) with one occurrence of `value` left out."""
    n = len(ordered) - 1
    gone = bisect.bisect_left(ordered, value)

    def at(k: int) -> float:
        return ordered[k if k < gone else k + 1]

    return at(n // 2) if n % 2 else (at(n // 2 - 1) + at(n // 2)) / 2


def stragglers(
    reports: Sequence[PodReport],
    state: StragglerState | None = None,
    *,
    now: float,
    ratio: float = 0.7,
    windows: int = 3,
    max_report_age: float = DEFAULT_MAX_REPORT_AGE,
) -> StragglerResult:
    """One window: a rank is slow when its median busy time per step exceeds the median of
    the *other* ranks' / ``ratio``; it is a straggler after ``windows`` consecutive slow
    windows. A window in which a rank completed no new step leaves its count as it was; a
    rank seen in another pod or with fewer completed steps (a new process) starts again.

    Busy time is the step time minus the time spent in waiting sections (``allreduce``,
    ``barrier``, ...): in a synchronous job every rank's step time is the same (the fast
    ones wait for the slow one), so only the busy time tells them apart. A job that marks
    no waiting section is judged on step times (right for ranks that do not wait on each
    other)."""
    previous = state.ranks if state is not None else {}
    ranks = [
        r
        for r in parse_reports(reports, now, max_report_age).ranks
        if not r.exited and (r.median_busy or r.median_step)
    ]
    busy = {r.rank: float(r.median_busy or r.median_step or 0.0) for r in ranks}
    updated: dict[int, RankWindows] = {}
    found: list[Straggler] = []
    ordered = sorted(busy.values())  # one sort: each leave-one-out median is O(1)
    for r in ranks:
        seen = previous.get(r.rank)
        count = seen.slow_windows if seen is not None else 0
        if seen is not None and (seen.pod != r.pod or r.steps_completed < seen.steps_completed):
            seen, count = None, 0
        others = len(ordered) > 1
        reference = _median_without(ordered, busy[r.rank]) if others else 0.0
        if seen is None or r.steps_completed > seen.steps_completed:
            slow = bool(others) and busy[r.rank] > reference / ratio
            count = count + 1 if slow else 0
        updated[r.rank] = RankWindows(r.pod, r.steps_completed, count)
        if count >= windows:
            found.append(Straggler(r.rank, r.pod, busy[r.rank], reference, count))
    for rank, kept in previous.items():
        updated.setdefault(rank, kept)  # not reported this window: no new evidence
    return StragglerResult(tuple(found), StragglerState(updated))
