"""The agreement's cadence (`rtj_shim.torch.agreement.cadence`): how many boundaries pass
between two reductions, from the agreed step time alone (so every rank computes the same)."""

from __future__ import annotations

import math

from hypothesis import example, given
from hypothesis import strategies as st

from rtj_shim.torch import agreement
from rtj_shim.torch.agreement import AGREE_PERIOD_S, MAX_CADENCE, cadence


def test_short_steps_reduce_every_few_boundaries_long_ones_at_each() -> None:
    assert cadence(0.020) == math.ceil(AGREE_PERIOD_S / 0.020)
    assert cadence(1.0) == 1 and cadence(AGREE_PERIOD_S) == 1
    assert cadence(1e-6) == MAX_CADENCE
    for unknown in (0.0, -1.0, math.nan, math.inf):
        assert cadence(unknown) == 1, "nothing known: reduce at the next boundary"


@given(st.floats(allow_nan=True, allow_infinity=True))
@example(5e-324)  # subnormal: the period over it overflows to infinity (CI, stop 53)
def test_the_cadence_is_always_between_one_and_the_cap(step_s: float) -> None:
    assert 1 <= cadence(step_s) <= agreement.MAX_CADENCE
