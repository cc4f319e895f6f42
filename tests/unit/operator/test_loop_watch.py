"""The event loop's stalls, named (rtj_operator.loop_watch)."""

from __future__ import annotations

import sys
import threading
import time

from rtj_operator.loop_watch import LoopWatch, frames, summary


def test_the_summary_names_the_stacks_found_most() -> None:
    a = ("rtj_operator/plan.py:10 plan", "rtj_operator/reconcile.py:5 step")
    b = ("lib/python3.11/json/decoder.py:353 raw_decode",)
    line = summary(12.34, [a, a, b, a])
    assert line.startswith("event loop ran no heartbeat for 12.3s: 3/4 in ")
    assert "rtj_operator/plan.py:10 plan <- rtj_operator/reconcile.py:5 step" in line
    assert line.endswith("1/4 in lib/python3.11/json/decoder.py:353 raw_decode")
    assert summary(3.0, []) == "event loop ran no heartbeat for 3.0s (no sample taken)"


def blocking_call() -> None:
    time.sleep(0.6)


def test_a_stall_is_sampled_where_the_loop_thread_is_and_reported_once_it_ends() -> None:
    beat = {"at": time.monotonic()}
    reports: list[tuple[float, str]] = []
    started = threading.Event()

    def loop_thread() -> None:  # stands for the loop: a heartbeat, then a blocking call
        beat["at"] = time.monotonic()
        started.set()
        blocking_call()
        beat["at"] = time.monotonic()

    worker = threading.Thread(target=loop_thread)
    worker.start()
    started.wait()

    def report(seconds: float, line: str) -> None:
        reports.append((seconds, line))

    watch = LoopWatch(worker.ident or 0, lambda: beat["at"], report, stall=0.2, every=0.05)
    watch.start()
    worker.join()
    deadline = time.monotonic() + 5
    while not reports and time.monotonic() < deadline:
        time.sleep(0.05)
    watch.stop()
    ((seconds, line),) = reports
    assert 0.5 <= seconds < 5.0
    assert "blocking_call" in line and "test_loop_watch.py" in line


def test_no_report_while_the_heartbeat_is_on_time() -> None:
    reports: list[str] = []
    watch = LoopWatch(threading.get_ident(), lambda: 100.0, lambda s, line: reports.append(line),
                      stall=2.0)  # fmt: skip
    for now in (100.5, 101.0, 101.9):
        watch.tick(now)
    assert reports == [] and watch.current is None
    watch.tick(102.5)  # late: a sample of this thread
    assert watch.current is not None and len(watch.current.samples) == 1


def test_frames_start_at_the_innermost_frame_of_the_operator() -> None:
    frame = sys._getframe()
    names = frames(frame, depth=2)
    assert len(names) == 2 and "test_frames_start_at" in names[0]
