"""The goodput model's arithmetic (bench/goodput_model.py)."""

from __future__ import annotations

import pytest

from bench.goodput_model import (
    BASELINE,
    FAULT_MIX,
    LLAMA3_DAYS,
    LLAMA3_GPUS,
    LLAMA3_INTERRUPTIONS,
    Stack,
    interruptions_per_hour,
    report,
    stages,
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


def test_every_stage_is_at_least_as_good_as_the_one_before_and_the_baseline() -> None:
    rate = interruptions_per_hour(10_000)
    figures = [s.goodput(rate) for s in stages()]
    assert figures == sorted(figures)
    assert figures[0] > BASELINE.goodput(rate)
    assert "| **" in report(10_000)
