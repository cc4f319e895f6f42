"""A watcher's `run` coroutine on an event loop of its own (a thread), as the operator runs
its node Lease and Event watches beside kopf's; the test reads what it keeps through
`call` (on the loop's thread, where the watcher applies what it hears)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    def __init__(self, run: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self._loop = asyncio.new_event_loop()
        self._task: asyncio.Task[None] | None = None
        self._thread = threading.Thread(target=self._main, args=(run,), daemon=True)
        self._thread.start()

    def _main(self, run: Callable[[], Coroutine[Any, Any, None]]) -> None:
        async def main() -> None:
            self._task = asyncio.ensure_future(run())
            while not self._task.done():
                await asyncio.sleep(0.2)

        with contextlib.suppress(asyncio.CancelledError):
            self._loop.run_until_complete(main())

    def call(self, fn: Callable[[], T]) -> T:
        async def on_loop() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(on_loop(), self._loop).result(10)

    def stop(self) -> None:
        if self._task is not None:
            self._loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(10)
