"""Progress reporting from a training process: the last completed step and the section it
is in, for the operator's hang and straggler detection (docs/progress.md).

Each rank writes a fixed-size record into ``$RTJ_PROGRESS_DIR/rank-NNNNN.progress``
through a shared memory mapping (:mod:`rtj_shim.wire.progress_record`): an update is a few
stores, no system call, and the training thread never waits for anyone.
``rtj-shim progress-server`` (another process in the pod) reads the records and serves
them, so a rank hung in a collective or stopped by SIGSTOP keeps being reported: its
record simply stops changing.

    from rtj_shim import progress

    for step in range(start, total):
        with progress.section("data"):
            batch = next(batches)
        with progress.section("forward"):
            loss = model(batch)
        with progress.section("backward"):
            loss.backward()
        with progress.section("optimizer"):
            opt.step()
        progress.step_done(step + 1)

Without ``RTJ_PROGRESS_DIR`` every call above is a no-op. ``Progress.from_env()`` gives an
explicit object instead (None without the variable).

Sections nest: entering one pushes it, leaving it returns to the one outside (or to
``step``: inside a step, in no named section; ``start`` before the first completed step).
The record holds the innermost section and since when the rank has been in it *without
progress*: the clock restarts whenever the rank enters a section, returns to one from a
nested section, or completes a step. Time spent in a *waiting* section (``allreduce``,
``barrier``, ``collective``, ``wait``, ``sync``; configurable) is counted per step, so a
straggler can be told from the ranks that wait for it. The ``checkpoint`` section's
durations are kept apart: saves get their own timeout allowance.

Sections belong to the thread that trains; calls from other threads keep the record
consistent (a lock) but interleave the section stack.

A *pulse* (``from_env``: every ``RTJ_PROGRESS_PULSE_SECONDS``, 1 s by default; 0 turns it
off) refreshes the record's update time from a daemon thread. It is no progress; it says
the process runs: a rank blocked in a collective releases the GIL and keeps pulsing,
while one stopped by SIGSTOP, wedged in the kernel, or whose whole interpreter is stuck
goes silent. Two ranks stuck in the same section of the same step (DDP's allreduce runs
inside ``backward``, so the one waiting sits where the frozen one froze) are told apart
by it (``policy.progress`` in the operator).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import math
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import ParamSpec, TypeVar

from rtj_shim.rank_notes import RankNotes
from rtj_shim.wire import milestones as ms
from rtj_shim.wire import save_costs as sc
from rtj_shim.wire.progress_record import (
    RING,
    STATE_EXITED,
    STATE_RUNNING,
    RecordWriter,
    encode_section,
    file_name,
    ring_values,
)

log = logging.getLogger("rtj_shim.progress")

ENV_DIR = "RTJ_PROGRESS_DIR"
ENV_WAITING = "RTJ_PROGRESS_WAIT_SECTIONS"  # comma-separated; replaces the default set
ENV_PULSE = "RTJ_PROGRESS_PULSE_SECONDS"  # 0: no pulse
DEFAULT_PULSE_SECONDS = 1.0
START = "start"  # before the first completed step: imports, restore, compilation
RESTORE = "restore"
STEP = "step"  # inside a step, in no named section
CHECKPOINT = "checkpoint"
WAITING_SECTIONS = frozenset({"allreduce", "barrier", "collective", "wait", "sync"})

P = ParamSpec("P")
R = TypeVar("R")

_monotonic_ns = time.monotonic_ns
_wall_ns = time.time_ns


class _Section:
    """``with progress.section(name):`` (reusable, re-entrant: the stack is the Progress's)."""

    __slots__ = ("_enter", "_leave", "_name")

    def __init__(self, progress: Progress, name: str) -> None:
        self._enter = progress.enter
        self._leave = progress.leave
        self._name = name

    def __enter__(self) -> None:
        self._enter(self._name)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._leave()


class Progress:
    """One rank's progress record. Create one per process (``from_env`` or explicitly)."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        rank: int = 0,
        local_rank: int | None = None,
        *,
        restart: int = 0,
        waiting_sections: Iterable[str] = WAITING_SECTIONS,
        pid: int | None = None,
        reuse: bool = False,
        pulse_seconds: float | None = None,
    ) -> None:
        """``reuse``: continue the record already in the file (its step, durations and
        section), as ``rtj-shim heartbeat`` does from one short-lived process to the next;
        otherwise the file is replaced by a fresh record. ``pulse_seconds``: refresh the
        update time that often from a daemon thread (see the module doc; None: never)."""
        self.path = Path(directory) / file_name(rank)
        self._lock = threading.Lock()
        self._writer = RecordWriter(self.path, reuse=reuse)
        self._waiting = frozenset(waiting_sections)
        self._sections: dict[str, _Section] = {}
        self._stack: list[tuple[str, bytes, int]] = []  # name, encoded, entered at
        now = _monotonic_ns()
        self._rank = rank
        self._local_rank = rank if local_rank is None else local_rank
        self._pid = os.getpid() if pid is None else pid
        self._restart = restart
        self._state = STATE_RUNNING
        self._step: int | None = None
        self._completed = 0
        self._started = now
        self._section = encode_section(START)
        self._in_waiting = False
        self._section_started = now
        self._step_done_at = 0
        self._wait = 0  # ns spent in waiting sections since the last completed step
        self._steps: deque[int] = deque(maxlen=RING)
        self._waits: deque[int] = deque(maxlen=RING)
        self._last_step = self._last_wait = 0
        self._last_ckpt = self._max_ckpt = self._ckpts = 0
        previous = self._writer.previous
        if previous is not None:
            self._restart = previous.restart
            self._step = previous.step
            self._completed = previous.steps_completed
            self._started = previous.started_ns
            self._section = encode_section(previous.section)
            self._in_waiting = previous.section in self._waiting
            self._section_started = previous.section_started_ns
            self._step_done_at = previous.step_done_ns
            self._steps.extend(previous.step_ns)
            self._waits.extend(previous.wait_ns)
            self._last_step, self._last_wait = previous.last_step_ns, previous.last_wait_ns
            self._last_ckpt, self._max_ckpt = (
                previous.last_checkpoint_ns,
                previous.max_checkpoint_ns,
            )
            self._ckpts = previous.checkpoints
        self._ring = ring_values(self._steps, self._waits)
        self._closed = False
        # start-up milestones (a fresh record only: `reuse` continues another process's)
        fresh = previous is None and not reuse
        self._notes = RankNotes(self.path, self._pid, fresh=fresh)
        self._publish(now)
        _LIVE.add(self)
        self._pulse_stop = threading.Event()
        if pulse_seconds:
            try:
                threading.Thread(
                    target=_pulse,
                    args=(weakref.ref(self), pulse_seconds, self._pulse_stop),
                    name=f"rtj-progress-pulse-{rank}",
                    daemon=True,
                ).start()
            except RuntimeError as exc:  # no thread to be had: report without a pulse
                log.warning("progress: no pulse (%s); a frozen rank is judged by position", exc)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Progress | None:
        """The record of this process's rank in ``$RTJ_PROGRESS_DIR`` (None when unset).
        Rank from ``RANK``, local rank from ``LOCAL_RANK``, the in-pod restart from
        ``TORCHELASTIC_RESTART_COUNT`` (all as torchrun sets them), waiting sections from
        ``RTJ_PROGRESS_WAIT_SECTIONS``. Marks the record ``exited`` at interpreter exit."""
        env = os.environ if env is None else env
        directory = env.get(ENV_DIR)
        if not directory:
            return None
        rank = int(env.get("RANK") or 0)
        waiting = env.get(ENV_WAITING)
        pulse = env.get(ENV_PULSE)
        try:
            pulse_seconds = DEFAULT_PULSE_SECONDS if pulse is None else float(pulse)
        except ValueError:
            pulse_seconds = math.nan
        if not math.isfinite(pulse_seconds) or pulse_seconds < 0:
            raise ValueError(f"{ENV_PULSE}={pulse!r}: expected seconds >= 0 (0: no pulse)")
        progress = cls(
            directory,
            rank,
            int(env.get("LOCAL_RANK") or rank),
            restart=int(env.get("TORCHELASTIC_RESTART_COUNT") or 0),
            waiting_sections=WAITING_SECTIONS
            if waiting is None
            else {w.strip() for w in waiting.split(",") if w.strip()},
            pulse_seconds=pulse_seconds if pulse_seconds > 0 else None,
        )
        atexit.register(_close_at_exit, weakref.ref(progress))
        return progress

    # ------------------------------------------------------------------ reporting

    def step_done(self, step: int) -> None:
        """``step`` steps are complete (the number the job would resume from). Calling it
        again with the same number changes nothing; a jump of n steps records the mean."""
        now = _monotonic_ns()
        with self._lock:
            if self._closed:
                return
            if step != self._step:
                self._complete(step, now)
            self._publish(now)
        if not self._closed:
            self._notes.step_done(step)

    def mark(self, name: ms.Milestone, step: int | None = None) -> None:
        """Record that this process reached ``name`` (once; `rtj_shim.rank_notes`)."""
        if not self._closed:
            self._notes.mark(name, step)

    def note_save(self, tier: sc.SaveTier, seconds: float) -> None:
        """A save of `tier` held the training thread `seconds` (`rtj_shim.rank_notes`)."""
        if not self._closed:
            self._notes.note_save(tier, seconds)

    def section(self, name: str) -> _Section:
        """A context manager: the rank is in ``name`` inside it."""
        found = self._sections.get(name)
        if found is None:
            found = self._sections[name] = _Section(self, name)
        return found

    def enter(self, name: str) -> None:
        """Enter section ``name`` (``section()`` without ``with``); pair with ``leave()``."""
        now = _monotonic_ns()
        with self._lock:
            if self._closed:
                return
            self._account(now)
            encoded = encode_section(name)
            self._stack.append((name, encoded, now))
            self._section = encoded
            self._in_waiting = name in self._waiting
            self._section_started = now
            self._publish(now)
        if name == RESTORE:
            self.mark(ms.Milestone.RESTORE_BEGAN)

    def leave(self) -> None:
        """Leave the innermost section (nothing if none is open)."""
        now = _monotonic_ns()
        with self._lock:
            if self._closed or not self._stack:
                return
            self._account(now)
            name, _encoded, entered = self._stack.pop()
            if name == CHECKPOINT:
                self._last_ckpt = now - entered
                self._max_ckpt = max(self._max_ckpt, self._last_ckpt)
                self._ckpts += 1
            self._return_to_outer(now)
            self._publish(now)

    def heartbeat(self, step: int | None = None, section: str | None = None) -> None:
        """One coarse report: completes ``step`` if it is new, then sets the top-level
        section to ``section`` if it differs; the same step and section again only
        refresh the update time (it is no progress)."""
        now = _monotonic_ns()
        with self._lock:
            if self._closed:
                return
            if step is not None and step != self._step:
                self._complete(step, now)
            if section is not None and encode_section(section) != self._section:
                self._account(now)
                self._stack.clear()
                self._section = encode_section(section)
                self._in_waiting = section in self._waiting
                self._section_started = now
            self._publish(now)

    # ------------------------------------------------------------------ lifecycle

    def close(self, *, exited: bool = True) -> None:
        """Stop reporting. ``exited``: mark the record so the server says ``exited`` (a
        finished process is not a hung one); False leaves it as it is (``heartbeat``)."""
        self._pulse_stop.set()
        with self._lock:
            if self._closed:
                return
            if exited:
                self._state = STATE_EXITED
                self._publish(_monotonic_ns())
            self._closed = True
            self._writer.close()
        _LIVE.discard(self)

    def _forget_after_fork(self) -> None:
        """In a forked child (DataLoader workers): stop writing, never touch the record."""
        self._closed = True
        self._lock = threading.Lock()
        self._pulse_stop = threading.Event()  # the parent's may be held; no pulse here
        self._pulse_stop.set()

    # ------------------------------------------------------------------ internals

    def _account(self, now: int) -> None:
        if self._in_waiting:
            self._wait += now - self._section_started

    def _complete(self, step: int, now: int) -> None:
        self._account(now)
        previous, at = self._step, self._step_done_at
        if previous is not None and at and step > previous:
            n = step - previous
            self._last_step = (now - at) // n
            self._last_wait = min(self._wait, now - at) // n
            self._steps.append(self._last_step)
            self._waits.append(self._last_wait)
            self._ring = ring_values(self._steps, self._waits)
        self._wait = 0
        self._step = step
        self._completed += 1
        self._step_done_at = now
        self._section_started = now
        if not self._stack:
            self._section = encode_section(STEP)

    def _return_to_outer(self, now: int) -> None:
        if self._stack:
            name, encoded, _entered = self._stack[-1]
            self._section = encoded
            self._in_waiting = name in self._waiting
        else:
            self._section = encode_section(START if self._step is None else STEP)
            self._in_waiting = False
        self._section_started = now

    def _publish(self, now: int) -> None:
        self._writer.write(
            (
                self._rank, self._local_rank, self._pid, self._restart, self._state,
                -1 if self._step is None else self._step, self._completed, self._started,
                self._section_started, now, _wall_ns(), self._step_done_at, self._last_step,
                self._last_wait, self._last_ckpt, self._max_ckpt, self._ckpts,
                *self._ring, self._section,
            )
        )  # fmt: skip


class NullProgress:
    """What the module-level calls use without ``RTJ_PROGRESS_DIR``: every call a no-op."""

    path = None

    def step_done(self, step: int) -> None:
        return None

    def section(self, name: str) -> contextlib.nullcontext[None]:
        return _NULL_SECTION

    def enter(self, name: str) -> None:
        return None

    def leave(self) -> None:
        return None

    def heartbeat(self, step: int | None = None, section: str | None = None) -> None:
        return None

    def mark(self, name: ms.Milestone, step: int | None = None) -> None:
        return None

    def note_save(self, tier: sc.SaveTier, seconds: float) -> None:
        return None

    def close(self, *, exited: bool = True) -> None:
        return None


_NULL_SECTION: contextlib.nullcontext[None] = contextlib.nullcontext()
NULL = NullProgress()
_LIVE: weakref.WeakSet[Progress] = weakref.WeakSet()
_current: Progress | NullProgress | None = None
_current_lock = threading.Lock()


def _pulse(ref: weakref.ReferenceType[Progress], seconds: float, stop: threading.Event) -> None:
    """The pulse thread: ``heartbeat()`` (the update time only) every ``seconds`` until
    the Progress is closed or gone."""
    while not stop.wait(seconds):
        progress = ref()
        if progress is None:
            return
        progress.heartbeat()
        del progress


def _close_at_exit(ref: weakref.ReferenceType[Progress]) -> None:
    progress = ref()
    if progress is not None:
        progress.close()


def _after_fork_in_child() -> None:
    global _current
    for progress in list(_LIVE):
        progress._forget_after_fork()
    if _current is not None and _current is not NULL:
        _current = NULL


os.register_at_fork(after_in_child=_after_fork_in_child)


# ---------------------------------------------------------------------- module level


def current() -> Progress | NullProgress:
    """This process's Progress: the one ``install``ed, else ``Progress.from_env()`` on
    first use, else :data:`NULL`. A record that cannot be created is logged once and
    reporting is off: progress never fails training."""
    global _current
    found = _current
    if found is not None:
        return found
    with _current_lock:
        if _current is None:
            try:
                _current = Progress.from_env() or NULL
            except (OSError, ValueError) as exc:
                log.warning("progress reporting is off: %s", exc)
                _current = NULL
        return _current


def install(progress: Progress | NullProgress | None) -> None:
    """Use ``progress`` for the module-level calls (None: decide again from the environment
    on next use). For tests and for jobs that build their Progress themselves."""
    global _current
    with _current_lock:
        _current = progress


def step_done(step: int) -> None:
    """``current().step_done(step)``."""
    current().step_done(step)


def section(name: str) -> _Section | contextlib.nullcontext[None]:
    """``current().section(name)``: ``with progress.section("forward"): ...``."""
    return current().section(name)


def reports_section(name: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorator: every call of the function runs inside ``section(name)`` of the
    process's Progress, looked up at call time (``Checkpointer.save``: ``checkpoint``)."""

    def decorate(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            with current().section(name):
                return fn(*args, **kwargs)

        return wrapper

    return decorate
