"""Moving a file's bytes into a file descriptor while hashing them: the filesystem data paths.

Two sources, one rule: the SHA-256 a :class:`~rtj_shim.checkpoint.manifest.FileEntry` records is of
exactly the bytes written, computed in the same pass that writes them (never a second read
of the finished file), by one helper thread per writer, so that hashing (user time) and
copying (kernel time) run on two cores at once. hashlib releases the GIL for buffers over
2 KiB, and so do ``write``, ``sendfile`` and ``mmap``.

* :func:`write_hashed`: chunks the caller owns (``StepWriter.write_file``; torch.save
  streaming through a rendezvous). Each chunk is hashed by the helper thread while the
  calling thread writes it, and the next chunk is taken only when both are done, so the
  caller may reuse its memory and a generator knows exactly how many bytes were written
  when it resumes. Nothing is buffered here.
* :func:`copy_hashed`: a local file (``StepWriter.copy_file``). The kernel copies it as
  ``shutil.copyfile`` does (``sendfile``, as much as Linux moves per call: the bytes never
  pass through user memory), and the helper thread hashes the destination from its page
  cache (``mmap``, one :data:`~rtj_shim.checkpoint.storage.base.CHUNK_BYTES` window at a time) as
  it grows, so the digest is of the bytes in the destination file. The copy is faster
  than SHA-256 and waits before running more than two calls ahead. Where the kernel
  cannot copy between these two files, two reused buffers carry the bytes (one is read
  while the other is hashed and written).

  Few large calls, not a call per window: on the VM the benchmarks run on (its host takes
  freed memory back: virtio-balloon free page reporting), copying a 4 GiB file in calls
  of 8 MiB to 1.5 GiB cost 2-3x the system time of calls of ``MAX_CALL_BYTES``, the size
  ``shutil.copyfile`` uses (measured, all of it in the kernel's memcpy into the page
  cache; the cause is the host's, not understood here). The price: a signal waits for
  the call in progress (well under a second), and writeback starts per call.

Both start writeback of what they wrote at once (``sync_file_range``, a hint only), so the
disk writes while the CPU hashes and the fsync that makes the file durable, which the
caller still does, finds little left. Memory: no buffer at all for chunks the caller owns;
one mapped window of :data:`~rtj_shim.checkpoint.storage.base.CHUNK_BYTES` at a time for a copy (two
reused buffers of that size on the fallback path).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import mmap
import os
import threading
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from rtj_shim.checkpoint.storage.base import CHUNK_BYTES

MAX_CALL_BYTES = 0x7FFFF000  # what Linux moves in one read/write/sendfile call at most
WRITEBACK_MIN = 1 << 20  # start writeback once this much was written since the last start
_POLL_S = 0.001  # how long a hash that caught up with the copy waits before looking again

# sendfile between these two files is not possible: copy through buffers instead.
_NO_KERNEL_COPY = frozenset(
    {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.ESPIPE}
)
_SYNC_FILE_RANGE_WRITE = 2
HASH_INLINE_BELOW = 64 << 10  # ~60 us of SHA-256 here: about what a handoff costs
_sync_file_range: Any = None
with contextlib.suppress(OSError, AttributeError):
    _sync_file_range = ctypes.CDLL(None, use_errno=True).sync_file_range
    _sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    _sync_file_range.restype = ctypes.c_int


def start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Let the disk start on a range now, so writeback overlaps hashing instead of waiting
    for the final fsync. Only a hint (errors ignored): fsync still makes the file durable."""
    if _sync_file_range is not None and nbytes > 0:
        _sync_file_range(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_hashed(
    fd: int, chunks: Iterable[bytes | memoryview], pool: ThreadPoolExecutor
) -> tuple[str, int]:
    """Write ``chunks`` to ``fd`` while ``pool`` (one thread) hashes each one; returns
    (sha256 hex, bytes). A chunk is done, written and hashed, before the next is taken.
    A chunk under ``HASH_INLINE_BELOW`` is hashed here: handing it over cost more than
    hashing it (a manifest, a skeleton, a small fast-tier step's files)."""
    digest = hashlib.sha256()
    size = started = 0
    for chunk in chunks:
        view = memoryview(chunk).cast("B")
        if view.nbytes < HASH_INLINE_BELOW:
            digest.update(view)
            write_all(fd, view)
            size += view.nbytes
            continue
        hashed = pool.submit(digest.update, view)
        try:
            write_all(fd, view)
        finally:
            hashed.result()  # never leave the hash reading a chunk the caller may reuse
        size += view.nbytes
        if size - started >= WRITEBACK_MIN:
            start_writeback(fd, started, size - started)
            started = size
    start_writeback(fd, started, size - started)
    return digest.hexdigest(), size


def copy_hashed(
    source: int,
    target: int,
    pool: ThreadPoolExecutor,
    chunk: int = CHUNK_BYTES,
    call_bytes: int = MAX_CALL_BYTES,
) -> tuple[str, int]:
    """Copy ``source`` from its start to its end into ``target`` (opened for reading and
    writing, empty) and hash what ``target`` then holds; returns (sha256 hex, bytes).

    The kernel copies in calls of ``call_bytes`` (as much as Linux moves in one call, as
    ``shutil.copyfile`` does); ``pool``'s thread hashes the destination ``chunk`` by
    ``chunk`` as it grows, and the copy waits before a call that would put it more than
    two calls ahead of the hash."""
    digest = hashlib.sha256()
    progress = _Progress()
    hashing = pool.submit(_hash_behind, target, digest, chunk, progress)
    copied = 0
    try:
        while True:
            progress.wait_hashed(copied - call_bytes)
            try:
                got = os.sendfile(target, source, copied, call_bytes)
            except OSError as exc:
                if copied == 0 and exc.errno in _NO_KERNEL_COPY:
                    progress.stop()
                    hashing.result()
                    return _copy_buffered(source, target, pool, chunk)
                raise
            if got == 0:
                break
            start_writeback(target, copied, got)  # this thread waits for the hash anyway
            copied += got
        progress.finish(copied)
        hashed = hashing.result()
    except BaseException:
        progress.stop()  # no hash may still read a descriptor the caller closes
        with contextlib.suppress(Exception):
            hashing.result()
        raise
    if hashed != copied:  # pragma: no cover - a broken invariant, never a disk error
        raise OSError(errno.EIO, f"hashed {hashed} of {copied} bytes copied")
    return digest.hexdigest(), copied


class _Progress:
    """What the copy and the hash of one file know of each other."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self.final: int | None = None  # bytes copied, once the copy is complete
        self.stopped = False  # the copy failed: the hash stops
        self.hashed = 0

    def finish(self, total: int) -> None:
        with self._lock:
            self.final = total
            self._lock.notify_all()

    def stop(self) -> None:
        with self._lock:
            self.stopped = True
            self._lock.notify_all()

    def advance(self, hashed: int) -> None:
        with self._lock:
            self.hashed = hashed
            self._lock.notify_all()

    def wait_hashed(self, position: int) -> None:
        """Until the hash has reached ``position`` (the copy may run two calls ahead)."""
        with self._lock:
            while self.hashed < position and not self.stopped:
                self._lock.wait()

    def wait_copied(self) -> None:
        """A moment for the copy to move on (the hash has caught up with it)."""
        with self._lock:
            if self.final is None and not self.stopped:
                self._lock.wait(_POLL_S)


def _hash_behind(fd: int, digest: Any, chunk: int, progress: _Progress) -> int:
    """Hash ``fd`` from its start, a full ``chunk`` at a time while it is being copied
    (its size grows with every byte the kernel copies), then the rest."""
    ranges = _RangeHasher(fd, digest, chunk)
    hashed = 0
    while not progress.stopped:
        final = progress.final
        end = final if final is not None else os.fstat(fd).st_size
        if end - hashed >= chunk or (final is not None and end > hashed):
            n = min(chunk, end - hashed)
            ranges.hash(hashed, n)
            hashed += n
            progress.advance(hashed)
        elif final is not None:
            break
        else:
            progress.wait_copied()
    return hashed


class _RangeHasher:
    """Feeds ranges of a file, in order, to one digest: through a read-only mapping of the
    range (no copy), or through a reused buffer where the file cannot be mapped."""

    def __init__(self, fd: int, digest: Any, chunk: int) -> None:
        self._fd = fd
        self._digest = digest
        self._chunk = chunk
        self._buffer: bytearray | None = None  # set once mapping failed

    def hash(self, offset: int, nbytes: int) -> None:
        if self._buffer is None:
            try:
                self._hash_mapped(offset, nbytes)
                return
            except (OSError, ValueError):  # a filesystem without mmap: read instead
                self._buffer = bytearray(self._chunk)
        self._hash_read(offset, nbytes)

    def _hash_mapped(self, offset: int, nbytes: int) -> None:
        skip = offset % mmap.ALLOCATIONGRANULARITY
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        window = mmap.mmap(
            self._fd, skip + nbytes, flags=flags, prot=mmap.PROT_READ, offset=offset - skip
        )
        with window, memoryview(window) as view, view[skip:] as data:
            self._digest.update(data)

    def _hash_read(self, offset: int, nbytes: int) -> None:
        assert self._buffer is not None
        end = offset + nbytes
        with memoryview(self._buffer) as buffer:
            while offset < end:
                got = os.preadv(self._fd, [buffer[: min(len(buffer), end - offset)]], offset)
                if got == 0:
                    raise OSError(errno.EIO, f"{end - offset} bytes just written are missing")
                self._digest.update(buffer[:got])
                offset += got


def _settle(pending: deque[Future[None]]) -> None:
    """Cancel what has not started and wait for the rest, its errors ignored (the caller
    is raising its own): afterwards nothing reads a buffer or descriptor any more."""
    for future in pending:
        future.cancel()
    for future in pending:
        if not future.cancelled():
            with contextlib.suppress(Exception):
                future.result()


def _copy_buffered(
    source: int, target: int, pool: ThreadPoolExecutor, chunk: int
) -> tuple[str, int]:
    """Copy through two reused buffers: one is read while the other is hashed (helper
    thread) and written (this thread). The digest is of exactly the buffers written.
    One hash at a time, in order, whatever the number of threads ``pool`` has."""
    digest = hashlib.sha256()
    buffers = (bytearray(chunk), bytearray(chunk))
    hashed: list[Future[None] | None] = [None, None]
    size = 0
    which = 0
    try:
        while True:
            previous = hashed[which]
            if previous is not None:  # this buffer's last hash is done before it is reused
                hashed[which] = None
                previous.result()
            got = os.preadv(source, [buffers[which]], size)
            if got == 0:
                break
            view = memoryview(buffers[which])[:got]
            other = hashed[which ^ 1]
            if other is not None:  # the previous chunk is in the digest before this one
                other.result()
            hashed[which] = pool.submit(digest.update, view)
            write_all(target, view)
            start_writeback(target, size, got)
            size += got
            which ^= 1
        for future in hashed:
            if future is not None:
                future.result()
    finally:
        _settle(deque(f for f in hashed if f is not None))
    return digest.hexdigest(), size
