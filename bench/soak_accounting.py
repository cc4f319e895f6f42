"""Goodput and recoveries from the trainer's own logs. Pure.

Input: per attempt, rank 0's JSON lines (examples/ddp_train.py: one `{step, loss, time}`
line per completed step and a `{event: restore, step, source, time}` line when training is
about to start), and every rank's step times for the overlap invariant.

**Worlds.** A world is one set of trainer processes training together. A whole-world
restart starts a new attempt (new pods); a restart in place (issue 15) starts a new trainer
generation inside the same attempt's pods, whose trainers append to the same log files. So
each record names its generation (`RTJ_RESTART_GENERATION`, 0 when unset: a pod's first
start) and a world is `(attempt, generation)`. The generation is the job's
(`status.trainerGeneration`: it only grows), and a new attempt's pods start at 0, so the
pairs sort in the order the worlds ran. `parse_attempt` reads an attempt's lines as one
world (the JobSet baseline's, which has no generations); `split_worlds` and `world_log`
read them per world. Every function below takes either kind of key.

**Goodput, honestly:** the time spent on the steps that survive into the final model,
over the wall time from the job's creation to its last step. The surviving steps are found
backwards from the final world: it contributes the steps after the one it resumed from;
that step was produced by the latest earlier world that logged it, which contributes the
steps after *its* resume point up to it; and so on down to step 0. A step's time is from
the previous step's completion in the same world (for the first step after a resume, from
the restore), less the checkpoint stall the trainer logged with it (`ckpt_s`: the time its
loop spent in the checkpointer's calls since the previous step, a blocking save's whole
duration), so start-up, restore, recomputed steps and every checkpoint stall are lost time.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

World = tuple[int, int]
"""(attempt, trainer generation)."""

K = TypeVar("K", int, World)
"""How worlds are keyed: the attempt alone (no in-place restarts) or `World`."""

FAST_SOURCE = "fast-tier"
"""The restore record's `source` when the trainer resumed from its fast tier (issue 16)."""


@dataclass(frozen=True)
class AttemptLog:
    """One world's log (one rank's records)."""

    attempt: int
    restored: int | None
    """The step training resumed from (0: scratch; None: the world never trained)."""
    restore_time: float | None
    steps: Mapping[int, float]
    """Step -> Unix time the rank completed it (the newest line of a step wins)."""
    losses: Mapping[int, float] = field(default_factory=dict)
    generation: int = 0
    restore_source: str | None = None
    """The restore record's `source`: `fast-tier`, `resume-file` (a pinned durable step),
    `resolved`, `fresh`, or the baseline's file path."""
    stalls: Mapping[int, float] = field(default_factory=dict)
    """Step -> seconds the loop spent in checkpoint calls before it (`ckpt_s`, when > 0)."""

    @property
    def first_time(self) -> float | None:
        return min(self.steps.values(), default=None)

    @property
    def last_step(self) -> int | None:
        return max(self.steps, default=None)

    @property
    def tier(self) -> str | None:
        """Where the world resumed from: fast, durable or scratch (None: never restored)."""
        if self.restored is None:
            return None
        if self.restore_source == FAST_SOURCE:
            return "fast"
        return "scratch" if self.restored == 0 else "durable"


def parse_record(line: str) -> dict[str, Any] | None:
    """One JSON object per line. The line a killed rank was writing is half a record; in
    place, the next generation appends to the same file, so its first record may follow
    that half on the same line: the first suffix that parses is taken."""
    start = 0
    while start >= 0:
        try:
            value = json.loads(line[start:])
        except json.JSONDecodeError:
            start = line.find('{"', start + 1)
            continue
        return value if isinstance(value, dict) else None
    return None


def parse_records(lines: Iterable[str]) -> list[dict[str, Any]]:
    return [r for line in lines if (r := parse_record(line)) is not None]


def from_records(
    attempt: int, records: Iterable[Mapping[str, Any]], generation: int = 0
) -> AttemptLog:
    restored: int | None = None
    restore_time: float | None = None
    source: str | None = None
    steps: dict[int, float] = {}
    losses: dict[int, float] = {}
    stalls: dict[int, float] = {}
    for record in records:
        if record.get("event") == "restore":
            restored, restore_time = int(record["step"]), record.get("time")
            source = record.get("source")
        elif "loss" in record and "event" not in record and "time" in record:
            step = int(record["step"])
            steps[step] = float(record["time"])
            losses[step] = float(record["loss"])
            stall = float(record.get("ckpt_s") or 0.0)
            if stall > 0:
                stalls[step] = stall
            else:
                stalls.pop(step, None)  # a step trained again without one
    return AttemptLog(attempt, restored, restore_time, steps, losses, generation, source, stalls)


def parse_attempt(attempt: int, lines: Iterable[str]) -> AttemptLog:
    """An attempt's lines as one world (every generation together)."""
    return from_records(attempt, parse_records(lines))


def generation_of(record: Mapping[str, Any]) -> int:
    return int(record.get("generation") or 0)


def split_worlds(
    logs: Mapping[int, Mapping[int, Iterable[str]]],
) -> dict[World, dict[int, list[dict[str, Any]]]]:
    """`logs[attempt][rank]` (JSON lines) -> `[(attempt, generation)][rank]` (records)."""
    out: dict[World, dict[int, list[dict[str, Any]]]] = {}
    for attempt, ranks in logs.items():
        for rank, lines in ranks.items():
            for record in parse_records(lines):
                world = (attempt, generation_of(record))
                out.setdefault(world, {}).setdefault(rank, []).append(record)
    return dict(sorted(out.items()))


def world_log(world: World, records: Iterable[Mapping[str, Any]]) -> AttemptLog:
    return from_records(world[0], records, world[1])


def world_label(world: int | World) -> str:
    """`3` (an attempt's first world), `3 g2` (generation 2 inside attempt 3)."""
    if isinstance(world, int):
        return str(world)
    attempt, generation = world
    return f"{attempt}" if generation == 0 else f"{attempt} g{generation}"


@dataclass(frozen=True)
class Lineage(Generic[K]):
    """Which world produced each surviving step range: (world, after, upto)."""

    ranges: tuple[tuple[K, int, int], ...]

    def losses(self, attempts: Mapping[K, AttemptLog]) -> dict[int, float]:
        out: dict[int, float] = {}
        for attempt, after, upto in self.ranges:
            log = attempts[attempt]
            out.update({s: v for s, v in log.losses.items() if after < s <= upto})
        return out


def lineage(attempts: Mapping[K, AttemptLog]) -> Lineage[K]:
    """The surviving step ranges, newest first, found backwards from the final world."""
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
            raise ValueError(f"world {current} resumed from step {after}, which no earlier "
                             "world logged")  # fmt: skip
        current, upto = producers[-1], after


def productive_seconds(attempts: Mapping[K, AttemptLog], line: Lineage[K]) -> float:
    """The time spent on the surviving steps (see the module docstring)."""
    total = 0.0
    for attempt, after, upto in line.ranges:
        log = attempts[attempt]
        times = log.steps
        durations = [
            times[s] - times[s - 1] - log.stalls.get(s, 0.0) for s in times if s - 1 in times
        ]
        typical = statistics.median(durations) if durations else 0.0
        for step in range(after + 1, upto + 1):
            if step not in times:
                continue
            if step - 1 in times:
                spent = times[step] - times[step - 1]
            elif log.restore_time is not None and step == (log.restored or 0) + 1:
                spent = times[step] - log.restore_time
            else:
                total += typical
                continue
            total += max(spent - log.stalls.get(step, 0.0), 0.0)
    return total


def stall_seconds(attempts: Mapping[K, AttemptLog], line: Lineage[K]) -> float:
    """The checkpoint stalls logged with the surviving steps (lost time, not productive)."""
    return sum(
        attempts[w].stalls.get(s, 0.0) for w, after, upto in line.ranges
        for s in range(after + 1, upto + 1)
    )  # fmt: skip


@dataclass(frozen=True)
class Overlap(Generic[K]):
    """Two worlds training at once: world `later` logged a step before `earlier`'s last
    one (any rank)."""

    earlier: K
    later: K
    seconds: float


def overlaps(rank_steps: Mapping[K, Mapping[int, Sequence[float]]]) -> list[Overlap[K]]:
    """`rank_steps[world][rank]` = every step completion time of that rank in that world.
    The invariant: a world's first step on any rank comes after every step of every earlier
    world on every rank (never two worlds training at once; in place, the generations of
    one attempt are worlds of their own)."""
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
    """The attempt of the first later world that trained."""
    seconds_to_first_step: float | None
    lost_steps: int | None
    """Steps of the hit world past the step the next training world resumed from."""
    generation: int = 0
    """The trainer generation the fault hit."""
    resumed_generation: int | None = None
    path: str | None = None
    """`in place` (the next world is a later generation of the same attempt) or `whole
    world` (a new attempt); None: nothing trained again."""
    resumed_from: int | None = None
    tier: str | None = None
    """Where the next world resumed from: fast, durable or scratch."""


def recoveries(
    faults: Sequence[tuple[str, float]], attempts: Mapping[K, AttemptLog]
) -> list[Recovery]:
    """Each `(kind, injected_at)` matched to the world it hit and the next that trained."""
    trained = sorted(a for a, log in attempts.items() if log.steps)
    out = []
    for kind, at in faults:
        hit = max(
            (a for a in trained if (attempts[a].first_time or at) <= at), default=None
        )  # fmt: skip
        after = [a for a in trained if hit is not None and a > hit]
        nxt = attempts[after[0]] if after else None
        was = attempts[hit] if hit is not None else None
        first = nxt.first_time if nxt is not None else None
        hit_last = was.last_step if was is not None else None
        resumed = nxt.restored if nxt is not None else None
        path = None
        if was is not None and nxt is not None:
            path = "in place" if nxt.attempt == was.attempt else "whole world"
        out.append(
            Recovery(
                kind=kind,
                injected_at=at,
                attempt=was.attempt if was is not None else 0,
                resumed_attempt=nxt.attempt if nxt is not None else None,
                seconds_to_first_step=(first - at) if first is not None else None,
                lost_steps=(
                    max(hit_last - resumed, 0)
                    if hit_last is not None and resumed is not None
                    else None
                ),
                generation=was.generation if was is not None else 0,
                resumed_generation=nxt.generation if nxt is not None else None,
                path=path,
                resumed_from=resumed,
                tier=nxt.tier if nxt is not None else None,
            )
        )
    return out


def mean_recovery_by_kind(recs: Iterable[Mapping[str, Any]]) -> dict[str, tuple[float, int]]:
    """Fault kind -> (mean seconds from the injection to the next world's first step, how
    many faults of that kind recovered); faults after which nothing trained are left out."""
    seen: dict[str, list[float]] = {}
    for r in recs:
        if r.get("seconds_to_first_step") is not None:
            seen.setdefault(str(r["kind"]), []).append(float(r["seconds_to_first_step"]))
    return {k: (statistics.fmean(v), len(v)) for k, v in sorted(seen.items())}
