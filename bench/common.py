"""What the micro-benchmarks share (no torch here): where they work, the units, medians and
percentiles, quiet timing, the page cache and the mounts of the machine they run on.

Used by bench.checkpoint_protocol, bench.torch_state and bench.fast_tier.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import math
import os
import socket
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH_DIR = REPO / ".bench"
"""Where the benchmarks write (the repository's filesystem, git-ignored)."""
KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30


def med(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def p90(xs: Sequence[float]) -> float:
    """Nearest rank: with fewer than 10 samples, the largest."""
    ordered = sorted(xs)
    return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]


def loadavg_text() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def prefault(nbytes: int) -> None:
    """Touch and free ``nbytes`` of anonymous memory right before a timed run.

    On a VM with free page reporting (virtio-balloon), memory freed a few seconds ago (the
    previous run's destination files) goes back to the host, and a run that fills the page
    cache with it pays host page faults (seen here as seconds of extra system time). Touching
    the memory first lowers the odds for every method alike; it does not remove them."""
    if nbytes > 0:
        block = b"\x01" * nbytes
        del block


def quiesce(prefault_bytes: int = 0, *, collect: bool = False) -> None:
    """Before a timed run: with ``collect``, no garbage left to collect; every dirty page
    flushed, so no measurement pays for another's writeback; then ``prefault``."""
    if collect:
        gc.collect()
    os.sync()
    prefault(prefault_bytes)


def timed(fn: Callable[[], object]) -> float:
    """Wall seconds of ``fn`` after ``quiesce(collect=True)``."""
    quiesce(collect=True)
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def fsync_path(path: Path, directory: bool = False) -> None:
    flags = os.O_RDONLY | (os.O_DIRECTORY if directory else 0)
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_file(path: Path, chunk_bytes: int = MiB) -> str:
    """One SHA-256 pass over the file, ``chunk_bytes`` a read, unbuffered."""
    digest = hashlib.sha256()
    with path.open("rb", buffering=0) as fh:
        while chunk := fh.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


def evict(paths: Iterable[Path]) -> None:
    """Drop these files' pages (every file under a directory) from the page cache; they are
    clean (fsynced), so the next read comes from the disk, as the first restore after a
    restart or a node loss does. Nothing else on the machine is touched (no drop_caches)."""
    for path in paths:
        for file in [path] if path.is_file() else path.rglob("*"):
            if file.is_file():
                fd = os.open(file, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)


def mount_of(path: Path) -> dict[str, str]:
    """The mount ``path`` is on (the longest mount point above it): mount, device, fstype
    and options; "?" for each when /proc/mounts cannot be read."""
    best = {"mount": "?", "device": "?", "fstype": "?", "options": "?"}
    resolved = str(path.resolve())
    longest = -1
    with contextlib.suppress(OSError), open("/proc/mounts") as fh:
        for line in fh:
            fields = line.split()
            if len(fields) < 4:
                continue
            device, mount, fstype, options = fields[:4]
            mount = mount.replace("\\040", " ")
            inside = resolved == mount or resolved.startswith(mount.rstrip("/") + "/")
            if inside and len(mount) > longest:
                longest = len(mount)
                best = {"mount": mount, "device": device, "fstype": fstype, "options": options}
    return best


def free_port() -> int:
    """A TCP port free on loopback now (a gloo world's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
