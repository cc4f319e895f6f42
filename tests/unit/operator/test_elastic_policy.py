"""policy.elastic: spec.elastic parsed with errors naming the field; shrink after the wait,
never below minReplicas; grow back to every ready pod, at natural ranks once whole."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rtj_operator.policy.elastic import (
    ElasticSpec,
    ElasticSpecError,
    Verdict,
    on_missing,
    on_shrunk,
    renumber,
)

ELASTIC = ElasticSpec(min_replicas=2, wait_for_replacement_seconds=120)


def test_absent_is_off_and_fields_default() -> None:
    off = ElasticSpec.parse(None, 4)
    assert (off.min_replicas, off.enabled(4)) == (4, False)
    on = ElasticSpec.parse({"minReplicas": 3}, 4)
    assert on == ElasticSpec(3, 120, True) and on.enabled(4)


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"minReplicas": 0}, "spec.elastic.minReplicas"),
        ({"minReplicas": 5}, "spec.elastic.minReplicas"),
        ({"minReplicas": "3"}, "spec.elastic.minReplicas"),
        ({"minReplicas": True}, "spec.elastic.minReplicas"),
        ({"waitForReplacementSeconds": -1}, "spec.elastic.waitForReplacementSeconds"),
        ({"waitForReplacementSeconds": 1.5}, "spec.elastic.waitForReplacementSeconds"),
        ({"growBack": "yes"}, "spec.elastic.growBack"),
    ],
)
def test_a_bad_field_is_named_with_what_was_expected(raw: dict[str, object], field: str) -> None:
    with pytest.raises(ElasticSpecError, match=field + ": expected"):
        ElasticSpec.parse(raw, 4)


def test_not_elastic_waits_as_before() -> None:
    off = ElasticSpec.parse(None, 4)
    assert on_missing(off, 4, {"a": 0, "b": 1, "c": 2}, {3: 0.0}, 1e6).verdict is Verdict.OFF


def test_a_replacement_waits_its_time_then_the_survivors_shrink() -> None:
    survivors = {"w-0": 0, "w-1": 1, "w-3": 3}
    early = on_missing(ELASTIC, 4, survivors, {2: 1000.0}, 1030.0)
    assert early.verdict is Verdict.WAIT and early.recheck_after == 90
    assert early.reason == "rank(s) 2 waiting for a replacement for 30s of 120s"
    late = on_missing(ELASTIC, 4, survivors, {2: 1000.0}, 1120.0)
    assert late.verdict is Verdict.SHRINK and late.world_size == 3
    assert late.ranks == {"w-0": 0, "w-1": 1, "w-3": 2}
    assert late.reason.endswith("training on 3 of 4")


def test_the_lost_rank_zero_hands_rendezvous_to_the_lowest_survivor() -> None:
    shrunk = on_missing(ELASTIC, 4, {"w-3": 3, "w-1": 1, "w-2": 2}, {0: 0.0}, 500.0)
    assert shrunk.ranks == {"w-1": 0, "w-2": 1, "w-3": 2}


def test_never_below_min_replicas() -> None:
    few = on_missing(ELASTIC, 4, {"w-0": 0}, {1: 0.0, 2: 0.0, 3: 0.0}, 1e6)
    assert few.verdict is Verdict.TOO_FEW and few.ranks is None
    assert "fewer than spec.elastic.minReplicas (2)" in few.reason


def test_nothing_missing_is_full() -> None:
    assert on_missing(ELASTIC, 4, {"a": 0}, {}, 0.0).verdict is Verdict.FULL


def test_grow_back_to_natural_ranks_once_whole_and_renumbered_while_not() -> None:
    world = {"w-0": 0, "w-3": 1}  # shrunk from 4 to 2
    partial = on_shrunk(ELASTIC, 4, world, {"w-0": 0, "w-3": 3, "w-1": 1})
    assert partial.verdict is Verdict.GROW and partial.ranks == {"w-0": 0, "w-1": 1, "w-3": 2}
    whole = on_shrunk(ELASTIC, 4, world, {"w-0": 0, "w-1": 1, "w-2": 2, "w-3": 3})
    assert whole.ranks == {"w-0": 0, "w-1": 1, "w-2": 2, "w-3": 3}
    assert whole.reason == "2 pod(s) ready again: growing from 2 to 4 of 4"
    assert on_shrunk(ELASTIC, 4, world, {"w-0": 0, "w-3": 3}).verdict is Verdict.STAY
    stay = ElasticSpec(2, 120, grow_back=False)
    assert on_shrunk(stay, 4, world, {"w-0": 0, "w-1": 1, "w-3": 3}).verdict is Verdict.STAY


@given(st.dictionaries(st.text(min_size=1, max_size=8), st.integers(0, 64), max_size=12))
def test_renumbering_keeps_the_natural_order_and_leaves_no_gap(natural: dict[str, int]) -> None:
    ranks = renumber(natural)
    assert sorted(ranks.values()) == list(range(len(natural)))
    by_new = sorted(ranks, key=ranks.__getitem__)
    assert [natural[p] for p in by_new] == sorted(natural.values())
