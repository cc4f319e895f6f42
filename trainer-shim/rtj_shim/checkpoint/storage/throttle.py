"""Durable checkpoint writes that do not starve training: a save's bytes leave the node at
most at ``RTJ_MAX_WRITE_BYTES_PER_SECOND`` (``spec.checkpoint.maxWriteBytesPerSecond``;
``IoOptions.max_write_bytes_per_second``), so a background save never takes more of the
node's network or disk than the job allows its all-reduce and data loader to lose.

One token bucket per process, shared by every writer thread of the save: a chunk of ``n``
bytes waits until the bucket holds ``n`` tokens (refilled at the rate, holding at most one
second's worth: a save after an idle minute does not burst a minute's worth). A file copied
from local disk goes through the same paced chunks instead of ``sendfile`` while a limit is
set. An emergency save (SIGTERM, its deadline running) is never paced: ``unpaced()`` says
when, and the bucket lets everything through from then on.

Reads (restores) are not paced: nothing trains while a restore runs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, cast

from rtj_shim.checkpoint.manifest import FileEntry
from rtj_shim.checkpoint.storage.base import CHUNK_BYTES, CheckpointStore, StepWriter

PACED_CHUNK_BYTES = 1 << 20
"""Chunks are paced in pieces of at most this much: a 32 MiB shard at 50 MiB/s waits in
20 ms steps, not in one 0.6 s stall after a burst."""


class TokenBucket:
    """`rate` bytes a second, holding at most `burst` bytes of credit."""

    def __init__(
        self,
        rate: float,
        burst: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        unpaced: Callable[[], bool] = lambda: False,
    ) -> None:
        if not rate > 0:
            raise ValueError(f"rate: expected bytes per second > 0, got {rate!r}")
        self.rate = float(rate)
        self.burst = float(burst) if burst is not None else self.rate
        self._clock, self._sleep, self._unpaced = clock, sleep, unpaced
        self._tokens = self.burst
        self._at = clock()
        self._lock = threading.Lock()
        self.waited = 0.0
        """Seconds the writers were held, in all (for reports and tests)."""

    @property
    def unpaced(self) -> bool:
        """Whether writes go at full speed now (an emergency save's deadline runs)."""
        return self._unpaced()

    def take(self, nbytes: int) -> None:
        """Wait until `nbytes` may go (a request above the burst waits for its share)."""
        if nbytes <= 0 or self.unpaced:
            return
        with self._lock:  # one writer refills and reserves at a time; the waits overlap
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now
            self._tokens -= nbytes
            wait = -self._tokens / self.rate if self._tokens < 0 else 0.0
            self.waited += wait
        if wait > 0:
            self._sleep(wait)


def paced(chunks: Iterable[bytes], bucket: TokenBucket) -> Iterator[bytes | memoryview]:
    """`chunks` as pieces of at most PACED_CHUNK_BYTES, each let through by `bucket`."""
    for chunk in chunks:
        view = memoryview(chunk).cast("B")
        for start in range(0, view.nbytes, PACED_CHUNK_BYTES):
            piece = view[start : start + PACED_CHUNK_BYTES]
            bucket.take(piece.nbytes)
            yield piece


def _file_chunks(source: Path) -> Iterator[bytes]:
    with open(source, "rb") as fh:
        while chunk := fh.read(CHUNK_BYTES):
            yield chunk


class ThrottledWriter:
    """A step writer whose file writes are paced by a bucket (commit markers are not)."""

    def __init__(self, inner: StepWriter, bucket: TokenBucket) -> None:
        self._inner, self._bucket = inner, bucket

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def write_file(self, path: str, chunks: Iterable[bytes]) -> FileEntry:
        return self._inner.write_file(path, cast(Iterable[bytes], paced(chunks, self._bucket)))

    def copy_file(self, path: str, source: Path) -> FileEntry:
        if self._bucket.unpaced:
            return self._inner.copy_file(path, source)
        if not source.is_file() or source.is_symlink():
            return self._inner.copy_file(path, source)  # the backend refuses it, naming it
        return self.write_file(path, _file_chunks(source))


class ThrottledStore:
    """`inner` with every step writer it opens paced by `bucket`."""

    def __init__(self, inner: CheckpointStore, bucket: TokenBucket) -> None:
        self.inner, self.bucket = inner, bucket

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def begin_step(self, step: int, attempt: str, *, fresh: bool = True) -> StepWriter:
        writer = self.inner.begin_step(step, attempt, fresh=fresh)
        return cast(StepWriter, ThrottledWriter(writer, self.bucket))


def throttled(
    store: CheckpointStore, bytes_per_second: int | None, unpaced: Callable[[], bool]
) -> CheckpointStore:
    """`store` paced to `bytes_per_second` (None: as it is)."""
    if bytes_per_second is None:
        return store
    return cast(
        CheckpointStore, ThrottledStore(store, TokenBucket(bytes_per_second, unpaced=unpaced))
    )


def unwrapped(store: CheckpointStore) -> CheckpointStore:
    """The backend under any pacing (what a restore reads, unpaced, from its own files)."""
    return store.inner if isinstance(store, ThrottledStore) else store
