"""bench.checkpoint_protocol's sources: the shapes of a step (1 file of 4 GiB, 8 of 128 MiB,
64 of 16 MiB; smaller with ``--quick``), their files written once and read into the page
cache, and the room they need."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.checkpoint_protocol_report import Report, fmt_size
from bench.common import GiB, MiB, fsync_path
from rtj_shim.checkpoint.storage.base import CHUNK_BYTES

RUN_ID = "bench-run"
SOURCE_BLOCK = 64 * MiB  # random bytes written once and repeated to build large sources


@dataclass(frozen=True)
class Shape:
    files: int
    file_bytes: int

    @property
    def total(self) -> int:
        return self.files * self.file_bytes

    @property
    def tag(self) -> str:
        return f"{self.files}x{fmt_size(self.file_bytes).replace(' ', '')}"

    @property
    def text(self) -> str:
        return f"{self.files} x {fmt_size(self.file_bytes)}"


SHAPES = (Shape(1, 4 * GiB), Shape(8, 128 * MiB), Shape(64, 16 * MiB))
QUICK_SHAPES = (Shape(1, 128 * MiB), Shape(8, 16 * MiB), Shape(64, 2 * MiB))


def write_source_file(path: Path, size: int, block: bytes) -> None:
    with path.open("wb") as fh:
        left = size
        while left:
            n = min(left, len(block))
            fh.write(block[:n] if n < len(block) else block)
            left -= n
        fh.flush()
        os.fsync(fh.fileno())


def make_source(directory: Path, shape: Shape, block: bytes) -> list[tuple[str, Path]]:
    directory.mkdir(parents=True)
    files = []
    for i in range(shape.files):
        rel = f"shard-{i:02d}.bin"
        write_source_file(directory / rel, shape.file_bytes, block)
        files.append((rel, directory / rel))
    fsync_path(directory, directory=True)
    return files


def warm(paths: Sequence[Path]) -> None:
    """Read every file once so every method reads it from the page cache."""
    for path in paths:
        with path.open("rb", buffering=0) as fh:
            while fh.read(CHUNK_BYTES):
                pass


def need_disk(where: Path, needed: int, what: str, report: Report) -> bool:
    """Room for ``needed`` bytes and a margin of as much again (the page cache, the rest)."""
    free = shutil.disk_usage(where).free
    if free < 2 * needed:
        report.note(
            f"SKIPPED {what}: {free / GiB:.1f} GiB free, needs 2 x {needed / GiB:.1f} GiB "
            f"= {2 * needed / GiB:.1f} GiB"
        )
        return False
    return True


def rmtree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def make_sources(report: Report, work: Path, shapes: Sequence[Shape]) -> list[tuple[Shape, Path]]:
    """One source directory per shape that fits on the disk (skipped shapes are noted)."""
    block = os.urandom(SOURCE_BLOCK)
    sources = []
    for shape in shapes:
        if not need_disk(work, 2 * shape.total, f"the {shape.text} shape", report):
            continue
        start = time.perf_counter()
        make_source(work / f"src-{shape.tag}", shape, block)
        print(f"  source {shape.text}: written and fsynced in {time.perf_counter() - start:.1f} s")
        sources.append((shape, work / f"src-{shape.tag}"))
    return sources
