"""The goodput model's elastic path (bench/goodput_elastic.py): never worse than waiting,
the same when capacity returns within the wait, and the arithmetic the report prints."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.goodput_elastic import ElasticPath, section
from bench.goodput_inputs import WORLD_PODS, interruptions_per_hour
from bench.goodput_model import report
from bench.goodput_stacks import stages

PEER = stages()[-1]
RATE = interruptions_per_hour(10_000)


@given(st.floats(0, 7 * 24 * 3600), st.floats(0.01, 1))
def test_shrinking_loses_less_than_waiting_exactly_past_the_break_even(
    wait: float, share: float
) -> None:
    path = ElasticPath(PEER)
    elastic = path.goodput(RATE, share, wait, elastic=True)
    idle = path.goodput(RATE, share, wait, elastic=False)
    if wait <= path.wait_for_replacement:
        assert path.lost(wait) == wait and elastic == idle
    elif wait < path.break_even() - 1e-6:
        assert path.lost(wait) > wait  # back soon: the shrink and grow-back cost more
    elif wait > path.break_even() + 1e-6:
        assert path.lost(wait) < wait and elastic > idle


def test_capacity_back_within_the_wait_changes_nothing() -> None:
    path = ElasticPath(PEER)
    assert path.lost(20.0) == 20.0
    assert path.goodput(RATE, 0.5, 20.0, elastic=True) == path.goodput(
        RATE, 0.5, 20.0, elastic=False
    )


def test_the_lost_seconds_are_the_wait_the_shrink_the_short_pod_and_the_grow_back() -> None:
    path = ElasticPath(PEER, pods=1250, wait_for_replacement=120.0)
    fast = PEER.fast_interval or 0.0
    shrink = PEER.in_place_recovery + PEER.in_place_startup + PEER.in_place_restore + fast / 2
    grow = PEER.in_place_recovery + PEER.in_place_startup + PEER.replica_restore
    grow += PEER.fast_save_cost
    assert path.lost(3600.0) == pytest.approx(120 + shrink + (3600 - 120) / 1250 + grow)
    extra = RATE * PEER.replicated() * 0.5 * path.lost(3600.0) / 3600
    assert path.goodput(RATE, 0.5, 3600.0, elastic=True) == pytest.approx(
        PEER.goodput(RATE) - extra
    )


def test_the_report_prints_the_grid_from_the_path() -> None:
    text = report(10_000)
    assert "## Elastic N-k when no node can be had (issue 45)" in text
    lines = section(ElasticPath(PEER), RATE)
    assert all(line in text for line in lines)
    row = next(line for line in lines if line.startswith("| 50% | 60 min |"))
    idle = ElasticPath(PEER).goodput(RATE, 0.5, 3600.0, elastic=False)
    assert f"| {idle:.2%} |" in row
    assert f"one pod of {WORLD_PODS:,} short" in lines[0]
