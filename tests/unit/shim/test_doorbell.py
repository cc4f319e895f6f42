"""The control directory's doorbell (`rtj_shim.agent.doorbell`): a ring wakes the supervisor's
wait at once, every ring so far is taken by one wake, and ringing where no supervisor holds
the doorbell, or where the path is not a FIFO, does nothing and writes nothing."""

from __future__ import annotations

import os
import stat
import threading
import time
from pathlib import Path

from rtj_shim.agent.doorbell import DOORBELL_FILE, Doorbell, Ring, ring


def test_a_ring_wakes_the_wait_at_once(tmp_path: Path) -> None:
    bell = Doorbell(tmp_path)
    try:
        assert bell.usable and stat.S_ISFIFO(os.lstat(tmp_path / DOORBELL_FILE).st_mode)
        assert not bell.wait(0.01), "not rung: the wait runs out"
        threading.Timer(0.05, ring, (tmp_path,)).start()
        started = time.monotonic()
        assert bell.wait(30.0)
        assert time.monotonic() - started < 20.0, "woken by the ring, not the 30 s bound"
        for _ in range(3):
            assert ring(tmp_path)
        assert bell.wait(0.0), "three rings: one wake"
        assert not bell.wait(0.0), "and every ring taken by it"
    finally:
        bell.close()


def test_no_supervisor_no_doorbell_or_a_file_in_its_place(tmp_path: Path) -> None:
    assert ring(tmp_path) is Ring.NO_DOORBELL, "no doorbell (an older supervisor)"
    os.mkfifo(tmp_path / DOORBELL_FILE)
    assert ring(tmp_path) is Ring.NOBODY, "a FIFO nobody reads (ENXIO): never blocks"
    (tmp_path / DOORBELL_FILE).unlink()
    (tmp_path / DOORBELL_FILE).write_text("a trainer's file")
    assert ring(tmp_path) is Ring.NO_DOORBELL
    assert (tmp_path / DOORBELL_FILE).read_text() == "a trainer's file", "nothing written"
    bell = Doorbell(tmp_path)  # the supervisor puts its FIFO in the file's place
    try:
        assert bell.usable and ring(tmp_path) is Ring.RUNG and bell.wait(1.0)
    finally:
        bell.close()
    assert ring(tmp_path) is Ring.NOBODY, "the supervisor ended: its FIFO stays, unheld"
    assert not ring(tmp_path), "only a ring that reached a supervisor is true"


def test_a_directory_that_cannot_hold_it_leaves_the_supervisor_polling(tmp_path: Path) -> None:
    bell = Doorbell(tmp_path / "absent")
    assert not bell.usable
    started = time.monotonic()
    assert not bell.wait(0.05)
    assert time.monotonic() - started >= 0.04, "it still waits its poll period"
