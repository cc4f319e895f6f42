"""The goodput model's arithmetic (bench/goodput_model.py)."""

from __future__ import annotations

import pytest

from bench.goodput_model import (
    BASELINE,
    FAST_SAVE_STALL,
    FAULT_MIX,
    GPU_SHARE,
    IN_PLACE_SHARE,
    LLAMA3_DAYS,
    LLAMA3_GPUS,
    LLAMA3_INTERRUPTIONS,
    OURS_NOW,
    Stack,
    best_fast_interval,
    fast_tier_break_even,
    interruptions_per_hour,
    report,
    stages,
    with_fast_tier,
)


def test_the_failure_rate_is_llama3s_scaled_by_gpus() -> None:
    at_16k = interruptions_per_hour(LLAMA3_GPUS)
    assert at_16k == pytest.approx(LLAMA3_INTERRUPTIONS / (LLAMA3_DAYS * 24))
    assert interruptions_per_hour(LLAMA3_GPUS // 2) == pytest.approx(at_16k / 2)
    assert sum(FAULT_MIX.values()) == pytest.approx(1.0)


def test_goodput_is_one_minus_lost_time_minus_stalls() -> None:
    stack = Stack("x", {k: 10.0 for k in FAULT_MIX}, recovery=20.0, startup=30.0,
                  restore=0.0, checkpoint_interval=120.0, stall_fraction=0.02)  # fmt: skip
    assert stack.lost_per_interruption() == pytest.approx(10 + 20 + 30 + 60)
    # one interruption an hour costs 120 s of 3600
    assert stack.goodput(1.0) == pytest.approx(1 - 120 / 3600 - 0.02)


def test_only_the_interruptions_that_implicate_no_node_restart_in_place() -> None:
    stack = Stack("x", {k: 10.0 for k in FAULT_MIX}, recovery=20.0, startup=30.0,
                  restore=0.0, checkpoint_interval=120.0, stall_fraction=0.0,
                  in_place_share={"hang": 1.0}, in_place_recovery=1.0, in_place_startup=5.0,
                  in_place_restore=2.0, fast_interval=12.0)  # fmt: skip
    share = FAULT_MIX["hang"]
    assert stack.share() == pytest.approx(share)
    whole, in_place = 20 + 30 + 0 + 60, 1 + 5 + 2 + 6
    assert stack.lost_per_interruption() == pytest.approx(
        10 + (1 - share) * whole + share * in_place
    )
    # the crashes that are not GPU faults, and every hang; a lost node or maintenance: none
    assert IN_PLACE_SHARE["crash"] == pytest.approx(1 - GPU_SHARE / FAULT_MIX["crash"], abs=1e-3)
    assert (IN_PLACE_SHARE["hang"], IN_PLACE_SHARE["silent_node_loss"]) == (1.0, 0.0)


def test_each_stage_against_the_one_before_and_the_fast_tiers_break_even() -> None:
    rate = interruptions_per_hour(10_000)
    ours, in_place, fast, upper = stages()
    assert ours is OURS_NOW and ours.goodput(rate) > BASELINE.goodput(rate)
    assert in_place.goodput(rate) > ours.goodput(rate)
    assert upper.goodput(rate) > max(in_place.goodput(rate), fast.goodput(rate))
    # the fast tier pays exactly when its own stall is under what it saves
    assert fast.fast_interval == pytest.approx(60.0)
    stall = FAST_SAVE_STALL / fast.fast_interval
    assert fast.stall_fraction == pytest.approx(OURS_NOW.stall_fraction + stall)
    pays = fast.goodput(rate) > in_place.goodput(rate)
    assert pays == (stall < fast_tier_break_even(fast, rate))
    best = best_fast_interval(fast, rate)
    tuned = with_fast_tier(in_place, best, "tuned").goodput(rate)
    for other in (best * 0.7, best * 1.4, 60.0):
        assert tuned >= with_fast_tier(in_place, other, "other").goodput(rate)
    assert "| **" in report(10_000)
