"""The soak's pure parts: the seeded fault schedule and the goodput accounting."""

from __future__ import annotations

import itertools
import json

import pytest

from bench import soak_accounting as acc
from bench.soak_schedule import KINDS, schedule


def test_the_schedule_is_seeded_spaced_and_capped() -> None:
    a = schedule(7, 3600, 60, ranks=4, caps={"gpu_xid": 2}, min_gap=30)
    assert a == schedule(7, 3600, 60, ranks=4, caps={"gpu_xid": 2}, min_gap=30)
    assert a != schedule(8, 3600, 60, ranks=4, caps={"gpu_xid": 2}, min_gap=30)
    assert len(a) > 20
    assert all(later.at - earlier.at >= 30 for earlier, later in itertools.pairwise(a))
    assert all(f.at <= 3600 - 30 and f.kind in KINDS and 0 <= f.rank < 4 for f in a)
    assert sum(f.kind == "gpu_xid" for f in a) <= 2
    assert {f.kind for f in a} == set(KINDS), "the default mix draws every kind"
    only = schedule(1, 600, 30, ranks=2, mix={"hang": 1.0})
    assert only and {f.kind for f in only} == {"hang"}
    with pytest.raises(ValueError, match="unknown fault kinds"):
        schedule(1, 600, 30, ranks=2, mix={"meteor": 1.0})


def lines(restored: int | None, steps: dict[int, float], restore_at: float = 0.0) -> list[str]:
    out = []
    if restored is not None:
        out.append(json.dumps({"event": "restore", "step": restored, "time": restore_at}))
    for step, at in steps.items():
        out.append(json.dumps({"step": step, "loss": float(step), "time": at}))
    out.append('{"step": 99, "lo')  # the line a killed rank was writing
    return out


def test_goodput_counts_only_the_steps_that_survive_into_the_final_model() -> None:
    # attempt 1: steps 1-6 at 1 s each from t=10; checkpoint at 4; killed after 6
    one = acc.parse_attempt(1, lines(0, {s: 10.0 + s for s in range(1, 7)}, restore_at=10.0))
    # attempt 2: resumed from 4 at t=30, steps 5-8
    two = acc.parse_attempt(2, lines(4, {s: 30.0 + (s - 4) for s in range(5, 9)}, 30.0))
    attempts = {1: one, 2: two}
    line = acc.lineage(attempts)
    assert line.ranges == ((2, 4, 8), (1, 0, 4))
    assert sorted(line.losses(attempts)) == [1, 2, 3, 4, 5, 6, 7, 8]
    # surviving: steps 1-4 of attempt 1 (4 s) and 5-8 of attempt 2 (4 s); steps 5-6 of
    # attempt 1 were recomputed, and 24..30 s was detection, teardown and start-up
    assert acc.productive_seconds(attempts, line) == pytest.approx(8.0)
    (recovery,) = acc.recoveries([("hang", 17.0)], attempts)
    assert (recovery.attempt, recovery.resumed_attempt) == (1, 2)
    assert recovery.seconds_to_first_step == pytest.approx(14.0)
    assert recovery.lost_steps == 2


def test_a_resume_from_a_step_no_attempt_logged_is_an_error() -> None:
    one = acc.parse_attempt(1, lines(0, {1: 1.0, 2: 2.0}))
    two = acc.parse_attempt(2, lines(5, {6: 9.0}))
    with pytest.raises(ValueError, match="resumed from step 5"):
        acc.lineage({1: one, 2: two})


def test_two_worlds_training_at_once_are_caught() -> None:
    fine = {1: {0: [1.0, 2.0], 1: [1.1, 2.1]}, 2: {0: [5.0], 1: [5.1]}}
    assert acc.overlaps(fine) == []
    zombie = {1: {0: [1.0, 2.0], 1: [1.1, 6.0]}, 2: {0: [5.0], 1: [5.1]}}
    (overlap,) = acc.overlaps(zombie)
    assert (overlap.earlier, overlap.later) == (1, 2) and overlap.seconds == pytest.approx(1.0)
