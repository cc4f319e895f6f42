"""Exactly-once sample accounting across any sequence of world-size changes (the elastic
path's data contract): ranks that resume an epoch on another world size, at any step
boundary, consume every sample of the epoch once, none twice; with ``drop_last`` only the
final world's last partial round (fewer samples than ranks) is left, as DistributedSampler
leaves it."""

from __future__ import annotations

import warnings
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from rtj_shim.torch import ResumableSampler

DATASET = list(range(97))  # prime: no world size divides it


def _segment(state: dict | None, world: int, steps: int) -> tuple[list[int], dict]:
    """`world` ranks resume from `state` (rank 0's, as the Checkpointer saves a sampler),
    each takes `steps` indices (one micro-batch of 1 per step; all ranks step together, so
    all stop early together at the epoch's end); what they consumed, and rank 0's state."""
    samplers = [ResumableSampler(DATASET, world, r, seed=7, drop_last=True) for r in range(world)]
    if state is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the re-partition warning is the point
            for s in samplers:
                s.load_state_dict(state)
    iterators = [iter(s) for s in samplers]
    taken: list[int] = []
    for _ in range(steps):
        batch = [next(it, None) for it in iterators]
        if None in batch:
            assert set(batch) == {None}, "ranks of one world end the epoch together"
            break
        taken += [i for i in batch if i is not None]
    return taken, samplers[0].state_dict()


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 8), st.integers(0, 30)), min_size=1, max_size=8))
def test_any_sequence_of_resizes_consumes_each_sample_once(
    segments: list[tuple[int, int]],
) -> None:
    state: dict | None = None
    consumed: list[int] = []
    last_world = segments[0][0]
    for world, steps in segments:
        if state is not None and state["ended"]:
            break  # the epoch is over (a training loop calls set_epoch for the next)
        taken, state = _segment(state, world, steps)
        consumed += taken
        last_world = world
    if state is None or not state["ended"]:
        taken, _ = _segment(state, last_world, len(DATASET))  # the epoch's rest, to its end
        consumed += taken
    counts = Counter(consumed)
    assert max(counts.values()) == 1, "a sample consumed twice"
    missing = set(DATASET) - set(counts)
    assert len(missing) < last_world, "only the last partial round is dropped"
    epoch = list(ResumableSampler(DATASET, 1, 0, seed=7)._order())
    assert missing == set(epoch[len(epoch) - len(missing) :]), "the dropped are the epoch's last"


def test_a_shrink_then_a_grow_back_keeps_the_epochs_order_position() -> None:
    """4 ranks, one lost (3 train on), the fourth back: the consumed positions of the epoch's
    order are a prefix, in order of consumption, with no gap."""
    order = ResumableSampler(DATASET, 1, 0, seed=7)._order()
    four, state = _segment(None, 4, 5)
    three, state = _segment(state, 3, 6)
    back, _ = _segment(state, 4, 3)
    consumed = four + three + back
    assert sorted(consumed) == sorted(order[: len(consumed)])
    assert len(consumed) == 4 * 5 + 3 * 6 + 4 * 3
