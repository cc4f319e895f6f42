"""ElasticBatchSampler: an optimizer step consumes the global batch the user set on any
world size, every rank runs the same number of micro-batches, the loss scales give the
step's mean gradient, and any sequence of resizes at step boundaries consumes each sample
of the epoch exactly once."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rtj_shim.torch import ElasticBatchSampler, StepBatch
from rtj_shim.torch.elastic_batches import share, split_step


def world(
    n: int, size: int, global_batch: int, micro: int, **kw: object
) -> list[ElasticBatchSampler]:
    return [
        ElasticBatchSampler(range(n), global_batch, micro, num_replicas=size, rank=r, **kw)
        for r in range(size)
    ]


def one_step(samplers: list[ElasticBatchSampler], its: list) -> list[StepBatch] | None:
    batches = [next(it, None) for it in its]
    if None in batches:
        assert all(b is None for b in batches), "ranks of one world end the epoch together"
        return None
    return batches  # type: ignore[return-value]


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 120),
    global_batch=st.integers(1, 24),
    micro=st.integers(1, 8),
    plan=st.lists(st.tuples(st.integers(1, 6), st.integers(0, 5)), min_size=1, max_size=8),
    drop_last=st.booleans(),
)
def test_any_sequence_of_resizes_consumes_each_sample_of_the_epoch_once(
    n: int, global_batch: int, micro: int, plan: list[tuple[int, int]], drop_last: bool
) -> None:
    state: dict | None = None
    consumed: list[int] = []
    steps = 0
    for size, count in [*plan, (plan[-1][0], n + 1)]:  # the last world runs to the end
        samplers = world(n, size, global_batch, micro, seed=3, drop_last=drop_last)
        if state is not None:
            for s in samplers:
                s.load_state_dict(state)
        its = [iter(s) for s in samplers]
        for _ in range(count):
            batches = one_step(samplers, its)
            if batches is None:
                break
            assert {b.step_in_epoch for b in batches} == {steps}
            assert len({len(b.micro_batches) for b in batches}) == 1, "same micro-batch count"
            assert max(len(m.indices) for b in batches for m in b.micro_batches) <= micro
            assert sum(m.loss_scale for b in batches for m in b.micro_batches) == pytest.approx(
                size
            )
            step = [i for b in batches for i in b.indices]
            assert len(step) == batches[0].samples == min(global_batch, n - steps * global_batch)
            consumed += step
            steps += 1
        state = samplers[0].state_dict()
        if state["ended"]:
            break
    order = ElasticBatchSampler(range(n), global_batch, seed=3, num_replicas=1, rank=0)._order()
    end = (n // global_batch) * global_batch if drop_last else n
    assert Counter(consumed) == Counter(order[:end]), "each sample of the epoch once, in steps"


def test_the_same_step_on_four_ranks_and_on_three_covers_the_same_samples() -> None:
    four = [b for b in (one_step(s, [iter(x) for x in s]) for s in [world(48, 4, 16, 4)]) if b]
    three = [b for b in (one_step(s, [iter(x) for x in s]) for s in [world(48, 3, 16, 4)]) if b]
    (full,), (shrunk,) = four, three
    assert sorted(i for b in full for i in b.indices) == sorted(
        i for b in shrunk for i in b.indices
    )
    assert [len(b.micro_batches) for b in full] == [1] * 4  # 4 samples a rank: one micro-batch
    assert [len(b.micro_batches) for b in shrunk] == [2] * 3  # 5 or 6 a rank: accumulate two
    assert [m.loss_scale for m in full[0].micro_batches] == [1.0]  # the full world: unscaled


def test_a_share_too_small_for_the_micro_batch_count_gets_a_weight_zero_filler() -> None:
    # 5 samples on 4 ranks, micro-batch 1: rank 0 runs two, ranks 1-3 one and a filler
    parts = [split_step([10, 11, 12, 13, 14], 4, r, 1) for r in range(4)]
    assert [len(p) for p in parts] == [2, 2, 2, 2]
    assert parts[0][0].indices == (10,) and parts[0][1].indices == (11,)
    filler = parts[3][1]
    assert filler.consumed == 0 and filler.loss_scale == 0.0 and len(filler.indices) == 1
    assert sum(m.consumed for p in parts for m in p) == 5


def test_shares_are_contiguous_and_differ_by_at_most_one() -> None:
    assert [list(share(10, 3, r)) for r in range(3)] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]


def test_a_checkpoint_at_a_step_boundary_counts_the_step_just_trained() -> None:
    (s,) = world(20, 1, 8, 8)
    it = iter(s)
    next(it)  # the step trains; the checkpoint is taken at the next boundary
    assert s.state_dict()["consumed"] == 8
    (resumed,) = world(20, 1, 8, 8)
    resumed.load_state_dict(s.state_dict())
    assert len(resumed) == 2 and [b.samples for b in resumed] == [8, 4]


@pytest.mark.parametrize(
    ("field", "value"),
    [("global_batch", 32), ("seed", 1), ("dataset_len", 21), ("shuffle", False)],
)
def test_a_checkpoint_of_another_sample_order_is_refused_naming_the_field(
    field: str, value: object
) -> None:
    (s,) = world(20, 1, 8, 8)
    state = {**s.state_dict(), field: value}
    with pytest.raises(ValueError, match=field):
        s.load_state_dict(state)
    assert s.consumed == 0, "nothing changed by a refused load"


def test_bad_sizes_are_refused_naming_the_argument() -> None:
    with pytest.raises(ValueError, match="global_batch"):
        ElasticBatchSampler(range(4), 0, num_replicas=1, rank=0)
    with pytest.raises(ValueError, match="micro_batch"):
        ElasticBatchSampler(range(4), 4, 0, num_replicas=1, rank=0)


def test_an_ended_epoch_reports_its_end_once_then_starts_over() -> None:
    (s,) = world(8, 1, 4, 4)
    assert len(list(s)) == 2
    assert list(s) and len(s) == 2  # ended: the next pass is the same epoch again
    s.set_epoch(1)
    assert s.consumed == 0 and len(s) == 2
