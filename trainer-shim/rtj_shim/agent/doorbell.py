"""The control directory's doorbell: the progress sidecar wakes the supervisor as soon as it
has written a restart order, instead of the supervisor finding it on its next look.

A FIFO (``doorbell``) in the pod's control directory, which the sidecar's container and the
trainer's share (an ``emptyDir``; one kernel, one node). The supervisor makes it and holds it
open for reading *and* writing (so it never reads as hung up when no sidecar has it open)
and waits on it between its looks (`Doorbell.wait`, at most its poll period, so an order
still counts without the bell). The sidecar opens it for writing without blocking, writes
one byte and closes it (`ring`): nothing happens if no supervisor holds it open (ENXIO), if
it is full (the supervisor will look anyway), or if the path is not a FIFO. What it found
(`Ring`) tells the sidecar whether waiting for the supervisor can help: not where no
supervisor holds the doorbell (it ended; nothing will take the order now).

What may ring it: the sidecar, and the trainer's own code, which shares the directory. A
ring only makes the supervisor read the order file sooner; the order's signature is the
sidecar's check, as before.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import os
import select
import stat
import time
from pathlib import Path

DOORBELL_FILE = "doorbell"


class Ring(enum.Enum):
    """What a ring found."""

    RUNG = "rung"
    """A supervisor holds the doorbell: it looks at the order now."""
    NO_DOORBELL = "no doorbell"
    """No FIFO there (an older supervisor, which looks every 0.1 s, or none started yet),
    or it could not be written."""
    NOBODY = "nobody"
    """A doorbell no process holds open (ENXIO): its supervisor ended."""

    def __bool__(self) -> bool:
        return self is Ring.RUNG


def ring(control_dir: Path) -> Ring:
    """Wake the supervisor that waits on `control_dir`'s doorbell (true: one was rung)."""
    path = control_dir / DOORBELL_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        return Ring.NOBODY if exc.errno == errno.ENXIO else Ring.NO_DOORBELL
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return Ring.NO_DOORBELL
        with contextlib.suppress(BlockingIOError):  # full: rung already; it will look
            os.write(fd, b"!")
        return Ring.RUNG
    except OSError:
        return Ring.NO_DOORBELL
    finally:
        os.close(fd)


class Doorbell:
    """The supervisor's end: `wait(seconds)` returns once rung, or after `seconds`."""

    def __init__(self, control_dir: Path) -> None:
        self.path = control_dir / DOORBELL_FILE
        self._fd: int | None = None
        try:
            with contextlib.suppress(FileNotFoundError):
                if not stat.S_ISFIFO(os.lstat(self.path).st_mode):
                    self.path.unlink()  # not ours to keep: a FIFO takes its place
            with contextlib.suppress(FileExistsError):
                os.mkfifo(self.path, 0o600)
            self._fd = os.open(self.path, os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            self._fd = None  # a directory that cannot hold a FIFO: the supervisor just polls

    @property
    def usable(self) -> bool:
        return self._fd is not None

    def wait(self, seconds: float) -> bool:
        """Until rung or `seconds` passed; whether it was rung (every ring so far is taken)."""
        if self._fd is None:
            time.sleep(seconds)
            return False
        try:
            readable, _, _ = select.select([self._fd], [], [], seconds)
        except InterruptedError:
            return False
        if not readable:
            return False
        with contextlib.suppress(BlockingIOError):
            while os.read(self._fd, 4096):
                pass
        return True

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
