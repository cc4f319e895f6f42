"""policy.stragglers: slow ranks by their busy time per step, window after window."""

from __future__ import annotations

import pytest
from progress_reports import NOW, pod, rank

from rtj_operator.policy.progress import PodReport
from rtj_operator.policy.stragglers import StragglerState, stragglers


def window(completed: int, busy2: float, steps: float = 0.1) -> list[PodReport]:
    """Four ranks in lockstep (equal step times); rank 2's busy time is ``busy2``."""
    return [
        pod("w-0", *(rank(r, 50, "step", 0.0, steps=[steps] * 16, busy=0.05, completed=completed)
                     for r in (0, 1))),
        pod("w-1", rank(2, 50, "step", 0.0, steps=[steps] * 16, busy=busy2, completed=completed),
            rank(3, 50, "step", 0.0, steps=[steps] * 16, busy=0.05, completed=completed)),
    ]  # fmt: skip


def test_a_straggler_is_named_after_k_slow_windows_by_its_busy_time() -> None:
    state = None
    for k, completed in enumerate((10, 20, 30), start=1):
        result = stragglers(window(completed, 0.09), state, now=NOW, ratio=0.7, windows=3)
        state = result.state
        assert state.ranks[2].slow_windows == k
        assert state.ranks[0].slow_windows == 0
        if k < 3:
            assert result.stragglers == ()
    (found,) = result.stragglers
    assert (found.rank, found.pod, found.slow_windows) == (2, "w-1", 3)
    assert found.busy_seconds == 0.09 and found.reference_seconds == 0.05
    assert found.ratio == pytest.approx(1.8)


def test_a_window_without_new_steps_changes_nothing_and_recovery_resets() -> None:
    first = stragglers(window(10, 0.09), now=NOW, windows=2)
    idle = stragglers(window(10, 0.09), first.state, now=NOW, windows=2)
    assert idle.state.ranks[2].slow_windows == 1 and idle.stragglers == ()
    second = stragglers(window(20, 0.09), idle.state, now=NOW, windows=2)
    assert [s.rank for s in second.stragglers] == [2]
    recovered = stragglers(window(30, 0.06), second.state, now=NOW, windows=2)
    assert recovered.stragglers == () and recovered.state.ranks[2].slow_windows == 0


def test_the_threshold_is_the_others_median_over_ratio() -> None:
    at = stragglers(window(10, 0.05 / 0.7), now=NOW, windows=1)
    assert at.stragglers == ()  # not above
    above = stragglers(window(10, 0.05 / 0.7 + 1e-6), now=NOW, windows=1)
    assert [s.rank for s in above.stragglers] == [2]


def test_two_ranks_compare_each_with_the_other() -> None:
    reports = [pod("w-0", rank(0, 5, "step", 0.0, busy=0.1, steps=[0.2]),
                   rank(1, 5, "step", 0.0, busy=0.2, steps=[0.2]))]  # fmt: skip
    assert [s.rank for s in stragglers(reports, now=NOW, windows=1).stragglers] == [1]


def test_a_new_process_or_another_pod_starts_the_count_again() -> None:
    state = stragglers(window(10, 0.09), now=NOW).state
    state = stragglers(window(20, 0.09), state, now=NOW).state
    assert state.ranks[2].slow_windows == 2
    restarted = stragglers(window(3, 0.09), state, now=NOW)  # fewer steps: a new process
    assert restarted.state.ranks[2].slow_windows == 1
    moved = window(40, 0.09)
    moved[1] = PodReport("w-9", NOW, moved[1].body)
    assert stragglers(moved, state, now=NOW).state.ranks[2].slow_windows == 1


def test_without_waiting_sections_step_times_decide_and_state_is_not_mutated() -> None:
    reports = [pod("w-0", rank(0, 5, "step", 0.0, steps=[0.1] * 4),
                   rank(1, 5, "step", 0.0, steps=[0.1] * 4),
                   rank(2, 5, "step", 0.0, steps=[0.3] * 4))]  # fmt: skip
    for entry in reports[0].body["ranks"]:
        entry["median_busy_seconds"] = None
    state = StragglerState()
    result = stragglers(reports, state, now=NOW, windows=1)
    assert [s.rank for s in result.stragglers] == [2]
    assert state.ranks == {}  # the state passed in stays as it was


def test_the_leave_one_out_median_is_the_median_of_the_others() -> None:
    import random
    import statistics

    from rtj_operator.policy.stragglers import _median_without

    rng = random.Random(5)
    for _ in range(500):
        values = sorted(rng.choice([0.1, 0.2, 0.3, 0.5, 1.0, rng.random()]) for _ in range(
            rng.randint(2, 12)))  # fmt: skip
        left_out = rng.choice(values)
        others = list(values)
        others.remove(left_out)
        assert _median_without(values, left_out) == statistics.median(others)
