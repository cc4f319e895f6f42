"""SIGTERM: the emergency save's trigger and its deadline.

The handler only records the signal (and says so on stderr); the save itself happens at the
next step boundary, where every rank learns that any rank was signalled (a collective flag
in ``Checkpointer.step_boundary``). From the moment a rank knows, a deadline timer runs: if
the save has not finished when it expires, the process exits without publishing anything
partial (the commit protocol guarantees a half-written step is never resumed).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from types import FrameType
from typing import Any


class SigtermGuard:
    def __init__(self, rank: int, deadline_s: float, exit_code: int) -> None:
        self.rank = rank
        self.deadline_s = deadline_s
        self.exit_code = exit_code
        self.since: float | None = None  # when this rank learned of a SIGTERM
        self._installed = False
        self._previous: Any = None

    @property
    def requested(self) -> bool:
        return self.since is not None

    def install(self) -> None:
        """Install the handler (main thread only; a no-op elsewhere or when installed)."""
        if self._installed or threading.current_thread() is not threading.main_thread():
            return
        self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        self._installed = True

    def uninstall(self) -> None:
        if self._installed and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._previous)
            self._installed = False

    def arm(self) -> None:
        """Another rank was signalled: start this rank's deadline too."""
        if self.since is None:
            self.since = time.monotonic()
            self._start_deadline()

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        if self.since is not None:
            return
        self.since = time.monotonic()
        sys.stderr.write(
            f"rtj_shim.torch: SIGTERM on rank {self.rank}: emergency save at the next step "
            f"boundary, deadline {self.deadline_s:.0f}s\n"
        )
        self._start_deadline()

    def _start_deadline(self) -> None:
        def expire() -> None:
            sys.stderr.write(
                f"rtj_shim.torch: emergency deadline of {self.deadline_s:.0f}s "
                f"passed on rank {self.rank}; exiting without publishing a partial step\n"
            )
            sys.stderr.flush()
            os._exit(self.exit_code)

        timer = threading.Timer(self.deadline_s, expire)
        timer.daemon = True
        timer.start()
