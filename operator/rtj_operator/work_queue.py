"""client-go's workqueue semantics on asyncio: one reconcile per key at a time, coalesced
adds, delayed requeues (backoffs, TTLs) and rate-limited retries after errors."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

Key = tuple[str, str]
ERROR_BACKOFF = (0.1, 30.0)
"""Retry delay after a failed reconcile: 0.1 s doubling per failure in a row, at most 30 s."""


class WorkQueue:
    """client-go's workqueue semantics on asyncio: a key is processed by one worker at a time;
    adding a key that is queued is a no-op, adding one being processed re-queues it after."""

    def __init__(self, on_wait: Callable[[float], None] | None = None) -> None:
        self._queue: asyncio.Queue[Key] = asyncio.Queue()
        self._on_wait = on_wait
        """Told how long each key waited from being queued to a worker taking it."""
        self._queued_at: dict[Key, float] = {}
        self._dirty: set[Key] = set()
        self._processing: set[Key] = set()
        self._timers: dict[Key, tuple[float, asyncio.TimerHandle]] = {}
        self._failures: dict[Key, int] = {}

    def __len__(self) -> int:
        return len(self._dirty)

    def add(self, key: Key) -> None:
        if key in self._dirty:
            return
        self._dirty.add(key)
        self._queued_at.setdefault(key, time.monotonic())
        if key not in self._processing:
            self._queue.put_nowait(key)

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
        key = await self._queue.get()
        self._processing.add(key)
        self._dirty.discard(key)
        queued = self._queued_at.pop(key, None)
        if queued is not None and self._on_wait is not None:
            self._on_wait(time.monotonic() - queued)
        return key

    def done(self, key: Key) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._queue.put_nowait(key)
