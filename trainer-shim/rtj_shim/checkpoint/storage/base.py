"""The storage contract every backend implements, and the order the protocol calls it in.

Call order of one publish (see :mod:`rtj_shim.checkpoint.protocol`):

1. ``put_if(RUN_FILE, ...)`` claims or confirms run ownership.
2. ``begin_step(step, attempt, fresh=True)`` opens an in-progress area that no resolver
   reads; other ranks join it with ``fresh=False``.
3. ``StepWriter.write_file`` / ``copy_file`` stream every shard, hashing while writing,
   and make it durable before returning its :class:`FileEntry`.
4. ``StepWriter.commit(manifest, committed)`` makes the step visible atomically: after it
   returns the step is published; if it fails or the process dies, it is not.
5. ``put_if(LATEST_FILE, ...)`` moves the hint forward (conditional write).
6. With a retention policy: ``list_step_dirs`` and shallow verification of each step, then
   ``delete_step_dir`` for every step the plan drops.

Backends only move bytes and report what is there; every decision lives in pure modules.
Errors reading or writing the store raise :class:`rtj_shim.errors.StoreError`; a key that
does not exist is an ordinary ``None``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from rtj_shim.checkpoint.layout import StepDirName
from rtj_shim.checkpoint.manifest import FileEntry

CHUNK_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class StepDirEntry:
    name: StepDirName
    modified: float | None  # seconds since the epoch; None where the backend cannot tell


# Opaque token a backend hands out with a read and checks on a conditional write
# (an S3 ETag; inode and mtime on a filesystem).
Version = str


class StepWriter(Protocol):
    @property
    def step(self) -> int: ...

    def write_file(self, path: str, chunks: Iterable[bytes]) -> FileEntry:
        """Stream ``chunks`` into ``path`` inside the step, hash while writing, make it durable."""

    def copy_file(self, path: str, source: Path) -> FileEntry:
        """Stream a local file into ``path`` inside the step (bounded memory)."""

    def commit(self, manifest: bytes, committed: bytes) -> None:
        """Write manifest then COMMITTED and make the step visible atomically."""

    def close(self) -> None:
        """Release this writer's resources and keep what it wrote (a rank that joined the
        step and finished its files closes; the coordinator commits)."""

    def abort(self) -> None:
        """Drop what this writer wrote; safe after a failure, and a no-op after a successful
        ``commit`` (a published step is never touched)."""


class CheckpointStore(Protocol):
    @property
    def uri(self) -> str: ...

    def root_exists(self) -> bool:
        """False only when the root does not exist yet; unreadable roots raise StoreError."""

    def read(self, key: str) -> bytes | None: ...

    def read_versioned(self, key: str) -> tuple[bytes | None, Version | None]: ...

    def put_if(self, key: str, data: bytes, expected: Version | None) -> bool:
        """Write ``key`` only if it still has version ``expected`` (None: only if absent)."""

    def list_step_dirs(self) -> list[StepDirEntry]: ...

    def list_files(self, name: StepDirName) -> dict[str, int]:
        """Every file under a step directory (relative path -> size), reserved files included."""

    def sha256(self, name: StepDirName, path: str) -> str: ...

    def begin_step(self, step: int, attempt: str, *, fresh: bool = True) -> StepWriter:
        """Open the in-progress area of ``step``. ``fresh`` clears leftovers of a crashed
        writer; ``fresh=False`` joins the area the coordinator opened. On a filesystem the
        area is ``steps/step-N.tmp-<attempt>/``; S3 has no rename, so shards go straight
        under the step's prefix and an uncommitted step simply lacks COMMITTED."""

    def delete_step_dir(self, name: StepDirName) -> None:
        """Unpublish first (``COMMITTED`` goes, durably, before anything else), then delete
        the rest, so an interrupted deletion never leaves a step that resolves."""

    def key_uri(self, key: str) -> str: ...
