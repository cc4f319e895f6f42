"""Checkpoint intervals from the failure rate (issue 48, `policy.intervals`): Daly's optimum
against a brute-force minimum of the expected loss, the gamma-Poisson rate between its prior
and the evidence, and the tiers each against the failures they recover from."""

from __future__ import annotations

import math

import pytest

from rtj_operator.policy.intervals import (
    HOUR,
    Prior,
    daly_interval,
    failure_rate,
    tier_intervals,
)


def expected_wall(tau: float, cost: float, mtbf: float, work: float = 1e6) -> float:
    """Daly's model (FGCS 2006, eq. 20, restart cost 0): the expected wall time of `work`
    seconds of training saved every `tau` seconds at `cost` s, failures at mean `mtbf`."""
    return mtbf * (math.exp((tau + cost) / mtbf) - 1) * work / tau  # e^(R/M) = 1 at R = 0


@pytest.mark.parametrize(("cost", "mtbf"), [(0.5, 3600.0), (10.0, 2910.0), (60.0, 1800.0),
                                            (5.0, 18000.0), (300.0, 1200.0)])  # fmt: skip
def test_the_interval_is_where_the_expected_wall_time_is_least(cost: float, mtbf: float) -> None:
    best = min((expected_wall(t, cost, mtbf), t) for t in (x * 0.25 for x in range(1, 40000)))
    chosen = daly_interval(cost, mtbf)
    # Daly's estimate is within a fraction of a percent of the true optimum's wall time
    assert expected_wall(chosen, cost, mtbf) <= best[0] * 1.001, (chosen, best[1])
    assert chosen == pytest.approx(best[1], rel=0.05)
    # and Young's first-order term is its leading part
    assert chosen == pytest.approx(math.sqrt(2 * cost * mtbf), rel=0.25 if cost > 50 else 0.05)


def test_a_save_as_long_as_the_failures_are_frequent_saves_once_per_failure() -> None:
    assert daly_interval(100.0, 40.0) == 40.0
    for cost, mtbf, field in ((0.0, 10.0, "cost"), (1.0, -1.0, "mtbf"), (math.nan, 1.0, "cost")):
        with pytest.raises(ValueError, match=field):
            daly_interval(cost, mtbf)


def test_the_rate_moves_from_the_prior_to_the_evidence() -> None:
    prior = Prior(per_hour=0.2, weight_hours=10.0)
    assert failure_rate(prior, 0, 0.0) == pytest.approx(0.2)  # nothing seen: the prior
    # one failure in the first six minutes: moved, not to ten an hour
    early = failure_rate(prior, 1, 0.1)
    assert 0.2 < early < 0.3
    # a month on a quiet pool: near the observed 0.01 an hour, far below the prior
    assert failure_rate(prior, 7, 720.0) == pytest.approx((2 + 7) / 730.0)
    assert failure_rate(prior, 7, 720.0) < 0.02
    with pytest.raises(ValueError, match="failures"):
        failure_rate(prior, -1, 1.0)
    with pytest.raises(ValueError, match="weight_hours"):
        Prior(per_hour=0.2, weight_hours=0.0)


def test_each_tier_is_set_against_the_failures_it_recovers_from() -> None:
    # one failure every 48.5 min (Meta's 1,024-GPU MTTF scaled to 10k GPUs), 60 s durable
    # saves, 2 s fast ones covering 80% of failures (a rank or a GPU, not a lost host)
    per_hour = HOUR / (48.5 * 60)
    both = tier_intervals(per_hour, durable_cost=60.0, fast_cost=2.0, fast_covers=0.8)
    assert both.mtbf == pytest.approx(48.5 * 60)
    assert both.fast == pytest.approx(daly_interval(2.0, both.mtbf / 0.8))
    assert both.durable == pytest.approx(daly_interval(60.0, both.mtbf / 0.2))
    assert both.fast is not None and both.fast < both.durable
    alone = tier_intervals(per_hour, durable_cost=60.0, fast_cost=None, fast_covers=0.8)
    assert alone.fast is None and alone.durable == pytest.approx(daly_interval(60.0, both.mtbf))
    assert alone.durable < both.durable  # alone, it recovers from every failure
    # more failures: shorter intervals, by about the square root
    worse = tier_intervals(per_hour * 4, 60.0, 2.0, 0.8)
    assert worse.fast is not None
    assert worse.fast == pytest.approx(both.fast / 2, rel=0.05)
    with pytest.raises(ValueError, match="fast_covers"):
        tier_intervals(per_hour, 60.0, 2.0, 1.0)
