"""policy.progress: hang verdicts, automatic timeouts and the job summary over progress reports."""

from __future__ import annotations

import copy

import pytest
from progress_reports import NOW, pod, rank

from rtj_operator.policy.progress import (
    PodReport,
    Timeouts,
    auto_timeout,
    hang_verdict,
    job_progress,
    parse_reports,
)
from rtj_operator.policy.stragglers import stragglers

# ---------------------------------------------------------------------- hang_verdict


def test_a_sigstopped_rank_is_named_while_the_ranks_ahead_wait() -> None:
    """Rank 1 froze in its optimizer step after step 812's allreduce: its record stopped
    changing; the others completed step 813 and wait in the next step's collective."""
    reports = [
        pod("w-0", rank(0, 813, "allreduce", 93.0), rank(1, 812, "optimizer", 94.2)),
        pod("w-1", rank(2, 813, "backward", 93.1), rank(3, 813, "allreduce", 93.0)),
    ]
    hang = hang_verdict(reports, 60.0, NOW)
    assert hang is not None
    assert (hang.rank, hang.pod, hang.step, hang.section) == (1, "w-0", 812, "optimizer")
    assert hang.seconds == pytest.approx(94.2) and hang.timeout == 60.0
    assert not hang.all_ranks_equally_stuck and hang.ahead == (0, 2, 3) and hang.ranks == 4
    assert hang.message.startswith("rank 1 (w-0) has been in 'optimizer' of step 813 for 94s")
    assert "3 rank(s) ahead of it wait" in hang.message


def test_at_the_same_step_the_earlier_phase_is_behind() -> None:
    """Frozen in forward; the other rank finished its forward and waits in backward (the
    gradient allreduce), even though it entered backward before the frozen rank, a
    straggler, entered forward."""
    reports = [pod("w-0", rank(0, 812, "backward", 95.0), rank(1, 812, "forward", 94.0))]
    hang = hang_verdict(reports, 60.0, NOW)
    assert hang is not None and (hang.rank, hang.section) == (1, "forward")
    assert hang.seconds == pytest.approx(94.0) and hang.ahead == (0,)


def test_with_user_sections_the_one_longest_in_its_section_is_behind() -> None:
    reports = [pod("w-0", rank(0, 40, "tokenize", 70.0), rank(1, 40, "my_collective", 65.0))]
    hang = hang_verdict(reports, 60.0, NOW)
    assert hang is not None and (hang.rank, hang.section) == (0, "tokenize")


@pytest.mark.parametrize("section", ["step", "checkpoint", "tokenize"])
def test_at_the_same_step_a_rank_waiting_is_ahead_of_one_working(section: str) -> None:
    """Rank 0 finished step 45 first and waits in step 46's barrier; rank 1 froze after
    finishing step 45, between steps (or in a save, or a user section): it entered that
    section later than rank 0 entered its barrier, and it is the culprit (the flake of CI
    stop 31: the earlier entry blamed rank 0)."""
    reports = [pod("w-0", rank(0, 45, "barrier", 14.0)), pod("w-1", rank(1, 45, section, 13.5))]
    hang = hang_verdict(reports, 10.0, NOW)
    assert hang is not None and (hang.rank, hang.pod, hang.section) == (1, "w-1", section)
    assert hang.ahead == (0,) and not hang.all_ranks_equally_stuck


@pytest.mark.parametrize("section", ["backward", "barrier", "collective"])
def test_in_one_section_the_silent_rank_is_behind_the_one_that_pulses(section: str) -> None:
    """Both ranks sit in the same section of the same step (DDP's allreduce runs inside
    backward; a barrier; step_boundary's reduction), rank 0 having entered first. Rank 0's
    shim pulses (it waits, its process runs); rank 1's record went silent when it froze:
    rank 1 is the culprit, not "all ranks equally stuck"."""
    reports = [
        pod("w-0", rank(0, 45, section, 14.0, since_update=0.4)),
        pod("w-1", rank(1, 45, section, 13.5)),
    ]
    hang = hang_verdict(reports, 10.0, NOW)
    assert hang is not None and (hang.rank, hang.pod, hang.section) == (1, "w-1", section)
    assert hang.ahead == (0,) and not hang.all_ranks_equally_stuck
    assert "silent for 14s (its process does not run); 1 rank(s) ahead of it wait" in hang.message


def test_a_silent_rank_in_a_released_barrier_is_behind_the_one_that_pulses_in_backward() -> None:
    """CI stop 55: rank 1 was stopped in ``barrier`` just after the barrier released rank
    0, which went on to step 180's backward and waits there (DDP's allreduce) for rank 1.
    Rank 0 works and pulses; rank 1 waits and is silent: the silence names rank 1."""
    reports = [
        pod("w-0", rank(0, 179, "backward", 10.2, since_update=0.3)),
        pod("w-1", rank(1, 179, "barrier", 10.4)),
    ]
    hang = hang_verdict(reports, 10.0, NOW)
    assert hang is not None and (hang.rank, hang.pod, hang.section) == (1, "w-1", "barrier")
    assert hang.ahead == (0,) and "its process does not run" in hang.message


def test_without_pulses_a_silent_record_tells_nothing() -> None:
    """No rank pulses (an older shim, a shell reporter): both are silent, and the verdict
    is the phase and entry order's, without the word."""
    reports = [pod("w-0", rank(0, 45, "backward", 14.0)), pod("w-1", rank(1, 45, "backward", 13.8))]
    hang = hang_verdict(reports, 10.0, NOW)
    assert hang is not None and hang.rank == 0 and hang.all_ranks_equally_stuck
    assert "silent" not in hang.message


def test_without_pulses_a_rank_that_moves_keeps_the_one_waiting_for_it_from_a_hang() -> None:
    """Review of the first version: rank 0 waits in backward (14 s, its record as old),
    rank 1 entered forward 3 s ago. With no pulse, rank 0's old record is no silence: the
    rank behind (rank 1) moves, so there is no hang."""
    reports = [pod("w-0", rank(0, 45, "backward", 14.0)), pod("w-1", rank(1, 45, "forward", 3.0))]
    assert hang_verdict(reports, 10.0, NOW) is None
    barrier = [pod("w-0", rank(0, 45, "barrier", 14.0)), pod("w-1", rank(1, 45, "step", 3.0))]
    assert hang_verdict(barrier, 10.0, NOW) is None


def test_an_old_report_of_a_pulsing_rank_is_no_silence() -> None:
    """Review of the first version: silence is the record's age when read, not the
    report's age (a report kept from a poll 7 s ago, its pulse 0.4 s old then)."""
    reports = [
        pod("w-0", rank(0, 45, "backward", 7.0, since_update=0.4), received_at=NOW - 7.0),
        pod("w-1", rank(1, 45, "backward", 13.8, since_update=0.1)),
    ]
    hang = hang_verdict(reports, 10.0, NOW)
    assert hang is not None and hang.all_ranks_equally_stuck and "silent" not in hang.message


def test_long_waits_of_ranks_ahead_are_no_hang_while_the_one_behind_moves() -> None:
    reports = [pod("w-0", rank(0, 813, "allreduce", 75.0), rank(1, 812, "forward", 2.0))]
    assert hang_verdict(reports, 60.0, NOW) is None


def test_all_ranks_equally_stuck() -> None:
    reports = [
        pod("w-0", rank(0, 500, "allreduce", 120.0), rank(1, 500, "allreduce", 120.4)),
        pod("w-1", rank(2, 500, "allreduce", 119.8), rank(3, 500, "allreduce", 120.1)),
    ]
    hang = hang_verdict(reports, 60.0, NOW)
    assert hang is not None and hang.all_ranks_equally_stuck
    assert hang.rank == 1 and hang.ahead == ()  # entered first, but within same_time_s
    assert hang.message.startswith("all 4 ranks equally stuck in 'allreduce' of step 501")
    assert "none is ahead" in hang.message


def test_equally_stuck_needs_every_pod_to_have_reported() -> None:
    reports = [
        pod("w-0", rank(0, 500, "allreduce", 120.0), rank(1, 500, "allreduce", 120.4)),
        pod("w-1", rank(2, 400, "forward", 1.0), received_at=NOW - 300),
    ]
    hang = hang_verdict(reports, 60.0, NOW)
    assert hang is not None and not hang.all_ranks_equally_stuck
    assert hang.unreported_pods == ("w-1",)
    assert "no fresh report from w-1 (the culprit may be there)" in hang.message


def test_start_up_grace_before_the_first_steps() -> None:
    starting = [pod("w-0", rank(0, None, "start", 300.0), rank(1, None, "restore", 299.0))]
    limits = auto_timeout(starting, factor=5.0, floor=30.0, startup_grace=600.0, now=NOW)
    assert limits.step >= 600.0 and limits.for_section("start") >= 600.0
    assert hang_verdict(starting, limits, NOW) is None
    stuck = [pod("w-0", rank(0, None, "start", 700.0), rank(1, None, "restore", 650.0))]
    hang = hang_verdict(stuck, limits, NOW)
    assert hang is not None and (hang.rank, hang.step) == (0, None)
    assert "'start' before its first step for 700s" in hang.message
    # a fixed timeout with its own start-up allowance
    assert hang_verdict(starting, Timeouts.fixed(60.0, startup=900.0), NOW) is None
    assert hang_verdict(starting, 60.0, NOW) is not None


def test_a_slow_but_moving_rank_is_no_hang() -> None:
    """Rank 3 takes twice as long per step, but it keeps entering sections."""
    fast, slow = [0.05] * 16, [0.1] * 16
    reports = [
        pod("w-0", rank(0, 900, "allreduce", 0.06, steps=fast), rank(1, 900, "allreduce", 0.06)),
        pod("w-1", rank(2, 900, "allreduce", 0.05), rank(3, 900, "forward", 0.03, steps=slow)),
    ]
    assert hang_verdict(reports, 1.0, NOW) is None


def test_a_rank_that_just_finished_a_step() -> None:
    reports = [pod("w-0", rank(0, 813, "step", 0.001), rank(1, 812, "optimizer", 0.02))]
    assert hang_verdict(reports, 1.0, NOW) is None
    # ...and one that just finished while the one behind is stuck
    reports = [pod("w-0", rank(0, 813, "data", 0.001), rank(1, 812, "backward", 80.0))]
    hang = hang_verdict(reports, 60.0, NOW)
    assert hang is not None and hang.rank == 1 and hang.ahead == (0,)


def test_a_save_gets_its_own_allowance() -> None:
    observed = [pod("w-0", rank(0, 99, "step", 0.01, steps=[0.05] * 16, checkpoint=60.0))]
    limits = auto_timeout(observed, factor=5.0, floor=30.0, startup_grace=600.0, now=NOW)
    assert (limits.step, limits.checkpoint) == (30.0, 300.0)
    saving = [
        pod("w-0", rank(0, 100, "checkpoint", 200.0, steps=[0.05] * 16, checkpoint=60.0)),
        pod("w-1", rank(1, 100, "backward", 199.0, steps=[0.05] * 16, checkpoint=60.0)),
    ]
    assert hang_verdict(saving, limits, NOW) is None
    stalled = [
        pod("w-0", rank(0, 100, "checkpoint", 301.0)),
        pod("w-1", rank(1, 100, "backward", 300.0)),
    ]
    hang = hang_verdict(stalled, limits, NOW)
    assert hang is not None and (hang.rank, hang.section, hang.timeout) == (0, "checkpoint", 300.0)


def test_ranks_of_pods_polled_at_different_times_are_compared_on_one_clock() -> None:
    reports = [
        pod("w-0", rank(0, 10, "forward", 50.0), received_at=NOW - 10),  # since NOW - 60
        pod("w-1", rank(1, 10, "forward", 55.0), received_at=NOW),  # since NOW - 55
    ]
    hang = hang_verdict(reports, 58.0, NOW)
    assert hang is not None and hang.rank == 0 and hang.seconds == pytest.approx(60.0)
    assert not hang.all_ranks_equally_stuck and hang.ahead == (1,)


def test_exited_ranks_and_stale_reports_are_no_evidence() -> None:
    done = [pod("w-0", rank(0, 200, "step", 900.0, state="exited"))]
    assert hang_verdict(done, 60.0, NOW) is None
    old = [pod("w-0", rank(0, 200, "forward", 900.0), received_at=NOW - 31)]
    assert hang_verdict(old, 60.0, NOW) is None
    assert hang_verdict(old, 60.0, NOW, max_report_age=60.0) is not None
    assert hang_verdict([], 60.0, NOW) is None


def test_the_inputs_are_left_alone() -> None:
    reports = [pod("w-0", rank(0, 813, "allreduce", 93.0), rank(1, 812, "optimizer", 94.2))]
    before = copy.deepcopy(reports)
    hang_verdict(reports, 60.0, NOW)
    auto_timeout(reports, now=NOW)
    stragglers(reports, now=NOW)
    assert reports == before


# ---------------------------------------------------------------------- parsing


def test_malformed_reports_are_no_reports_and_an_entry_without_timing_waits() -> None:
    """A value no sidecar writes makes the pod's whole report no report (issue 42: one rank
    entry of it is no better than the others); a rank whose record holds no section timing
    yet is only skipped."""
    good = rank(0, 5, "forward", 1.0)
    reports = [
        PodReport("w-0", NOW, {"schema": 2, "ranks": [good]}),
        PodReport("w-1", NOW, {"schema": 1, "ranks": "nope"}),
        pod("w-2", good, {**good, "rank": 1, "seconds_in_section": None}),
        pod("w-3", {**good, "rank": 3}, {"rank": -1}),
        pod("w-4", {**good, "rank": 4, "step": "five"}),
        pod("w-5", {**good, "rank": 5}, "junk"),  # type: ignore[arg-type]
    ]
    parsed = parse_reports(reports, NOW)
    assert [r.rank for r in parsed.ranks] == [0]
    assert parsed.bad_pods == ("w-0", "w-1", "w-3", "w-4", "w-5")
    assert len(parsed.problems) == 6
    assert "w-2: rank 1 without section timing" in parsed.problems


def test_a_rank_reported_by_two_pods_keeps_the_newer_report() -> None:
    reports = [
        pod("old", rank(0, 5, "forward", 1.0), received_at=NOW - 5),
        pod("new", rank(0, 9, "data", 1.0)),
    ]
    parsed = parse_reports(reports, NOW)
    assert [(r.pod, r.step) for r in parsed.ranks] == [("new", 9)]
    assert parsed.problems == ("rank 0 reported by old and new",)


# ---------------------------------------------------------------------- auto_timeout


def test_auto_timeout_from_step_times() -> None:
    reports = [
        pod("w-0", rank(0, 99, "step", 0.0, steps=[10.0] * 15 + [12.0])),
        pod("w-1", rank(1, 99, "step", 0.0, steps=[10.0] * 16)),
    ]
    limits = auto_timeout(reports, factor=5.0, floor=30.0, startup_grace=600.0, now=NOW)
    assert limits.step == 50.0 and limits.startup == 600.0
    assert limits.checkpoint == 600.0  # no save observed yet: the grace
    assert "5.0 x median 10s" in limits.reason and "no save yet" in limits.reason
    spiky = [pod("w-0", rank(0, 99, "step", 0.0, steps=[1.0] * 15 + [70.0]))]
    assert auto_timeout(spiky, factor=5.0, floor=30.0, now=NOW).step == 70.0
    tiny = [pod("w-0", rank(0, 99, "step", 0.0, steps=[0.05] * 16))]
    assert auto_timeout(tiny, factor=5.0, floor=30.0, now=NOW).step == 30.0


def test_auto_timeout_keeps_the_grace_until_every_rank_has_warmed_up() -> None:
    reports = [
        pod("w-0", rank(0, 99, "step", 0.0, steps=[0.05] * 16)),
        pod("w-1", rank(1, 2, "forward", 0.0, steps=[0.05, 0.05])),  # restarted process
    ]
    limits = auto_timeout(reports, factor=5.0, floor=30.0, startup_grace=300.0, now=NOW)
    assert limits.step == 300.0 and "start-up grace" in limits.reason
    warm = auto_timeout(reports, floor=30.0, startup_grace=300.0, now=NOW, warmup_steps=2)
    assert warm.step == 30.0
    assert warm.for_section("restore") == 300.0 and warm.for_section("data") == 30.0


def test_first_save_grace() -> None:
    reports = [pod("w-0", rank(0, 99, "step", 0.0, steps=[0.05] * 16))]
    limits = auto_timeout(reports, floor=30.0, now=NOW, first_save_grace=120.0)
    assert limits.checkpoint == 120.0 and limits.for_section("checkpoint") == 120.0


# ---------------------------------------------------------------------- job summary


def test_job_progress() -> None:
    reports = [
        pod("w-0", rank(0, 813, "step", 0.0, steps=[0.05] * 3), rank(1, 812, "optimizer", 0.0)),
    ]
    summary = job_progress(reports, NOW)
    assert summary.step == 812 and summary.ranks == 2
    assert summary.median_step_seconds == 0.05 and summary.steps_per_second == 20.0
    starting = [pod("w-0", rank(0, None, "start", 1.0), rank(1, 3, "step", 0.0))]
    assert job_progress(starting, NOW).step is None
