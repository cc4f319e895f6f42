"""Checkpoint intervals chosen from the failure rate (issue 48, deliverable 3). Pure.

* :func:`daly_interval`: the compute time between two checkpoints that loses the least to
  saves and to work redone, for a save that costs ``cost`` seconds and failures arriving at
  a mean ``mtbf`` (Daly, "A higher order estimate of the optimum checkpoint interval for
  restart dumps", FGCS 22(3), 2006, eq. 37; Young's first-order sqrt(2 cost mtbf), 1974, is
  its leading term).
* :func:`failure_rate`: failures per hour from what a job (and its node pool) has seen, a
  gamma-Poisson estimate that starts at the platform's prior and moves to the observed
  rate as exposure accumulates, so one failure in a job's first minutes does not make it
  save every few seconds, and a job that has run a month on a quiet pool is not held to a
  pessimistic prior.
* :func:`tier_intervals`: per tier, each interval against the failures that tier is the one
  to recover from: the fast tier (pod memory, peer replica) against every failure it covers,
  the durable tier against those it does not (a lost pod without a replica, a whole world).

* :func:`choose`: `status.checkpointIntervals` for a job with `plannedIntervalSeconds: auto`
  or `fastTier.everySteps: auto`, from the platform's :class:`IntervalPolicy`, the job's size,
  its failures and hours, the slowest rank's measured save costs (:func:`save_cost`, the
  trainers' word, bounded by the platform's floor and ceiling) and its step time; None while
  the intervals in status stand. The fast interval is in steps and takes effect at restarts
  (:func:`auto_fast_every`: every rank must hold the same fast steps).

Not yet: the failure rate of the job's node pool as evidence beside the job's own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal

from rtj_operator.api.intervals import CheckpointIntervals
from rtj_operator.api.resource import ResilientTrainingJob
from rtj_operator.api.status import ResilientTrainingJobStatus, RestartCounts
from rtj_operator.policy.progress import PodReport
from rtj_shim.wire.save_costs import SaveCosts, SaveCostsError, SaveTier

HOUR = 3600.0


def daly_interval(cost: float, mtbf: float) -> float:
    """Seconds of training between saves (not counting the save) for a save of `cost` s and
    a mean time between failures of `mtbf` s. Raises ValueError naming a bad input."""
    if not math.isfinite(cost) or cost <= 0:
        raise ValueError(f"cost: expected seconds > 0, got {cost!r}")
    if not math.isfinite(mtbf) or mtbf <= 0:
        raise ValueError(f"mtbf: expected seconds > 0, got {mtbf!r}")
    if cost >= 2 * mtbf:
        return mtbf  # a save as long as the failures are frequent: save once per failure
    r = cost / (2 * mtbf)
    return math.sqrt(2 * cost * mtbf) * (1 + math.sqrt(r) / 3 + r / 9) - cost


@dataclass(frozen=True)
class Prior:
    """The platform's belief before a job has run: `per_hour` failures an hour for a job of
    this size, worth `weight_hours` of observation (how slowly evidence moves it)."""

    per_hour: float
    weight_hours: float

    def __post_init__(self) -> None:
        if not math.isfinite(self.per_hour) or self.per_hour <= 0:
            raise ValueError(f"per_hour: expected failures an hour > 0, got {self.per_hour!r}")
        if not math.isfinite(self.weight_hours) or self.weight_hours <= 0:
            raise ValueError(f"weight_hours: expected hours > 0, got {self.weight_hours!r}")


def failure_rate(prior: Prior, failures: int, exposure_hours: float) -> float:
    """Failures an hour: the posterior mean of a Poisson rate under a gamma prior of mean
    `prior.per_hour` and `prior.weight_hours` hours of pseudo-exposure, after `failures` in
    `exposure_hours` of running."""
    if failures < 0:
        raise ValueError(f"failures: expected a count >= 0, got {failures!r}")
    if not math.isfinite(exposure_hours) or exposure_hours < 0:
        raise ValueError(f"exposure_hours: expected hours >= 0, got {exposure_hours!r}")
    pseudo = prior.per_hour * prior.weight_hours
    return (pseudo + failures) / (prior.weight_hours + exposure_hours)


@dataclass(frozen=True)
class Intervals:
    """Seconds of training between saves, per tier (None: the job has no such tier)."""

    durable: float
    fast: float | None
    mtbf: float
    """The mean time between failures they were chosen for (all failures, seconds)."""


def tier_intervals(
    per_hour: float, durable_cost: float, fast_cost: float | None, fast_covers: float
) -> Intervals:
    """The intervals for failures at `per_hour`, of which a share `fast_covers` the fast tier
    recovers from (the durable tier: the rest); `fast_cost` None or nothing covered: no fast
    interval."""
    if not math.isfinite(per_hour) or per_hour <= 0:
        raise ValueError(f"per_hour: expected failures an hour > 0, got {per_hour!r}")
    if not 0.0 <= fast_covers < 1.0:
        raise ValueError(
            f"fast_covers: expected a share in [0, 1) (some failure always needs the durable "
            f"tier: a lost pod without a replica, a whole world), got {fast_covers!r}"
        )
    mtbf = HOUR / per_hour
    if fast_cost is None or fast_covers == 0:  # the durable tier recovers from every failure
        return Intervals(daly_interval(durable_cost, mtbf), None, mtbf)
    durable = daly_interval(durable_cost, mtbf / (1.0 - fast_covers))
    return Intervals(durable, daly_interval(fast_cost, mtbf / fast_covers), mtbf)


class IntervalConfigError(ValueError):
    """The platform's `checkpointIntervals` block is malformed; the message names the field."""


@dataclass(frozen=True)
class IntervalPolicy:
    """The platform's settings for `plannedIntervalSeconds: auto` (operator configuration,
    the chart's `checkpointIntervals` values)."""

    prior_failures_per_node_hour: float = 0.001
    """Before a job's own evidence: about Meta's published 7.9 h mean time to failure of a
    1,024-GPU job (128 nodes of 8 GPUs: 1 / (7.9 x 128) = 0.00099 per node-hour)."""
    prior_weight_hours: float = 24.0
    """How many hours of the job's own running the prior is worth."""
    assumed_save_seconds: float = 10.0
    """A durable save's cost before the trainers measured one."""
    min_seconds: int = 30
    max_seconds: int = 6 * 3600
    assumed_fast_save_seconds: float = 0.5
    """A fast-tier save's cost before the trainers measured one."""
    fast_tier_covers: float = 0.8
    """The share of failures a job's fast tier recovers from (a rank's process or a pod lost,
    the state in the pod's memory or its peer replica) against those only the durable tier
    does (a whole world, two pods at once): an assumption, stated in status."""

    def __post_init__(self) -> None:
        if (
            isinstance(self.fast_tier_covers, bool)
            or not isinstance(self.fast_tier_covers, int | float)
            or not 0 <= self.fast_tier_covers < 1
        ):
            raise IntervalConfigError(
                "checkpointIntervals.fastTierCovers: expected a share in [0, 1), got "
                f"{self.fast_tier_covers!r}"
            )
        for name in ("prior_failures_per_node_hour", "prior_weight_hours",
                     "assumed_save_seconds", "assumed_fast_save_seconds"):  # fmt: skip
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not (math.isfinite(value) and value > 0)
            ):
                raise IntervalConfigError(
                    f"checkpointIntervals.{_camel(name)}: expected a number > 0, got {value!r}"
                )
        for name in ("min_seconds", "max_seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise IntervalConfigError(
                    f"checkpointIntervals.{_camel(name)}: expected seconds >= 1, got {value!r}"
                )
        if self.min_seconds > self.max_seconds:
            raise IntervalConfigError(
                f"checkpointIntervals.minSeconds ({self.min_seconds}) is above maxSeconds "
                f"({self.max_seconds})"
            )

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> IntervalPolicy:
        """From the `checkpointIntervals` block of the platform configuration."""
        names = {_camel(n): n for n in cls.__dataclass_fields__}
        unknown = sorted(set(raw) - set(names))
        if unknown:
            raise IntervalConfigError(
                f"checkpointIntervals: unknown field(s) {', '.join(unknown)}; expected "
                f"{sorted(names)}"
            )
        return cls(**{names[k]: v for k, v in raw.items()})

    def prior(self, pods: int) -> Prior:
        """The prior for a job of `pods` nodes."""
        return Prior(self.prior_failures_per_node_hour * max(pods, 1), self.prior_weight_hours)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.capitalize() for w in rest)


def work_losing_failures(restarts: RestartCounts) -> int:
    """The failures that cost the job the work since its last save: restarts after
    infrastructure (not preemptions: they save on SIGTERM), user and suspect-state faults."""
    infrastructure = max(restarts.infrastructure - restarts.preemption, 0)
    return infrastructure + restarts.user + restarts.silent_data_corruption


def save_cost(reports: Sequence[PodReport], tier: SaveTier) -> float | None:
    """The slowest rank's average seconds held by a save of `tier` (every rank waits for
    it); None before any rank reported one. A malformed entry is skipped (the tenant's word)."""
    costs: list[float] = []
    for report in reports:
        ranks = report.body.get("ranks")
        for entry in ranks if isinstance(ranks, list) else ():
            raw = entry.get("save_costs") if isinstance(entry, Mapping) else None
            if raw is None:
                continue
            try:
                parsed = SaveCosts.parse({"schema": 1, "pid": 0, "tiers": raw})
            except SaveCostsError:
                continue
            if (cost := parsed.tiers.get(tier)) is not None:
                costs.append(cost.seconds)
    return max(costs) if costs else None


def durable_cost(reports: Sequence[PodReport]) -> float | None:
    """`save_cost` of the durable tier."""
    return save_cost(reports, SaveTier.DURABLE)


@dataclass(frozen=True)
class Measured:
    """What the job's trainers measured (None: not yet)."""

    durable_cost: float | None = None
    fast_cost: float | None = None
    step_seconds: float | None = None


FastTierUse = Literal["none", "fixed", "auto"]
"""The job's fast tier: none, its own `everySteps`, or `everySteps: auto`."""

CHANGE = 0.1
"""A new interval within this share of the one in status leaves it standing (the trainers
are not sent a new one for noise)."""
MAX_FAST_EVERY = 1_000_000
AUTO_FAST_EVERY_START = 50
"""`everySteps: auto`'s steps before the operator measured a step (a new world's first)."""


def choose(
    policy: IntervalPolicy,
    *,
    pods: int,
    failures: int,
    exposure_hours: float,
    measured: Measured,
    current: CheckpointIntervals | None,
    now: datetime,
    fast_tier: FastTierUse = "none",
) -> CheckpointIntervals | None:
    """The intervals to put in status; None while `current` stands (the same failures seen,
    the same costs measured, and intervals within `CHANGE` of it). With a fast tier the
    durable interval is chosen against the failures it does not cover (`tier_intervals`)."""
    measured = carried_over(measured, current)
    rate = failure_rate(policy.prior(pods), failures, exposure_hours)
    durable_cost = _cost(measured.durable_cost, policy.assumed_save_seconds)
    fast_cost = covers = fast_seconds = fast_every = None
    if fast_tier == "none":
        seconds = daly_interval(durable_cost, HOUR / rate)
    else:
        covers = policy.fast_tier_covers
        fast_cost = _cost(measured.fast_cost, policy.assumed_fast_save_seconds)
        tiers = tier_intervals(rate, durable_cost, fast_cost, covers)
        seconds, fast_seconds = tiers.durable, tiers.fast
        step = measured.step_seconds
        if fast_tier == "auto" and fast_seconds is not None and step is not None and step > 0:
            fast_every = int(min(max(round(fast_seconds / step), 1), MAX_FAST_EVERY))
    durable = int(min(max(round(seconds), policy.min_seconds), policy.max_seconds))
    if current is not None and _stands(current, failures, measured, durable, fast_every):
        return None
    return CheckpointIntervals(
        durable_seconds=durable, failures_per_hour=rate, failures=failures,
        exposure_hours=exposure_hours, durable_save_seconds=durable_cost,
        save_cost_measured=measured.durable_cost is not None, fast_every_steps=fast_every,
        fast_seconds=fast_seconds, fast_save_seconds=fast_cost, fast_covers=covers,
        fast_save_cost_measured=None if fast_tier == "none" else measured.fast_cost is not None,
        chosen_at=now,
    )  # fmt: skip


def carried_over(measured: Measured, current: CheckpointIntervals | None) -> Measured:
    """A measured save cost outlives the processes that measured it: restarted trainers (in
    place, or a new attempt) report none until their first save, and that save comes at the
    interval chosen from the cost, so the platform's assumption (10 s for a durable save,
    0.5 s for a fast one, by default) would set it again, several times too long for a cheap
    save (and a restart's fast interval is sent with its run order). Each tier's cost in
    status stands until the new trainers measure theirs."""
    if current is None:
        return measured
    if measured.durable_cost is None and current.save_cost_measured:
        measured = replace(measured, durable_cost=current.durable_save_seconds)
    if measured.fast_cost is None and current.fast_save_cost_measured:
        measured = replace(measured, fast_cost=current.fast_save_seconds)
    return measured


def _cost(measured: float | None, assumed: float) -> float:
    return assumed if measured is None else max(measured, 1e-3)


def _near(new: int | None, old: int | None) -> bool:
    if new is None or old is None:
        return new == old
    return abs(new - old) <= CHANGE * old


def _stands(
    current: CheckpointIntervals,
    failures: int,
    measured: Measured,
    durable: int,
    fast_every: int | None,
) -> bool:
    same_evidence = (
        current.failures == failures
        and current.save_cost_measured == (measured.durable_cost is not None)
        and bool(current.fast_save_cost_measured) == (measured.fast_cost is not None)
    )
    return (
        same_evidence
        and _near(durable, current.durable_seconds)
        and _near(fast_every, current.fast_every_steps)
    )


def auto_fast_every(rtj: ResilientTrainingJob, status: ResilientTrainingJobStatus) -> int | None:
    """The fast interval `everySteps: auto` chose (None: not auto, or none chosen yet)."""
    tier = rtj.spec.checkpoint.fast_tier
    chosen = status.checkpoint_intervals
    if tier is None or not tier.auto_every or chosen is None:
        return None
    return chosen.fast_every_steps


def planned_seconds(
    spec_value: int | str, chosen: CheckpointIntervals | None, policy_max: int
) -> int:
    """The durable interval a job plans: its own seconds, or what `auto` chose (before any
    choice: the platform's ceiling, so the age alert does not fire on a job just created)."""
    if isinstance(spec_value, int):
        return spec_value
    return chosen.durable_seconds if chosen is not None else policy_max
