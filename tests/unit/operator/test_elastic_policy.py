"""policy.elastic: spec.elastic parsed with errors naming the field; shrink after the wait,
never below minReplicas; grow back to every ready pod, at natural ranks once whole."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError
from rtj_test_support import make_job

from rtj_operator.policy.elastic import (
    ElasticSpec,
    Verdict,
    on_missing,
    on_shrunk,
    renumber,
)

ELASTIC = ElasticSpec(min_replicas=2, wait_for_replacement_seconds=120)
ELASTIC_JOB = {"replicas": 4, "elastic": {"minReplicas": 3}, "recovery": {"inPlace": True}}


def test_absent_is_off_and_the_spec_decides_the_rest() -> None:
    off = ElasticSpec.of(make_job(replicas=4).spec)
    assert (off.min_replicas, off.enabled(4)) == (4, False)
    on = ElasticSpec.of(make_job(**ELASTIC_JOB).spec)
    assert on == ElasticSpec(3, 30, True) and on.enabled(4)


@pytest.mark.parametrize(
    ("elastic", "recovery", "message"),
    [
        ({"minReplicas": 5}, {"inPlace": True}, "spec.elastic.minReplicas must be at most"),
        ({"minReplicas": 3}, {}, "needs spec.recovery.inPlace: true"),
        ({"minReplicas": 3}, {"inPlace": True, "inPlaceMaxReplacedPods": 0}, "needs spec"),
        ({"minReplicas": 3, "waitForReplacementSeconds": 60}, {"inPlace": True},
         "waitForReplacementSeconds must be less than spec.recovery.inPlaceDeadlineSeconds"),
        ({"minReplicas": 0}, {"inPlace": True}, "spec.elastic.minReplicas\n"),
        ({"growBack": "sometimes"}, {"inPlace": True}, "spec.elastic.growBack\n"),
    ],
)  # fmt: skip
def test_the_spec_refuses_what_the_api_server_refuses(
    elastic: dict[str, object], recovery: dict[str, object], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        make_job(replicas=4, elastic=elastic, recovery=recovery)


def test_not_elastic_waits_as_before() -> None:
    off = ElasticSpec.of(make_job(replicas=4).spec)
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
