"""Checkpoint store on a POSIX filesystem (local disk or a shared RWX volume).

Shards go into ``steps/step-N.tmp-<attempt>/``; publishing writes manifest.json and then
COMMITTED (each fsynced), fsyncs the directories, and renames the tmp directory to its
final name without replacing anything, then fsyncs ``steps/``. Every shard is hashed in
the pass that writes it, by a helper thread beside the write
(:mod:`rtj_shim.checkpoint.storage.pipeline`:
the kernel copies a local file, the hash reads the copy from the page cache), and fsynced
before its FileEntry exists. Deleting a step removes its COMMITTED first, then the rest.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import os
import secrets
import shutil
import stat
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rtj_shim.checkpoint.layout import (
    COMMITTED_FILE,
    MANIFEST_FILE,
    STEPS_DIR,
    StepDirName,
    parse_step_dir,
    step_dir_name,
    tmp_dir_name,
)
from rtj_shim.checkpoint.manifest import FileEntry, confine_path
from rtj_shim.checkpoint.storage.base import CHUNK_BYTES, StepDirEntry, Version
from rtj_shim.checkpoint.storage.pipeline import copy_hashed, write_all, write_hashed
from rtj_shim.errors import Refused, StepAlreadyPublished, StoreError

_RENAME_NOREPLACE = 1
_AT_FDCWD = -100
COPY_STREAMS = 2  # files copy_file may hash at once (CommitProtocol.publish_directory)


@contextlib.contextmanager
def store_errors(what: str) -> Iterator[None]:
    """Translate OS errors into StoreError naming what was being done to which path."""
    try:
        yield
    except OSError as exc:
        where = exc.filename or what
        raise StoreError(f"{what}: {where}: {exc.strerror or exc}") from exc


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _rename_noreplace(src: Path, dst: Path) -> None:
    """Atomic rename that fails with FileExistsError instead of replacing ``dst``."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        renameat2 = None
    if renameat2 is not None:
        rc = renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE)
        if rc == 0:
            return
        err = ctypes.get_errno()
        if err == errno.EEXIST:
            raise FileExistsError(err, os.strerror(err), str(dst))
        if err not in (errno.EINVAL, errno.ENOSYS):
            raise OSError(err, os.strerror(err), str(src))
    # Filesystems without RENAME_NOREPLACE: check first; writers of one root are fenced
    # by run.json, so the window between check and rename has no competitor.
    if dst.exists():
        raise FileExistsError(errno.EEXIST, "File exists", str(dst))
    os.rename(src, dst)


class FilesystemStepWriter:
    def __init__(self, store: FilesystemStore, step: int, tmp: Path) -> None:
        self._store = store
        self._step = step
        self._tmp = tmp
        # One hash thread per file being written: copy_file may run in several threads.
        self._pool = ThreadPoolExecutor(COPY_STREAMS, thread_name_prefix="rtj-hash")

    @property
    def step(self) -> int:
        return self._step

    def _target(self, path: str) -> Path:
        target = self._tmp / confine_path(path)
        if target.parent != self._tmp:
            target.parent.mkdir(parents=True, exist_ok=True)
        return target

    def write_file(self, path: str, chunks: Iterable[bytes]) -> FileEntry:
        sha, size = self._write(path, chunks)
        return FileEntry(path=path, bytes=size, sha256=sha)

    def _write(self, path: str, chunks: Iterable[bytes]) -> tuple[str, int]:
        with store_errors(f"writing {path!r}"):
            target = self._target(path)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                result = write_hashed(fd, chunks, self._pool)
                os.fsync(fd)
            finally:
                os.close(fd)
        return result

    def copy_file(self, path: str, source: Path) -> FileEntry:
        refused = Refused(f"{source}: not a regular file (symlinks and special files are refused)")
        with store_errors(f"reading {source}"):
            if not stat.S_ISREG(source.lstat().st_mode):
                raise refused
            src = os.open(source, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            if not stat.S_ISREG(os.fstat(src).st_mode):  # replaced since the lstat
                raise refused
            sha, size = self._copy(path, src)
        finally:
            os.close(src)
        return FileEntry(path=path, bytes=size, sha256=sha)

    def _copy(self, path: str, source: int) -> tuple[str, int]:
        with store_errors(f"writing {path!r}"):
            target = self._target(path)
            # Read and write: the hash reads back what the kernel copied (page cache).
            fd = os.open(target, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                result = copy_hashed(source, fd, self._pool)
                os.fsync(fd)
            finally:
                os.close(fd)
        return result

    def commit(self, manifest: bytes, committed: bytes) -> None:
        final = self._tmp.parent / step_dir_name(self._step)
        try:
            self._publish(final, manifest, committed)
        finally:
            self.close()

    def _publish(self, final: Path, manifest: bytes, committed: bytes) -> None:
        with store_errors(f"publishing step {self._step}"):
            self._write(MANIFEST_FILE, [manifest])
            # Every directory of the tree, including those other ranks' writers created.
            subdirs = [Path(d) for d, _, _ in os.walk(self._tmp, onerror=_raise)]
            for directory in sorted(subdirs, key=lambda p: len(p.parts), reverse=True):
                fsync_dir(directory)
            self._write(COMMITTED_FILE, [committed])
            fsync_dir(self._tmp)
            try:
                _rename_noreplace(self._tmp, final)
            except FileExistsError as exc:
                raise StepAlreadyPublished(
                    f"step {self._step} is already published at {final}; "
                    "published steps are immutable"
                ) from exc
            fsync_dir(final.parent)

    def close(self) -> None:
        self._pool.shutdown()

    def abort(self) -> None:
        self.close()
        shutil.rmtree(self._tmp, ignore_errors=True)


class FilesystemStore:
    def __init__(self, root: Path) -> None:
        self._root = Path(os.path.abspath(root))

    @property
    def uri(self) -> str:
        return f"file://{self._root}"

    @property
    def root(self) -> Path:
        return self._root

    def key_uri(self, key: str) -> str:
        return f"{self.uri}/{key}" if key else self.uri

    def _path(self, key: str) -> Path:
        return self._root / confine_path(key)

    def _ensure_dir(self, directory: Path) -> None:
        """Create ``directory`` and make each new entry durable in its parent."""
        missing = []
        while not directory.exists():
            missing.append(directory)
            directory = directory.parent
        for new in reversed(missing):
            new.mkdir(exist_ok=True)
            fsync_dir(new.parent)

    def root_exists(self) -> bool:
        with store_errors("opening checkpoint root"):
            try:
                st = self._root.stat()
            except FileNotFoundError:
                return False
            if not stat.S_ISDIR(st.st_mode):
                raise StoreError(f"checkpoint root {self._root} is not a directory")
            os.listdir(self._root)  # PermissionError -> StoreError, never "no checkpoint"
            return True

    def read(self, key: str) -> bytes | None:
        return self.read_versioned(key)[0]

    def read_versioned(self, key: str) -> tuple[bytes | None, Version | None]:
        path = self._path(key)
        with store_errors(f"reading {key}"):
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
            except FileNotFoundError:
                return None, None
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise StoreError(f"{path} is not a regular file")
                with os.fdopen(fd, "rb", closefd=False) as fh:
                    data = fh.read()
            finally:
                os.close(fd)
        return data, f"{st.st_ino}:{st.st_mtime_ns}:{st.st_size}"

    def put_if(self, key: str, data: bytes, expected: Version | None) -> bool:
        path = self._path(key)
        with store_errors(f"writing {key}"):
            self._ensure_dir(path.parent)
            tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            try:
                write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                if expected is None:
                    try:
                        os.link(tmp, path)  # atomic create-if-absent
                    except FileExistsError:
                        return False
                else:
                    if self.read_versioned(key)[1] != expected:
                        return False
                    os.replace(tmp, path)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    tmp.unlink()
            fsync_dir(path.parent)
        return True

    def list_step_dirs(self) -> list[StepDirEntry]:
        steps = self._root / STEPS_DIR
        entries: list[StepDirEntry] = []
        with store_errors("listing steps"):
            try:
                scan = list(os.scandir(steps))
            except FileNotFoundError:
                return []
            for item in scan:
                name = parse_step_dir(item.name)
                if name is None or not item.is_dir(follow_symlinks=False):
                    continue
                entries.append(StepDirEntry(name, item.stat(follow_symlinks=False).st_mtime))
        return entries

    def _dir(self, name: StepDirName) -> Path:
        return self._root / STEPS_DIR / str(name)

    def list_files(self, name: StepDirName) -> dict[str, int]:
        base = self._dir(name)
        sizes: dict[str, int] = {}
        with store_errors(f"listing {STEPS_DIR}/{name}"):
            for dirpath, _dirs, files in os.walk(base, onerror=_raise):
                for fname in files:
                    full = Path(dirpath) / fname
                    st = full.lstat()
                    if stat.S_ISREG(st.st_mode):  # symlinks never count as shards
                        sizes[full.relative_to(base).as_posix()] = st.st_size
        return sizes

    def sha256(self, name: StepDirName, path: str) -> str:
        target = self._dir(name) / confine_path(path)
        digest = hashlib.sha256()
        with store_errors(f"hashing {STEPS_DIR}/{name}/{path}"):
            fd = os.open(target, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as fh:
                while chunk := fh.read(CHUNK_BYTES):
                    digest.update(chunk)
        return digest.hexdigest()

    def begin_step(self, step: int, attempt: str, *, fresh: bool = True) -> FilesystemStepWriter:
        steps = self._root / STEPS_DIR
        tmp = steps / tmp_dir_name(step, attempt)
        with store_errors(f"starting step {step}"):
            if (steps / step_dir_name(step)).exists():
                raise StepAlreadyPublished(f"step {step} is already published under {steps}")
            if fresh:
                shutil.rmtree(tmp, ignore_errors=True)
                self._ensure_dir(steps)
                tmp.mkdir()
                fsync_dir(steps)
            elif not tmp.is_dir():
                raise StoreError(f"in-progress directory {tmp} does not exist")
        return FilesystemStepWriter(self, step, tmp)

    def delete_step_dir(self, name: StepDirName) -> None:
        """Unpublish, then delete: COMMITTED goes first and that is made durable, so a
        deletion interrupted anywhere (even on a volume whose renames are not atomic) leaves
        a directory no resolver accepts, which the next retention pass removes."""
        directory = self._dir(name)
        with store_errors(f"deleting {STEPS_DIR}/{name}"):
            (directory / COMMITTED_FILE).unlink(missing_ok=True)
            fsync_dir(directory)
            shutil.rmtree(directory)
            fsync_dir(directory.parent)


def _raise(exc: OSError) -> None:
    raise exc
