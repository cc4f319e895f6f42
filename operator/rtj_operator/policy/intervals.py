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

What it is not yet: nothing calls it. `checkpoint.plannedIntervalSeconds: auto`, the trainers'
measured save costs as input, the hand-off to the trainers and the status field are the
rest of the deliverable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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
