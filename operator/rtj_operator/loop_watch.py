"""The event loop's stalls, named: where the loop was while it did not run its heartbeat.

Everything the operator decides runs on one asyncio loop; a handler that blocks it (a
large LIST decoded on the loop, a CPU-heavy plan) delays every job's decisions and, past
the renew deadline, its own leader Lease. `/healthz` says *that* the loop stalled (after
`LOOP_STALL_SECONDS`); this says *where*: a daemon thread samples the loop thread's stack
every `SAMPLE_SECONDS` while the heartbeat is late by more than `STALL_SECONDS`, and when
the loop runs again logs one warning with the stall's length and the stacks it was found
in most, and counts it in `rtj_event_loop_stall_seconds`.

`summary` (pure) turns the samples into that line; `LoopWatch` is the thread.
"""

from __future__ import annotations

import collections
import logging
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType

log = logging.getLogger("rtj_operator.loop_watch")

STALL_SECONDS = 2.0
"""A heartbeat (every second) this late is a stall worth naming."""
SAMPLE_SECONDS = 0.25
FRAMES = 4
"""How many of the innermost frames name a stack (the operator's own first, see `frames`)."""


@dataclass
class Stall:
    """One stall's samples: each the loop thread's innermost frames, outermost last."""

    started: float
    samples: list[tuple[str, ...]] = field(default_factory=list)


def frames(frame: FrameType | None, depth: int = FRAMES) -> tuple[str, ...]:
    """`file:line function` of `depth` frames, innermost first, ending at the innermost
    frame of the operator's own code when there is one: the library calls it made, then
    its own line that made them (from the innermost frame when there is none)."""
    stack: list[FrameType] = []
    while frame is not None:
        stack.append(frame)
        frame = frame.f_back
    own = next((i for i, f in enumerate(stack) if "rtj_operator" in f.f_code.co_filename), 0)
    start = max(0, own - (depth - 1)) if own else 0
    return tuple(
        f"{_short(f.f_code.co_filename)}:{f.f_lineno} {f.f_code.co_name}"
        for f in stack[start : start + depth]
    )


def _short(path: str) -> str:
    for marker in ("rtj_operator/", "site-packages/", "lib/python"):
        if marker in path:
            return path[path.index(marker) :]
    return path


def summary(seconds: float, samples: Sequence[tuple[str, ...]], top: int = 3) -> str:
    """One line: how long the loop ran no heartbeat and the stacks it was found in most."""
    head = f"event loop ran no heartbeat for {seconds:.1f}s"
    if not samples:
        return f"{head} (no sample taken)"
    counts = collections.Counter(samples).most_common(top)
    where = "; ".join(f"{n}/{len(samples)} in {' <- '.join(stack)}" for stack, n in counts)
    return f"{head}: {where}"


class LoopWatch(threading.Thread):
    """Samples the loop thread while `beat()` (the heartbeat's last monotonic time) is
    late; reports each stall once it ends through `report(seconds, line)`."""

    def __init__(
        self,
        loop_thread: int,
        beat: Callable[[], float | None],
        report: Callable[[float, str], None],
        *,
        stall: float = STALL_SECONDS,
        every: float = SAMPLE_SECONDS,
    ) -> None:
        super().__init__(daemon=True, name="rtj-loop-watch")
        self.loop_thread, self.beat, self.report = loop_thread, beat, report
        self.stall, self.every = stall, every
        self.stopped = threading.Event()
        self.current: Stall | None = None

    def run(self) -> None:
        while not self.stopped.wait(self.every):
            self.tick(time.monotonic())

    def tick(self, now: float) -> None:
        beat = self.beat()
        late = beat is not None and now - beat > self.stall
        if late:
            if self.current is None:
                self.current = Stall(started=beat or now)
            frame = sys._current_frames().get(self.loop_thread)
            self.current.samples.append(frames(frame))
        elif self.current is not None and beat is not None:
            seconds = beat - self.current.started
            self.report(seconds, summary(seconds, self.current.samples))
            self.current = None

    def stop(self) -> None:
        self.stopped.set()


def log_stall(seconds: float, line: str) -> None:
    log.warning("%s", line)
