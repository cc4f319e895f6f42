"""rtj_shim.integrity: the anomaly guard (no false positive over long fault-free series,
every corrupted value caught) and the odd-ranks vote."""

from __future__ import annotations

import math
import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rtj_shim.integrity import AnomalyGuard, odd_ranks


def _loss_curve(seed: int, steps: int) -> list[float]:
    """A training loss as runs show it: fast early descent to a plateau, multiplicative
    noise, and now and then a batch a few times harder than the rest."""
    rng = random.Random(seed)
    out = []
    for t in range(steps):
        level = 2.0 + 8.0 * math.exp(-t / 800)
        hard = 1.0 + (2.0 * rng.random() if rng.random() < 0.002 else 0.0)
        out.append(level * hard * math.exp(rng.gauss(0.0, 0.08)))
    return out


def _grad_norm_curve(seed: int, steps: int) -> list[float]:
    rng = random.Random(seed)
    return [(0.5 + 3.0 * math.exp(-t / 300)) * math.exp(rng.gauss(0.0, 0.25)) for t in range(steps)]


def _flip(value: float, bit: int) -> float:
    """`value` as float32 with one bit flipped."""
    (word,) = struct.unpack("<I", struct.pack("<f", value))
    (flipped,) = struct.unpack("<f", struct.pack("<I", word ^ (1 << bit)))
    return float(flipped)


@pytest.mark.parametrize("seed", range(3))
def test_no_false_positive_over_ten_thousand_fault_free_steps(seed: int) -> None:
    guard = AnomalyGuard()
    losses, norms = _loss_curve(seed, 10_000), _grad_norm_curve(seed, 10_000)
    flagged = [
        found
        for step, (loss, norm) in enumerate(zip(losses, norms, strict=True))
        for found in (guard.observe(step, "loss", loss), guard.observe(step, "grad_norm", norm))
        if found is not None
    ]
    assert flagged == []


@pytest.mark.parametrize("bit", [30, 29, 28, 27, 26])  # the exponent's high bits
def test_a_flipped_exponent_bit_in_the_loss_is_caught_the_step_it_shows(bit: int) -> None:
    guard = AnomalyGuard()
    losses = _loss_curve(7, 3000)
    for step, loss in enumerate(losses[:2999]):
        assert guard.observe(step, "loss", loss) is None
    corrupted = _flip(losses[2999], bit)
    found = guard.observe(2999, "loss", corrupted)
    assert found is not None and found.step == 2999 and found.signal == "loss"
    assert f"loss {corrupted:.6g} at step 2999" in found.describe()


def test_nothing_is_judged_before_the_warmup_and_a_flagged_value_stays_out_of_the_window() -> None:
    guard = AnomalyGuard(window=16, warmup=8)
    assert all(guard.observe(s, "loss", v) is None for s, v in enumerate([1.0, 900.0, 1.0]))
    steady = AnomalyGuard(window=16, warmup=8)
    for s in range(8):
        steady.observe(s, "loss", 1.0 + 0.01 * (s % 3))
    assert steady.observe(8, "loss", 50.0) is not None
    assert steady.observe(9, "loss", 50.0) is not None, "the outlier did not become normal"
    assert steady.observe(10, "loss", float("nan")) is None  # the non-finite guard's job


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"window": 4}, "window"), ({"warmup": 0}, "warmup"), ({"warmup": 300}, "warmup"),
     ({"threshold": 0.0}, "threshold"), ({"floor": 0.0}, "floor")],
)  # fmt: skip
def test_bad_settings_name_the_field(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=rf"AnomalyGuard\({field}="):
        AnomalyGuard(**kwargs)  # type: ignore[arg-type]


def test_the_odd_ranks_are_those_outside_a_strict_majority() -> None:
    assert odd_ranks(["a", "a", "a"]) == []
    assert odd_ranks(["a", "a", "b", "a"]) == [2]
    assert odd_ranks(["b", "a", "a"]) == [0]
    assert odd_ranks(["a", "b"]) == [0, 1], "two ranks: either may compute wrong"
    assert odd_ranks(["a", "a", "b", "b"]) == [0, 1, 2, 3]
    assert odd_ranks([]) == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from("abc"), min_size=1, max_size=9))
def test_the_majority_is_never_named(values: list[str]) -> None:
    odd = odd_ranks(values)
    majority = [v for v in set(values) if 2 * values.count(v) > len(values)]
    if majority:
        assert all(values[r] != majority[0] for r in odd)
        assert len(odd) == len(values) - values.count(majority[0])
    elif len(set(values)) > 1:
        assert odd == list(range(len(values)))
