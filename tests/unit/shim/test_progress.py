"""rtj_shim.progress: what a training process's calls leave in its record."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rtj_shim import progress
from rtj_shim.progress import NULL, Progress
from rtj_shim.wire.progress_record import STATE_EXITED, STATE_RUNNING, Record, read_file


@pytest.fixture(autouse=True)
def fresh_module_state() -> Iterator[None]:
    progress.install(None)
    yield
    progress.install(None)


def record(p: Progress) -> Record:
    return read_file(p.path)


def test_from_env_is_none_without_the_directory() -> None:
    assert Progress.from_env({}) is None
    assert Progress.from_env({"RANK": "3"}) is None


def test_from_env_names_the_file_by_global_rank(tmp_path: Path) -> None:
    env = {
        "RTJ_PROGRESS_DIR": str(tmp_path / "p"),
        "RANK": "12",
        "LOCAL_RANK": "4",
        "TORCHELASTIC_RESTART_COUNT": "2",
    }
    p = Progress.from_env(env)
    assert p is not None
    assert p.path == tmp_path / "p" / "rank-00012.progress"
    r = record(p)
    assert (r.rank, r.local_rank, r.restart, r.pid) == (12, 4, 2, os.getpid())
    assert (r.state, r.step, r.section, r.steps_completed) == (STATE_RUNNING, None, "start", 0)
    p.close()


def test_module_level_calls_are_no_ops_without_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RTJ_PROGRESS_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    progress.step_done(1)
    with progress.section("forward"):
        progress.step_done(2)
    assert progress.current() is NULL
    assert list(tmp_path.iterdir()) == []


def test_module_level_calls_write_this_ranks_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RTJ_PROGRESS_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "1")
    with progress.section("forward"):
        assert read_file(tmp_path / "rank-00001.progress").section == "forward"
    progress.step_done(7)
    found = read_file(tmp_path / "rank-00001.progress")
    assert (found.step, found.section) == (7, "step")
    progress.current().close()


def test_an_unusable_directory_turns_reporting_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "file").write_text("not a directory")
    monkeypatch.setenv("RTJ_PROGRESS_DIR", str(tmp_path / "file" / "sub"))
    progress.step_done(1)  # logged, never raised
    assert progress.current() is NULL


def test_sections_nest_and_the_clock_restarts_on_every_transition(tmp_path: Path) -> None:
    p = Progress(tmp_path)
    assert record(p).section == "start"
    with p.section("backward"):
        entered = record(p).section_started_ns
        with p.section("allreduce"):
            inner = record(p)
            assert inner.section == "allreduce" and inner.section_started_ns >= entered
        back = record(p)
        assert back.section == "backward"
        assert back.section_started_ns >= inner.section_started_ns  # returned: a new start
    assert record(p).section == "start"  # no step completed yet
    p.step_done(1)
    with p.section("forward"):
        pass
    assert record(p).section == "step"
    p.leave()  # nothing open: nothing happens
    assert record(p).section == "step"
    p.close()


def test_step_done_records_durations_and_repeats_change_nothing(tmp_path: Path) -> None:
    p = Progress(tmp_path)
    p.step_done(10)
    first = record(p)
    assert (first.step, first.steps_completed, first.step_ns) == (10, 1, ())
    time.sleep(0.02)
    p.step_done(11)
    after = record(p)
    assert after.step == 11 and after.steps_completed == 2
    assert len(after.step_ns) == 1 and after.last_step_ns >= 20_000_000
    assert after.section_started_ns == after.step_done_ns  # a completed step is progress
    p.step_done(11)  # the Checkpointer and the script may both report the same step
    again = record(p)
    assert again.step_ns == after.step_ns and again.steps_completed == 2
    assert again.section_started_ns == after.section_started_ns
    time.sleep(0.03)
    p.step_done(14)  # three steps at once: the mean per step
    jumped = record(p)
    assert len(jumped.step_ns) == 2 and jumped.last_step_ns >= 10_000_000
    assert jumped.last_step_ns * 3 <= jumped.step_done_ns - again.step_done_ns + 3
    p.close()


def test_time_in_waiting_sections_is_counted_per_step(tmp_path: Path) -> None:
    p = Progress(tmp_path, waiting_sections={"allreduce", "wait_for_peers"})
    p.step_done(0)
    with p.section("backward"):
        time.sleep(0.01)
        with p.section("allreduce"):
            time.sleep(0.03)
    p.step_done(1)
    r = record(p)
    assert r.last_wait_ns >= 30_000_000
    assert r.last_step_ns - r.last_wait_ns >= 10_000_000  # busy: the backward compute
    assert r.wait_ns == (r.last_wait_ns,)
    with p.section("forward"):
        time.sleep(0.005)
    p.step_done(2)
    assert record(p).last_wait_ns == 0  # reset at every completed step
    p.close()


def test_checkpoint_saves_are_timed_apart(tmp_path: Path) -> None:
    p = Progress(tmp_path)
    p.step_done(5)
    with p.section("checkpoint"):
        with p.section("allreduce"):
            time.sleep(0.02)
        time.sleep(0.01)
    with p.section("checkpoint"):
        pass
    r = record(p)
    assert r.checkpoints == 2
    assert r.max_checkpoint_ns >= 30_000_000 > r.last_checkpoint_ns
    assert r.step_ns == ()  # a save is no step
    p.close()


def test_heartbeat_continues_the_record_across_processes(tmp_path: Path) -> None:
    def beat(step: int, section: str | None = None) -> Record:
        p = Progress(tmp_path, 2, pid=4242, reuse=True)
        p.heartbeat(step, section)
        p.close(exited=False)
        return read_file(tmp_path / "rank-00002.progress")

    one = beat(1, "train")
    assert (one.step, one.section, one.pid, one.steps_completed) == (1, "train", 4242, 1)
    time.sleep(0.01)
    two = beat(2)
    assert two.step == 2 and two.section == "step" and two.steps_completed == 2
    assert two.started_ns == one.started_ns and two.seq > one.seq
    assert len(two.step_ns) == 1 and two.step_ns[0] >= 10_000_000
    same = beat(2)  # the same step again: alive, but no progress
    assert same.section_started_ns == two.section_started_ns and same.step_ns == two.step_ns
    assert same.updated_ns > two.updated_ns and same.state == STATE_RUNNING
    moved = beat(2, "eval")
    assert moved.section == "eval" and moved.section_started_ns > two.section_started_ns


def test_a_new_process_replaces_the_record_of_its_rank(tmp_path: Path) -> None:
    old = Progress(tmp_path, 0)
    old.step_done(100)
    new = Progress(tmp_path, 0)
    assert record(new).step is None and record(new).section == "start"
    old.step_done(101)  # an old process still running writes to its own, unlinked file
    assert record(new).step is None
    old.close()
    new.close()


def test_close_marks_the_record_exited_and_stops_reporting(tmp_path: Path) -> None:
    p = Progress(tmp_path)
    p.step_done(3)
    p.close()
    r = read_file(p.path)
    assert r.state == STATE_EXITED and r.step == 3
    p.step_done(4)
    with p.section("forward"):
        pass
    assert read_file(p.path) == r


def test_a_forked_child_never_writes_the_parents_record(tmp_path: Path) -> None:
    p = Progress(tmp_path)
    p.step_done(1)
    before = record(p)
    pid = os.fork()
    if pid == 0:  # the child: a DataLoader worker would be here
        try:
            p.step_done(99)
            with p.section("forward"):
                pass
            progress.step_done(98)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert record(p) == before
    p.close()


def test_reports_section_decorates_a_function(tmp_path: Path) -> None:
    p = Progress(tmp_path)
    progress.install(p)
    inside: list[str] = []

    @progress.reports_section("checkpoint")
    def save(step: int) -> int:
        inside.append(record(p).section)
        return step * 2

    assert save(21) == 42
    assert inside == ["checkpoint"] and record(p).checkpoints == 1
    assert save.__name__ == "save"
    p.close()


def test_long_and_unicode_section_names(tmp_path: Path) -> None:
    p = Progress(tmp_path)
    with p.section("préparation des données, étape longue"):
        assert record(p).section == "préparation des données, étap"  # 32 bytes
    p.close()


def test_the_pulse_refreshes_the_update_time_while_the_training_thread_waits(
    tmp_path: Path,
) -> None:
    """A rank blocked in a collective (here: asleep, the GIL released) keeps pulsing; the
    pulse is no progress (section and its start stay), and closing stops it."""
    p = Progress(tmp_path, pulse_seconds=0.05)
    p.step_done(7)
    with p.section("backward"):
        entered = record(p)
        time.sleep(0.4)
        pulsed = record(p)
    assert pulsed.section == "backward" and pulsed.step == 7
    assert pulsed.section_started_ns == entered.section_started_ns, "a pulse is no progress"
    assert pulsed.updated_ns - entered.updated_ns >= 200_000_000
    p.close()
    closed = record(p)
    time.sleep(0.2)
    assert record(p).updated_ns == closed.updated_ns and closed.state == STATE_EXITED


def test_without_a_pulse_the_update_time_is_the_last_report(tmp_path: Path) -> None:
    p = Progress(tmp_path)  # the constructor's default; from_env pulses (below)
    with p.section("backward"):
        entered = record(p)
        time.sleep(0.15)
        assert record(p).updated_ns == entered.updated_ns
    p.close()


@pytest.mark.parametrize(("value", "pulses"), [(None, True), ("0.05", True), ("0", False)])
def test_from_env_pulses_every_second_unless_told(
    tmp_path: Path, value: str | None, pulses: bool
) -> None:
    env = {"RTJ_PROGRESS_DIR": str(tmp_path)}
    if value is not None:
        env["RTJ_PROGRESS_PULSE_SECONDS"] = value
    before = set(threading.enumerate())
    p = Progress.from_env(env)
    assert p is not None
    started = [t for t in threading.enumerate() if t not in before]
    assert [t.name for t in started] == (["rtj-progress-pulse-0"] if pulses else [])
    p.close()


@pytest.mark.parametrize("value", ["often", "inf", "nan", "-1"])
def test_a_bad_pulse_setting_names_the_variable(tmp_path: Path, value: str) -> None:
    env = {"RTJ_PROGRESS_DIR": str(tmp_path), "RTJ_PROGRESS_PULSE_SECONDS": value}
    with pytest.raises(ValueError, match=f"RTJ_PROGRESS_PULSE_SECONDS='{value}': expected sec"):
        Progress.from_env(env)
