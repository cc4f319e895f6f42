"""Goodput and recoveries from the trainer's own logs. Pure.

Input: per attempt, rank 0's JSON lines (examples/ddp_train.py: one `{step, loss, time}`
line per completed step and a `{event: restore, step, time}` line when training is about
to start), and every rank's step times for the overlap invariant.

**Goodput, honestly:** the time spent on the steps that survive into the final model,
over the wall time from the job's creation to its last step. The surviving steps are found
backwards from the final attempt: it contributes the steps after the one it resumed from;
that step was produced by the latest earlier attempt that logged it, which contributes the
steps after *its* resume point up to it; and so on down to step 0. A step's time is from
the previous step's completion in the same attempt (for the first step after a resume, from
the restore), so start-up, restore, recomputed steps and every stall between are lost time.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class AttemptLog:
    attempt: int
    restored: int | None
    """The step training resumed from (0: scratch; None: the attempt never trained)."""
    restore_time: float | None
    steps: Mapping[int, float]
    """Step -> Unix time rank 0 completed it (the newest line of a step wins)."""
    losses: Mapping[int, float] = field(default_factory=dict)

    @property
    def first_time(self) -> float | None:
        return min(self.steps.values(), default=None)

    @property
    def last_step(self) -> int | None:
        return max(self.steps, default=None)


def parse_attempt(attempt: int, lines: Iterable[str]) -> AttemptLog:
    restored: int | None = None
    restore_time: float | None = None
    steps: dict[int, float] = {}
    losses: dict[int, float] = {}
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # the line a killed rank was writing
        if record.get("event") == "restore":
            restored, restore_time = int(record["step"]), record.get("time")
        elif "loss" in record and "event" not in record and "time" in record:
            steps[int(record["step"])] = float(record["time"])
            losses[int(record["step"])] = float(record["loss"])
    return AttemptLog(attempt, restored, restore_time, steps, losses)


@dataclass(frozen=True)
class Lineage:
    """Which attempt produced each surviving step range: (attempt, after, upto)."""

    ranges: tuple[tuple[int, int, int], ...]

    def losses(self, attempts: Mapping[int, AttemptLog]) -> dict[int, float]:
        out: dict[int, float] = {}
        for attempt, after, upto in self.ranges:
            log = attempts[attempt]
            out.update({s: v for s, v in log.losses.items() if after < s <= upto})
        return out


def lineage(attempts: Mapping[int, AttemptLog]) -> Lineage:
    """The surviving step ranges, newest first, found backwards from the final attempt."""
    trained = sorted(a for a, log in attempts.items() if log.steps)
    if not trained:
        return Lineage(())
    current, upto = trained[-1], attempts[trained[-1]].last_step or 0
    ranges = []
    while True:
        after = attempts[current].restored or 0
        ranges.append((current, after, upto))
        if after <= 0:
            return Lineage(tuple(ranges))
        producers = [a for a in trained if a < current and after in attempts[a].steps]
        if not producers:
            raise ValueError(f"attempt {current} resumed from step {after}, which no earlier "
                             "attempt logged")  # fmt: skip
        current, upto = producers[-1], after


def productive_seconds(attempts: Mapping[int, AttemptLog], line: Lineage) -> float:
    """The time spent on the surviving steps (see the module docstring)."""
    total = 0.0
    for attempt, after, upto in line.ranges:
        log = attempts[attempt]
        times = log.steps
        durations = [times[s] - times[s - 1] for s in times if s - 1 in times]
        typical = statistics.median(durations) if durations else 0.0
        for step in range(after + 1, upto + 1):
            if step not in times:
                continue
            if step - 1 in times:
                total += times[step] - times[step - 1]
            elif log.restore_time is not None and step == (log.restored or 0) + 1:
                total += max(times[step] - log.restore_time, 0.0)
            else:
                total += typical
    return total


@dataclass(frozen=True)
class Overlap:
    """Two attempts training at once: attempt `later` logged a step before `earlier`'s
    last one (any rank)."""

    earlier: int
    later: int
    seconds: float


def overlaps(rank_steps: Mapping[int, Mapping[int, Sequence[float]]]) -> list[Overlap]:
    """`rank_steps[attempt][rank]` = every step completion time of that rank in that
    attempt. The invariant: an attempt's first step on any rank comes after every step of
    every earlier attempt on every rank (never two worlds training at once)."""
    bounds = {}
    for attempt, ranks in rank_steps.items():
        times = [t for steps in ranks.values() for t in steps]
        if times:
            bounds[attempt] = (min(times), max(times))
    out = []
    ordered = sorted(bounds)
    for i, earlier in enumerate(ordered):
        for later in ordered[i + 1 :]:
            gap = bounds[later][0] - bounds[earlier][1]
            if gap <= 0:
                out.append(Overlap(earlier, later, -gap))
    return out


@dataclass(frozen=True)
class Recovery:
    """One injected fault and what it cost."""

    kind: str
    injected_at: float
    attempt: int
    """The attempt the fault hit."""
    resumed_attempt: int | None
    """The first later attempt that trained."""
    seconds_to_first_step: float | None
    lost_steps: int | None
    """Steps of the hit attempt past the step the next training attempt resumed from."""


def recoveries(
    faults: Sequence[tuple[str, float]], attempts: Mapping[int, AttemptLog]
) -> list[Recovery]:
    """Each `(kind, injected_at)` matched to the attempt it hit and the next that trained."""
    trained = sorted(a for a, log in attempts.items() if log.steps)
    out = []
    for kind, at in faults:
        hit = max(
            (a for a in trained if (attempts[a].first_time or at) <= at), default=None
        )  # fmt: skip
        after = [a for a in trained if hit is not None and a > hit]
        nxt = after[0] if after else None
        first = attempts[nxt].first_time if nxt is not None else None
        hit_last = attempts[hit].last_step if hit is not None else None
        resumed = attempts[nxt].restored if nxt is not None else None
        out.append(
            Recovery(
                kind=kind,
                injected_at=at,
                attempt=hit or 0,
                resumed_attempt=nxt,
                seconds_to_first_step=(first - at) if first is not None else None,
                lost_steps=(
                    max(hit_last - resumed, 0)
                    if hit_last is not None and resumed is not None
                    else None
                ),
            )
        )
    return out
