"""client-go's workqueue semantics on asyncio: one reconcile per key at a time, coalesced
adds, delayed requeues (backoffs, TTLs) and rate-limited retries after errors; and two
lanes, so that a change in a job's world is planned before routine looks.

A routine look (`add_routine`: the progress poller's round, the checkpoint refresh, the
periodic resync) re-plans every job on a timer, whether anything happened or not. With many
jobs those looks fill the queue (1,000 jobs, a round every 5 s: 200 a second on a 2-CPU
machine), and a failed pod's plan waited behind them in one line: decisions took 6-11 s
(`bench.operator_scale_jobs`). A change (`add`: a watch event, a node going silent, a
deadline a plan set) now goes ahead of every routine look; a key added both ways is taken
once, in the first lane it is in."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

Key = tuple[str, str]
ERROR_BACKOFF = (0.1, 30.0)
"""Retry delay after a failed reconcile: 0.1 s doubling per failure in a row, at most 30 s."""


class WorkQueue:
    """client-go's workqueue semantics on asyncio: a key is processed by one worker at a time;
    adding a key that is queued is a no-op (a routine key added as a change moves ahead),
    adding one being processed re-queues it after."""

    def __init__(self, on_wait: Callable[[float], None] | None = None) -> None:
        self._changes: deque[Key] = deque()
        self._routine: deque[Key] = deque()
        self._ready = asyncio.Event()
        self._on_wait = on_wait
        """Told how long each key waited from being queued to a worker taking it."""
        self._queued_at: dict[Key, float] = {}
        self._dirty: set[Key] = set()
        self._routine_only: set[Key] = set()
        """Dirty keys added only by routine looks (their place is in the routine lane)."""
        self._processing: set[Key] = set()
        self._timers: dict[Key, tuple[float, asyncio.TimerHandle]] = {}
        self._failures: dict[Key, int] = {}

    def __len__(self) -> int:
        return len(self._dirty)

    def add(self, key: Key) -> None:
        """A change in the key's world: planned before every routine look."""
        if key in self._dirty and key not in self._routine_only:
            return
        self._routine_only.discard(key)  # queued for a routine look: it moves ahead
        self._dirty.add(key)
        self._queued_at.setdefault(key, time.monotonic())
        if key not in self._processing:  # else `done` queues it again
            self._push(self._changes, key)

    def add_routine(self, key: Key) -> None:
        """A routine look at the key (nothing known to have changed): after every change."""
        if key in self._dirty:
            return
        self._dirty.add(key)
        self._routine_only.add(key)
        self._queued_at.setdefault(key, time.monotonic())
        if key not in self._processing:
            self._push(self._routine, key)

    def _push(self, lane: deque[Key], key: Key) -> None:
        lane.append(key)
        self._ready.set()

    def _take(self) -> Key | None:
        """The first key ready to hand out, changes first. A lane may hold a key twice or
        one no longer due (moved to the other lane, taken, or being processed): skipped."""
        for lane in (self._changes, self._routine):
            while lane:
                key = lane.popleft()
                if key not in self._dirty or key in self._processing:
                    continue
                if lane is self._changes and key in self._routine_only:
                    continue  # it became routine again after it was taken: its own place
                return key
        return None

    def add_after(self, key: Key, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        due = loop.time() + delay
        current = self._timers.get(key)
        if current is not None:
            if current[0] <= due:
                return
            current[1].cancel()
        handle = loop.call_at(due, self._fire, key)
        self._timers[key] = (due, handle)

    def _fire(self, key: Key) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def add_rate_limited(self, key: Key) -> float:
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        delay = float(min(ERROR_BACKOFF[0] * 2.0 ** min(failures, 16), ERROR_BACKOFF[1]))
        self.add_after(key, delay)
        return delay

    def forget_failures(self, key: Key) -> None:
        self._failures.pop(key, None)

    def forget(self, key: Key) -> None:
        self._queued_at.pop(key, None)
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer[1].cancel()
        self._failures.pop(key, None)

    async def get(self) -> Key:
        while (key := self._take()) is None:
            self._ready.clear()
            await self._ready.wait()
        self._processing.add(key)
        self._dirty.discard(key)
        self._routine_only.discard(key)
        queued = self._queued_at.pop(key, None)
        if queued is not None and self._on_wait is not None:
            self._on_wait(time.monotonic() - queued)
        return key

    def done(self, key: Key) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._push(self._routine if key in self._routine_only else self._changes, key)
