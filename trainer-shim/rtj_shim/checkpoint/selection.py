"""Which step to resume from. Pure over listings; verification is passed in as a function.

``latest.json`` is only a hint, never the source of truth: a stale hint (a crash between
publish and hint update, or a hint written by a slower writer) must not hide a newer
published step, so candidates are always every published step newest-first and the hint
only decides what is reported about it. The first step that verifies wins, and every step
passed over is reported with its reason.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from rtj_shim.checkpoint.layout import LATEST_FILE, StepDirName
from rtj_shim.checkpoint.verification import Depth


@dataclass(frozen=True)
class Skipped:
    step: int
    reason: str


@dataclass(frozen=True)
class Resolution:
    step: int | None
    uri: str | None
    verification: Depth | None
    skipped: tuple[Skipped, ...]
    hint_problem: str | None = None


@dataclass(frozen=True)
class Hint:
    step: int | None
    problem: str | None


def parse_latest_hint(raw: bytes | None) -> Hint:
    """Read ``latest.json``; a missing or garbage hint is reported, never trusted."""
    if raw is None:
        return Hint(None, None)
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return Hint(None, f"{LATEST_FILE} is not valid JSON; scanning all steps")
    step = data.get("step") if isinstance(data, dict) else None
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return Hint(None, f"{LATEST_FILE}: field 'step' must be a non-negative integer")
    return Hint(step, None)


def resume_candidates(published: Iterable[int], bad_steps: Iterable[int] = ()) -> list[int]:
    """Every published step, newest first, but those marked bad (the operator's record of
    steps an earlier attempt's init container rejected)."""
    return sorted(set(published) - set(bad_steps), reverse=True)


def hint_problem(hint: Hint, published: Iterable[int], chosen: int | None) -> str | None:
    """What is wrong with the hint, if anything; resolution never depends on it."""
    if hint.problem is not None or hint.step is None:
        return hint.problem
    if hint.step not in set(published):
        return f"{LATEST_FILE} points to step {hint.step}, which is not published"
    if chosen is not None and hint.step < chosen:
        return f"{LATEST_FILE} points to step {hint.step}, but step {chosen} is newer (stale hint)"
    if hint.step != chosen:
        return f"{LATEST_FILE} points to step {hint.step}, which does not verify"
    return None


def in_progress_skips(dirs: Iterable[StepDirName], newer_than: int | None) -> list[Skipped]:
    """In-progress directories newer than the chosen step, reported so users see why."""
    return [
        Skipped(d.step, f"in progress ({d}); a step without COMMITTED is never resumed")
        for d in sorted(dirs, key=lambda d: d.step, reverse=True)
        if d.in_progress and (newer_than is None or d.step > newer_than)
    ]


class StepJudgement(Protocol):
    """What a chooser needs of a verdict on one step (`Verdict`, the operator's own)."""

    @property
    def valid(self) -> bool: ...

    @property
    def reason(self) -> str: ...


J = TypeVar("J", bound=StepJudgement)


def select_resume_step(
    candidates: Sequence[int], verify: Callable[[int], J]
) -> tuple[J | None, list[Skipped]]:
    """The one resume chooser (the init container's, the trainer's and the operator's):
    verify candidates in order (lazily: it stops at the first that verifies); return that
    verdict and what was skipped."""
    skipped: list[Skipped] = []
    for step in candidates:
        verdict = verify(step)
        if verdict.valid:
            return verdict, skipped
        skipped.append(Skipped(step, verdict.reason))
    return None, skipped
