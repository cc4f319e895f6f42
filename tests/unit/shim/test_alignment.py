"""The data alignment check's pure judgements (rtj_shim.alignment, issue 43 section 5) and
its finding as it crosses a file (rtj_shim.wire.misaligned_resume)."""

from __future__ import annotations

import json
import math
import random

import pytest

from rtj_shim.alignment import (
    HISTORY,
    AlignmentCheck,
    AlignmentError,
    Reference,
    level,
    misaligned,
    reference,
)
from rtj_shim.wire.misaligned_resume import MisalignedRanks, MisalignedResumeError


def _levels(rng: random.Random, ranks: int, loss: float, noise: float) -> list[float | None]:
    """Each rank's level over 16 losses near `loss` (a factor of exp(noise) per value)."""
    out: list[float | None] = []
    for _ in range(ranks):
        out.append(level([loss * math.exp(rng.gauss(0, noise)) for _ in range(16)]))
    return out


def _trained_reference(ranks: int, gathers: int = 10, seed: int = 0) -> Reference:
    rng = random.Random(seed)
    ref = reference(_levels(rng, ranks, 0.05, 0.3))
    assert ref is not None
    for g in range(gathers):
        ref = ref.observed(_levels(rng, ranks, 0.05 * 0.99**g, 0.3))
    return ref


def test_level_is_the_mean_log_of_the_positive_finite_losses() -> None:
    assert level([1.0, math.e, math.e**2]) == pytest.approx(1.0)
    assert level([0.0, -1.0, math.nan, math.inf]) is None
    assert level([2.0, 0.0]) == pytest.approx(math.log(2.0))


def test_a_rank_reading_shifted_data_is_named_and_the_others_are_not() -> None:
    ref = _trained_reference(ranks=4)
    after = _levels(random.Random(7), 4, 0.05, 0.3)
    after[2] = level([0.6] * 16)  # rank 2 trains on labels that do not match its features
    found = misaligned(1216, after, ref, AlignmentCheck())
    assert found is not None
    assert found.ranks == (2,) and found.step == 1216
    assert found.factors[0] == pytest.approx(0.6 / 0.05, rel=0.3)
    assert "rank 2" in found.describe() and "wrong position" in found.describe()


def test_two_ranks_one_misaligned_is_named() -> None:
    """With two ranks the median of the levels after the resume cannot tell them apart; the
    reference from before the fault can."""
    ref = _trained_reference(ranks=2)
    after = _levels(random.Random(3), 2, 0.05, 0.3)
    after[1] = level([0.5] * 16)
    found = misaligned(100, after, ref, AlignmentCheck())
    assert found is not None and found.ranks == (1,)


def test_no_false_alarm_over_many_fault_free_resumes() -> None:
    check = AlignmentCheck()
    for seed in range(300):
        ref = _trained_reference(ranks=4, seed=seed)
        after = _levels(random.Random(10_000 + seed), 4, 0.05 * 0.99**10, 0.3)
        assert misaligned(10, after, ref, check) is None, seed


def test_a_loss_that_fell_on_every_rank_since_the_save_names_no_one() -> None:
    """Training went on between the reference's gathers and the check: a loss halved on
    every rank is what training did, not a rank's data."""
    ref = _trained_reference(ranks=3)
    after = _levels(random.Random(5), 3, 0.05 * 0.5, 0.3)
    assert misaligned(5, after, ref, AlignmentCheck()) is None
    two = _trained_reference(ranks=2)
    assert (
        misaligned(5, _levels(random.Random(6), 2, 0.05 * 0.5, 0.3), two, AlignmentCheck()) is None
    )


def test_every_rank_moved_alike_names_no_one_but_a_single_rank_world_names_itself() -> None:
    ref = _trained_reference(ranks=3)
    assert misaligned(5, [level([2.0] * 16)] * 3, ref, AlignmentCheck()) is None
    alone = Reference(math.log(0.05), (0.0,), (0.01,) * 4)
    found = misaligned(5, [math.log(1.0)], alone, AlignmentCheck())
    assert found is not None and found.ranks == (0,)


def test_the_floor_holds_when_the_ranks_agreed_exactly() -> None:
    """Identical data on every rank: spread 0; a 10% difference is still no finding."""
    ref = reference([math.log(0.05)] * 2)
    assert ref is not None and ref.spread == 0.0
    assert misaligned(5, [math.log(0.055), math.log(0.05)], ref, AlignmentCheck()) is None
    assert misaligned(5, [math.log(0.5), math.log(0.05)], ref, AlignmentCheck()) is not None


def test_a_rank_whose_shard_is_harder_by_design_is_no_finding() -> None:
    """Rank 2 always reads a harder shard (3x the others' loss): its offset is learnt
    before the fault, so it is not named after a resume; shifted further, it is."""
    rng = random.Random(11)

    def gather(loss: float) -> list[float | None]:
        levels = _levels(rng, 4, loss, 0.3)
        levels[2] = level([3 * loss * math.exp(rng.gauss(0, 0.3)) for _ in range(16)])
        return levels

    ref = reference(gather(0.05))
    assert ref is not None
    for _ in range(10):
        ref = ref.observed(gather(0.05))
    assert ref.offsets[2] == pytest.approx(math.log(3), abs=0.15)
    assert misaligned(5, gather(0.05), ref, AlignmentCheck()) is None
    worse = gather(0.05)
    worse[2] = level([15 * 0.05] * 16)
    found = misaligned(5, worse, ref, AlignmentCheck())
    assert found is not None and found.ranks == (2,)
    assert found.factors[0] == pytest.approx(5, rel=0.3), "5x its usual, not 15x the others'"


def test_a_changed_world_size_skips_the_check_and_begins_the_offsets_again() -> None:
    ref = _trained_reference(ranks=4)
    assert misaligned(5, [math.log(0.05), math.log(1.0)], ref, AlignmentCheck()) is None
    smaller = ref.observed([math.log(0.05), math.log(0.06)])
    assert smaller.offsets != ref.offsets and len(smaller.offsets) == 2
    assert smaller.gathers == 1


def test_ranks_without_a_level_are_judged_by_no_one() -> None:
    ref = _trained_reference(ranks=2)
    assert misaligned(5, [None, None], ref, AlignmentCheck()) is None
    unchanged = ref.observed([None, None])
    assert unchanged is ref


def test_the_reference_keeps_a_bounded_history_and_round_trips() -> None:
    ref = _trained_reference(ranks=4, gathers=HISTORY * 2)
    assert len(ref.spreads) == HISTORY
    again = Reference.parse(json.loads(json.dumps(ref.encode())))
    assert again == ref


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([], "expected an object"),
        ({"spreads": []}, "center"),
        ({"center": "x"}, "center"),
        ({"center": 1.0, "spreads": [-1.0]}, "spreads"),
        ({"center": 1.0, "spreads": "0.1"}, "spreads"),
        ({"center": math.nan}, "center"),
        ({"center": 1.0, "offsets": [math.inf]}, "offsets"),
        ({"center": 1.0, "gathers": -1}, "gathers"),
    ],
)
def test_a_bad_reference_names_its_field(body: object, field: str) -> None:
    with pytest.raises(AlignmentError, match=field):
        Reference.parse(body)


@pytest.mark.parametrize(
    "kwargs", [{"window": 0}, {"window": True}, {"threshold": 0}, {"floor": math.inf}]
)
def test_a_bad_check_names_its_field(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        AlignmentCheck(**kwargs)  # type: ignore[arg-type]


def test_the_finding_round_trips_and_bad_ones_name_their_field() -> None:
    found = MisalignedRanks(1216, (1, 3), (9.5, 0.1), 0.03)
    assert MisalignedRanks.parse(json.dumps(found.encode())) == found
    for body, field in [
        ({"step": 1, "ranks": [], "factors": [], "spread": 0}, "ranks"),
        ({"step": 1, "ranks": [1], "factors": [], "spread": 0}, "factors"),
        ({"step": 1, "ranks": [1], "factors": [0], "spread": 0}, "factors"),
        ({"step": 1, "ranks": [True], "factors": [1.0], "spread": 0}, "ranks"),
        ({"step": 1, "ranks": [1], "factors": [2.0], "spread": -1}, "spread"),
        ({"step": -1, "ranks": [1], "factors": [2.0], "spread": 0}, "step"),
        ("[1]", "expected a JSON object"),
    ]:
        with pytest.raises(MisalignedResumeError, match=field):
            MisalignedRanks.parse(body)
