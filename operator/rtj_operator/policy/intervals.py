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

* :func:`choose`: `status.checkpointIntervals` for a job with `plannedIntervalSeconds: auto`,
  from the platform's :class:`IntervalPolicy`, the job's size, its failures and hours, and the
  slowest rank's measured durable save cost (:func:`durable_cost`, the trainers' word, bounded
  by the platform's floor and ceiling); None while the interval in status stands.

Not yet: the fast tier's `everySteps: auto` (its ranks must switch at one step), and the
failure rate of the job's node pool as evidence beside the job's own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rtj_operator.api.intervals import CheckpointIntervals
from rtj_operator.api.status import RestartCounts
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

    def __post_init__(self) -> None:
        for name in ("prior_failures_per_node_hour", "prior_weight_hours", "assumed_save_seconds"):
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


def durable_cost(reports: Sequence[PodReport]) -> float | None:
    """The slowest rank's average seconds held by a durable save (every rank waits for it);
    None before any rank reported one. A malformed entry is skipped (the tenant's word)."""
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
            if (tier := parsed.tiers.get(SaveTier.DURABLE)) is not None:
                costs.append(tier.seconds)
    return max(costs) if costs else None


CHANGE = 0.1
"""A new interval within this share of the one in status leaves it standing (the trainers
are not sent a new one for noise)."""


def choose(
    policy: IntervalPolicy,
    *,
    pods: int,
    failures: int,
    exposure_hours: float,
    measured_cost: float | None,
    current: CheckpointIntervals | None,
    now: datetime,
) -> CheckpointIntervals | None:
    """The intervals to put in status; None while `current` stands (the same failures seen,
    the same kind of cost, and an interval within `CHANGE` of it)."""
    rate = failure_rate(policy.prior(pods), failures, exposure_hours)
    cost = policy.assumed_save_seconds if measured_cost is None else max(measured_cost, 1e-3)
    seconds = daly_interval(cost, HOUR / rate)
    durable = int(min(max(round(seconds), policy.min_seconds), policy.max_seconds))
    if (
        current is not None
        and current.failures == failures
        and current.save_cost_measured == (measured_cost is not None)
        and abs(durable - current.durable_seconds) <= CHANGE * current.durable_seconds
    ):
        return None
    return CheckpointIntervals(
        durable_seconds=durable,
        failures_per_hour=rate,
        failures=failures,
        exposure_hours=exposure_hours,
        durable_save_seconds=cost,
        save_cost_measured=measured_cost is not None,
        chosen_at=now,
    )


def planned_seconds(
    spec_value: int | str, chosen: CheckpointIntervals | None, policy_max: int
) -> int:
    """The durable interval a job plans: its own seconds, or what `auto` chose (before any
    choice: the platform's ceiling, so the age alert does not fire on a job just created)."""
    if isinstance(spec_value, int):
        return spec_value
    return chosen.durable_seconds if chosen is not None else policy_max
