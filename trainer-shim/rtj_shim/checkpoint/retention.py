"""Which steps to keep and which to delete. Pure: a plan over a listing of step states.

Kept: the newest ``keep_last`` verified steps, the verified step before the newest (the
fallback if the newest later fails deep verification), every ``keep_every``-th step as a
milestone, every protected step (the one a running attempt resumed from), and the
``keep_best`` verified steps with the best recorded metric (manifest ``extra.metric``,
written by the trainer; :func:`metric_of`). The newest verified step is never deleted.
Unverified directories newer than the newest verified step may still be in progress and
are kept; older ones are abandoned and deleted.

The operator passes the job's policy to the trainer as environment (:func:`policy_from_env`):
``RTJ_KEEP_LAST`` (retention is on only when it is set), ``RTJ_KEEP_EVERY`` and
``RTJ_PROTECT_STEP`` (the step the running attempt resumed from).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from rtj_shim.checkpoint.layout import MAX_STEP, StepDirName

ENV_KEEP_LAST = "RTJ_KEEP_LAST"
ENV_KEEP_EVERY = "RTJ_KEEP_EVERY"
ENV_PROTECT_STEP = "RTJ_PROTECT_STEP"

_NUMBER = re.compile(r"^[0-9]+$")


@dataclass(frozen=True)
class Metric:
    """A step's score as the trainer recorded it: lower is better for mode "min"."""

    name: str
    mode: str  # "min" or "max"
    value: float


@dataclass(frozen=True)
class StepState:
    name: StepDirName
    verified: bool
    reason: str = ""
    metric: Metric | None = None


@dataclass(frozen=True)
class RetentionPolicy:
    keep_last: int
    keep_every: int | None = None
    protect: frozenset[int] = field(default_factory=frozenset)
    keep_best: int = 0  # verified steps with the best metric named best_metric
    best_metric: str | None = None  # None: the metric of the newest step that has one

    def __post_init__(self) -> None:
        if self.keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {self.keep_last}")
        if self.keep_every is not None and self.keep_every < 1:
            raise ValueError(f"keep_every must be >= 1, got {self.keep_every}")
        if self.keep_best < 0:
            raise ValueError(f"keep_best must be >= 0, got {self.keep_best}")


def metric_of(extra: Mapping[str, object]) -> Metric | None:
    """The metric a manifest's ``extra`` records (``{"name", "mode", "value"}``), if any
    and well formed with a finite value; anything else counts as no metric."""
    raw = extra.get("metric")
    if not isinstance(raw, Mapping):
        return None
    name, mode, value = raw.get("name"), raw.get("mode"), raw.get("value")
    if not isinstance(name, str) or mode not in ("min", "max"):
        return None
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    if not math.isfinite(value):
        return None
    return Metric(name, str(mode), float(value))


def best_steps(verified: list[StepState], policy: RetentionPolicy) -> dict[int, str]:
    """The ``keep_best`` verified steps with the best metric, with the reason to keep each.
    Ranked by the mode of the newest step that has the metric; ties keep the newer step."""
    scored = sorted(
        ((s.name.step, s.metric) for s in verified if s.metric is not None), reverse=True
    )
    if policy.keep_best <= 0 or not scored:
        return {}
    name = policy.best_metric or scored[0][1].name
    scored = [(step, m) for step, m in scored if m.name == name]
    if not scored:
        return {}
    mode = scored[0][1].mode
    sign = 1.0 if mode == "min" else -1.0
    ranked = sorted(scored, key=lambda row: (sign * row[1].value, -row[0]))
    why = f"among the best {policy.keep_best} by {name} ({mode})"
    return {step: why for step, _ in ranked[: policy.keep_best]}


def _number(name: str, text: str, minimum: int) -> int:
    value = int(text) if _NUMBER.match(text) else -1
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {text!r}")
    return value


def policy_from_env(env: Mapping[str, str]) -> RetentionPolicy | None:
    """The policy in ``env``; None (keep everything) when ``RTJ_KEEP_LAST`` is unset or empty.

    ``RTJ_PROTECT_STEP`` holds one step, or several separated by commas. A value that is not
    what the operator renders raises ValueError naming the variable.
    """
    keep_last = env.get(ENV_KEEP_LAST, "").strip()
    if not keep_last:
        return None
    every = env.get(ENV_KEEP_EVERY, "").strip()
    protect: set[int] = set()
    for part in env.get(ENV_PROTECT_STEP, "").split(","):
        if part.strip():
            step = _number(ENV_PROTECT_STEP, part.strip(), 0)
            if step > MAX_STEP:
                raise ValueError(f"{ENV_PROTECT_STEP} must be a step <= {MAX_STEP}, got {step}")
            protect.add(step)
    return RetentionPolicy(
        keep_last=_number(ENV_KEEP_LAST, keep_last, 1),
        keep_every=_number(ENV_KEEP_EVERY, every, 1) if every else None,
        protect=frozenset(protect),
    )


@dataclass(frozen=True)
class Decision:
    name: StepDirName
    reason: str


@dataclass(frozen=True)
class RetentionPlan:
    keep: tuple[Decision, ...]
    delete: tuple[Decision, ...]

    def to_json(self) -> dict[str, object]:
        def rows(ds: tuple[Decision, ...]) -> list[dict[str, object]]:
            return [{"step": d.name.step, "dir": str(d.name), "reason": d.reason} for d in ds]

        return {"keep": rows(self.keep), "delete": rows(self.delete)}


def _keep_reason(
    step: int, rank: int, newest: int, policy: RetentionPolicy, best: dict[int, str]
) -> str | None:
    if step == newest:
        return "newest verified step"
    if step in policy.protect:
        return "protected"
    if step in best:
        return best[step]
    if rank < policy.keep_last:
        return f"among the newest {policy.keep_last} verified steps"
    if rank == 1:
        return "previous verified step (fallback for the newest)"
    if policy.keep_every is not None and step % policy.keep_every == 0:
        return f"milestone (every {policy.keep_every} steps)"
    return None


def plan_retention(states: Iterable[StepState], policy: RetentionPolicy) -> RetentionPlan:
    states = sorted(states, key=lambda s: (s.name.step, s.name.attempt or ""), reverse=True)
    verified = [s for s in states if s.verified and not s.name.in_progress]
    newest = verified[0].name.step if verified else None
    rank_of = {s.name.step: i for i, s in enumerate(verified)}
    best = best_steps(verified, policy)
    keep: list[Decision] = []
    delete: list[Decision] = []
    for state in states:
        step = state.name.step
        if state in verified:
            assert newest is not None
            reason = _keep_reason(step, rank_of[step], newest, policy, best)
            if reason is None:
                delete.append(Decision(state.name, "verified, beyond the retention policy"))
            else:
                keep.append(Decision(state.name, reason))
        elif step in policy.protect:
            keep.append(Decision(state.name, "protected"))
        elif newest is None or step > newest:
            keep.append(
                Decision(
                    state.name,
                    "not verified but newer than every verified step; may still be in progress",
                )
            )
        else:
            what = "in progress" if state.name.in_progress else f"not verified ({state.reason})"
            delete.append(Decision(state.name, f"{what}, older than newest verified step {newest}"))
    return RetentionPlan(tuple(keep), tuple(delete))


def merged_retention(
    env: RetentionPolicy | None, keep_last: int | None, keep_best: int, monitor: str | None
) -> RetentionPolicy | None:
    """The operator's policy (environment) first; ``keep_last`` in code applies when the
    environment sets none (a local run); ``keep_best`` protects the best steps in either."""
    policy = env if env is not None else (None if keep_last is None else RetentionPolicy(keep_last))
    if policy is None or keep_best <= 0:
        return policy
    if monitor is None:
        raise ValueError(f"keep_best={keep_best} needs monitor=NAME: the metric the best are "
                         "kept by")  # fmt: skip
    return dataclasses.replace(policy, keep_best=keep_best, best_metric=monitor)
