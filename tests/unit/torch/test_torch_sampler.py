"""ResumableSampler: a resumed position neither repeats nor skips a sample."""

from __future__ import annotations

import contextlib
from itertools import islice

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rtj_shim.torch import ResumableSampler


def samplers(n: int, world: int, **kw: object) -> list[ResumableSampler]:
    return [
        ResumableSampler(range(n), num_replicas=world, rank=r, **kw)  # type: ignore[arg-type]
        for r in range(world)
    ]


def drain(s: ResumableSampler, k: int | None = None) -> list[int]:
    return list(islice(iter(s), k)) if k is not None else list(s)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 200),
    world=st.integers(1, 4),
    taken=st.integers(0, 60),
    epoch=st.integers(0, 3),
    drop_last=st.booleans(),
)
def test_resume_same_world_continues_exactly(
    n: int, world: int, taken: int, epoch: int, drop_last: bool
) -> None:
    ref = samplers(n, world, seed=5, drop_last=drop_last)
    run = samplers(n, world, seed=5, drop_last=drop_last)
    for a, b in zip(ref, run, strict=True):
        a.set_epoch(epoch)
        b.set_epoch(epoch)
    full = [drain(s) for s in ref]
    k = min(taken, min(len(f) for f in full))
    states = []
    for s in run:
        drain(s, k)
        states.append(s.state_dict())
    resumed = samplers(n, world, seed=5, drop_last=drop_last)
    for s, state in zip(resumed, states, strict=True):
        s.load_state_dict(state)
    for r in range(world):
        assert drain(resumed[r]) == full[r][k:]


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 200),
    old=st.integers(1, 4),
    new=st.integers(1, 4),
    steps=st.integers(0, 60),
)
def test_repartition_covers_the_rest_of_the_epoch(n: int, old: int, new: int, steps: int) -> None:
    before = samplers(n, old, seed=1, drop_last=False)
    per_rank = min(steps, n // old)
    consumed: list[int] = []
    for s in before:
        consumed.extend(drain(s, per_rank))
    state = before[0].state_dict()
    after = samplers(n, new, seed=1, drop_last=False)
    with pytest.warns(UserWarning) if old != new else contextlib.nullcontext():
        for s in after:
            s.load_state_dict(state)
    rest: list[int] = []
    for s in after:
        rest.extend(drain(s))
    # no sample of the epoch is skipped; the only repeats are DistributedSampler-style
    # padding (up to world - 1 samples per partition) when n does not divide evenly
    assert set(consumed) | set(rest) == set(range(n))
    repeats = len(consumed) + len(rest) - n
    assert 0 <= repeats <= (old - 1) + (new - 1)
    if n % old == 0 and (n - len(consumed)) % new == 0:
        assert repeats == 0
    if old != new:
        assert after[0].repartitioned is not None
        assert f"from {old} to {new}" in after[0].repartitioned


def test_set_epoch_same_epoch_keeps_position_and_new_epoch_reshuffles() -> None:
    s = ResumableSampler(range(10), num_replicas=1, rank=0, seed=3)  # type: ignore[arg-type]
    first = drain(s, 4)
    s.set_epoch(0)
    rest = drain(s)
    assert sorted(first + rest) == list(range(10))
    s.set_epoch(1)
    assert sorted(drain(s)) == list(range(10))


def test_checkpoint_at_epoch_end_ends_the_epoch_like_the_interrupted_iterator() -> None:
    s = ResumableSampler(range(6), num_replicas=1, rank=0, seed=0)  # type: ignore[arg-type]
    it = iter(s)
    order = [next(it) for _ in range(6)]  # all handed out, end not yet observed
    state = s.state_dict()
    resumed = ResumableSampler(range(6), num_replicas=1, rank=0, seed=0)  # type: ignore[arg-type]
    resumed.load_state_dict(state)
    assert drain(resumed) == []  # the end of the epoch, as the original iterator would say
    assert drain(resumed) == order  # an ended epoch starts over on the next pass


def test_refuses_a_cursor_from_another_dataset() -> None:
    s = ResumableSampler(range(10), num_replicas=1, rank=0, dataset_id="a")  # type: ignore[arg-type]
    other = ResumableSampler(range(10), num_replicas=1, rank=0, dataset_id="b")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="different dataset"):
        other.load_state_dict(s.state_dict())


def test_state_is_plain() -> None:
    s = ResumableSampler(range(10), num_replicas=2, rank=1)  # type: ignore[arg-type]
    drain(s, 3)
    state = s.state_dict()
    assert all(isinstance(v, int | str | bool) for v in state.values())
    assert state["offset"] == 3 and state["world_size"] == 2
