"""Child process for the filesystem crash-consistency test: publish one step, stop on request.

Run as ``python crash_publisher.py --root R --step N --attempt A --stop POINT --reached F
--trace T``. It publishes ``N`` through ``CommitProtocol`` (begin, write_file per shard,
publish) and, on its way, names every protocol point it passes. The package is not changed:
this process alone wraps a few functions of ``rtj_shim.checkpoint.storage.filesystem`` (its ``os``
module reference, ``fsync_dir``, ``_rename_noreplace``, ``FilesystemStepWriter._write`` and
``commit``, ``FilesystemStore.begin_step``) so that each call announces itself before and
after it runs.

When the point named by ``--stop`` is reached, the process writes ``--reached`` (atomically)
and sleeps until it is killed. A point ``write:<path>:at:<offset>`` stops inside the shard
``path`` after exactly ``offset`` bytes were handed to the store. Without ``--stop`` it
publishes to the end and exits 0; ``--trace`` then lists every point in order. If the
requested point is never reached the process exits with status 3.

The test imports this file too (by path) for the shard contents and ``publish_step``.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import os
import random
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rtj_shim.checkpoint.protocol import CommitProtocol, PublishResult, StepMetadata
from rtj_shim.checkpoint.storage import filesystem as fs

RUN_ID = "run-crash"
CHUNK = 64 * 1024
# Several shards in nested directories; sizes are not multiples of the chunk size.
SHARDS: tuple[tuple[str, int], ...] = (
    ("model/rank-0.bin", 3 * 1024 * 1024 + 517),
    ("optim/rank-0.bin", 1024 * 1024 + 33),
    ("state.json", 211),
)
NEVER_REACHED = 3


def shard_bytes(step: int, index: int) -> bytes:
    """Deterministic contents of shard ``index`` of ``step`` (different for every step)."""
    size = SHARDS[index][1]
    return random.Random(step * 1000 + index).randbytes(size)


def chunked(
    data: bytes, cut: int | None = None, at_cut: Callable[[], None] | None = None
) -> Iterator[bytes]:
    """Yield ``data`` in CHUNK pieces, also split at ``cut``; ``at_cut()`` runs there.

    A generator resumes only after its consumer finished with the previous piece, so when
    ``at_cut()`` runs the store has written exactly the first ``cut`` bytes of the shard.
    """
    bounds = sorted({*range(0, len(data), CHUNK), len(data), *([cut] if cut is not None else [])})
    for start, end in itertools.pairwise(bounds):
        if start == cut and at_cut is not None:
            at_cut()
        yield data[start:end]
    if cut == len(data) and at_cut is not None:
        at_cut()


def publish_step(
    protocol: CommitProtocol,
    step: int,
    shard_cut: tuple[str, int] | None = None,
    at_cut: Callable[[], None] | None = None,
    after_shards: Callable[[], None] | None = None,
) -> PublishResult:
    """Publish ``step`` with the SHARDS contents through begin / write_file / publish.

    ``at_cut()`` runs inside the write of shard ``shard_cut[0]`` once exactly
    ``shard_cut[1]`` of its bytes were written.
    """
    writer = protocol.begin(step)
    entries = []
    for index, (path, _size) in enumerate(SHARDS):
        cut = shard_cut[1] if shard_cut is not None and shard_cut[0] == path else None
        entries.append(writer.write_file(path, chunked(shard_bytes(step, index), cut, at_cut)))
    if after_shards is not None:
        after_shards()
    return protocol.publish(writer, entries, StepMetadata(extra={"crash_test": True}))


class Points:
    """Names each protocol point (``name#2`` for a repeat) and stops at the requested one."""

    def __init__(self, stop: str | None, reached: Path | None, trace: Path | None) -> None:
        self.stop = stop
        self.reached = reached
        self.trace = trace.open("a", encoding="utf-8") if trace is not None else None
        self.seen: collections.Counter[str] = collections.Counter()
        self.stopped = False

    def __call__(self, name: str) -> None:
        self.seen[name] += 1
        if self.seen[name] > 1:
            name = f"{name}#{self.seen[name]}"
        if self.trace is not None:
            self.trace.write(name + "\n")
            self.trace.flush()
        if name == self.stop:
            self.wait_for_kill(name)

    def wait_for_kill(self, name: str) -> None:
        assert self.reached is not None
        self.stopped = True
        tmp = self.reached.with_name(self.reached.name + ".tmp")
        tmp.write_text(f"{name}\n{os.getpid()}\n", encoding="utf-8")
        os.replace(tmp, self.reached)
        while True:  # the parent SIGKILLs us here
            time.sleep(60)


class _OsProxy:
    """Stands in for ``os`` inside rtj_shim.checkpoint.storage.filesystem; announces link and
    replace."""

    def __init__(self, point: Points) -> None:
        self._point = point

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def link(self, src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        key = Path(os.fsdecode(dst)).name
        self._point(f"link:{key}:before")
        os.link(src, dst, *args, **kwargs)
        self._point(f"link:{key}:after")

    def replace(self, src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        key = Path(os.fsdecode(dst)).name
        self._point(f"replace:{key}:before")
        os.replace(src, dst, *args, **kwargs)
        self._point(f"replace:{key}:after")


def install_points(point: Points, root: Path) -> None:
    """Wrap the filesystem backend's calls in this process only."""

    def rel(path: Path) -> str:
        return Path(os.path.relpath(path, root)).as_posix()

    real_fsync_dir = fs.fsync_dir

    def fsync_dir(path: Path) -> None:
        point(f"fsync_dir:{rel(path)}:before")
        real_fsync_dir(path)
        point(f"fsync_dir:{rel(path)}:after")

    real_rename = fs._rename_noreplace

    def rename_noreplace(src: Path, dst: Path) -> None:
        point("rename:before")
        real_rename(src, dst)
        point("rename:after")

    real_write = fs.FilesystemStepWriter._write

    def write(self: fs.FilesystemStepWriter, path: str, chunks: Any) -> tuple[str, int]:
        point(f"write:{path}:before")
        result = real_write(self, path, chunks)
        point(f"write:{path}:after")
        return result

    real_commit = fs.FilesystemStepWriter.commit

    def commit(self: fs.FilesystemStepWriter, manifest: bytes, committed: bytes) -> None:
        point("commit:before")
        real_commit(self, manifest, committed)
        point("commit:after")

    real_begin = fs.FilesystemStore.begin_step

    def begin_step(self: fs.FilesystemStore, *args: Any, **kwargs: Any) -> Any:
        point("begin_step:before")
        writer = real_begin(self, *args, **kwargs)
        point("begin_step:after")
        return writer

    fs.os = _OsProxy(point)  # type: ignore[assignment]
    fs.fsync_dir = fsync_dir  # type: ignore[assignment]
    fs._rename_noreplace = rename_noreplace  # type: ignore[assignment]
    fs.FilesystemStepWriter._write = write  # type: ignore[method-assign]
    fs.FilesystemStepWriter.commit = commit  # type: ignore[method-assign]
    fs.FilesystemStore.begin_step = begin_step  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--step", type=int, required=True)
    parser.add_argument("--attempt", required=True)
    parser.add_argument("--stop", default=None, help="point to stop at (default: none)")
    parser.add_argument("--reached", type=Path, default=None)
    parser.add_argument("--trace", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.stop is not None and args.reached is None:
        parser.error("--stop needs --reached")

    point = Points(args.stop, args.reached, args.trace)
    install_points(point, Path(os.path.abspath(args.root)))
    protocol = CommitProtocol(fs.FilesystemStore(args.root), run_id=RUN_ID, attempt=args.attempt)

    shard_cut = None
    if args.stop is not None and args.stop.startswith("write:") and ":at:" in args.stop:
        path, offset = args.stop[len("write:") :].rsplit(":at:", 1)
        shard_cut = (path, int(offset))
    # The cut is announced only when asked for: every offset would drown the trace.
    publish_step(
        protocol,
        args.step,
        shard_cut=shard_cut,
        at_cut=lambda: point(args.stop),
        after_shards=lambda: point("shards:done"),
    )
    point("publish:done")
    if args.stop is not None:
        print(f"crash_publisher: point {args.stop!r} was never reached", file=sys.stderr)
        return NEVER_REACHED
    return 0


if __name__ == "__main__":
    sys.exit(main())
