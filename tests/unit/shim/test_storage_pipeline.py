"""The filesystem data paths: hash exactly what is written, surface every failure, publish
nothing after one, and keep memory bounded (rtj_shim.checkpoint.storage.pipeline and its use by
FilesystemStepWriter)."""

from __future__ import annotations

import errno
import hashlib
import json
import mmap
import os
import random
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from rtj_shim.checkpoint.layout import STEPS_DIR
from rtj_shim.checkpoint.protocol import PUBLISH_STREAMS, CommitProtocol
from rtj_shim.checkpoint.resolver import resolve
from rtj_shim.checkpoint.storage import pipeline
from rtj_shim.checkpoint.storage.filesystem import FilesystemStepWriter, FilesystemStore
from rtj_shim.checkpoint.verification import Depth
from rtj_shim.checkpoint.verifier import verify_step
from rtj_shim.errors import StoreError

KiB = 1024
MiB = 1024 * KiB
CHUNK = 64 * KiB  # small chunks: many ranges, the hash lag and partial tails all happen


@pytest.fixture(params=[1, 2], ids=["1-hash-thread", "2-hash-threads"])
def pool(request: pytest.FixtureRequest) -> Iterator[ThreadPoolExecutor]:
    """A writer's hash threads: one per file it may be copying at once (2 by default)."""
    with ThreadPoolExecutor(request.param, thread_name_prefix="test-hash") as executor:
        yield executor


def copy(
    tmp_path: Path, data: bytes, pool: ThreadPoolExecutor, call_bytes: int = 3 * CHUNK + 5
) -> tuple[tuple[str, int], bytes]:
    """copy_hashed with small windows and small kernel calls (not multiples of a window),
    so that one file takes many calls and the hash both trails and catches up."""
    source = tmp_path / "source.bin"
    source.write_bytes(data)
    target = tmp_path / "target.bin"
    src = os.open(source, os.O_RDONLY)
    dst = os.open(target, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        result = pipeline.copy_hashed(src, dst, pool, chunk=CHUNK, call_bytes=call_bytes)
    finally:
        os.close(src)
        os.close(dst)
    return result, target.read_bytes()


SIZES = [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 11 * CHUNK + 4097]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("call_bytes", [3 * CHUNK + 5, pipeline.MAX_CALL_BYTES])
def test_copy_hashes_exactly_the_bytes_copied(
    size: int, call_bytes: int, tmp_path: Path, pool: ThreadPoolExecutor
) -> None:
    data = random.Random(size).randbytes(size)
    (sha, written), copied = copy(tmp_path, data, pool, call_bytes)
    assert copied == data
    assert (sha, written) == (hashlib.sha256(data).hexdigest(), size)


def test_the_copy_waits_for_a_slow_hash(
    tmp_path: Path, pool: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copy never runs more than two calls ahead of the hash."""
    call = 2 * CHUNK
    ahead: list[int] = []
    real_sendfile = os.sendfile
    real_hash = pipeline._RangeHasher.hash
    hashed = [0]

    def slow_hash(self: Any, offset: int, nbytes: int) -> None:
        time.sleep(0.005)
        real_hash(self, offset, nbytes)
        hashed[0] = offset + nbytes

    def sendfile(out: int, src: int, offset: int, count: int) -> int:
        ahead.append(offset - hashed[0])
        return real_sendfile(out, src, offset, count)

    monkeypatch.setattr(pipeline._RangeHasher, "hash", slow_hash)
    monkeypatch.setattr(os, "sendfile", sendfile)
    data = random.Random(9).randbytes(20 * CHUNK)
    (sha, _), copied = copy(tmp_path, data, pool, call)
    assert sha == hashlib.sha256(data).hexdigest() and copied == data
    assert max(ahead) <= 2 * call


@pytest.mark.parametrize("failure", ["sendfile", "mmap"])
def test_fallbacks_copy_and_hash_the_same_bytes(
    failure: str, tmp_path: Path, pool: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the kernel cannot copy between the files, buffers carry the bytes; where the
    copy cannot be mapped, the hash reads it back through a buffer."""
    calls: list[str] = []

    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        calls.append(failure)
        code = errno.EINVAL if failure == "sendfile" else errno.ENODEV
        raise OSError(code, os.strerror(code))

    if failure == "sendfile":
        monkeypatch.setattr(os, "sendfile", refuse)
    else:
        monkeypatch.setattr(mmap, "mmap", refuse)
    data = random.Random(5).randbytes(7 * CHUNK + 123)
    (sha, written), copied = copy(tmp_path, data, pool)
    assert calls, "the fallback was never needed: the test proves nothing"
    assert copied == data
    assert (sha, written) == (hashlib.sha256(data).hexdigest(), len(data))


def test_write_hashed_takes_a_chunk_only_after_the_previous_one_is_written(
    tmp_path: Path, pool: ThreadPoolExecutor
) -> None:
    """A caller may reuse a chunk's memory as soon as it asks for the next one."""
    target = tmp_path / "out.bin"
    fd = os.open(target, os.O_WRONLY | os.O_CREAT, 0o644)
    scratch = bytearray(CHUNK)
    expected = hashlib.sha256()
    sizes_seen: list[int] = []

    def chunks() -> Iterator[memoryview]:
        for i in range(9):
            scratch[:] = bytes([i]) * CHUNK
            expected.update(scratch)
            yield memoryview(scratch)
            sizes_seen.append(os.fstat(fd).st_size)

    try:
        sha, size = pipeline.write_hashed(fd, chunks(), pool)
    finally:
        os.close(fd)
    assert (sha, size) == (expected.hexdigest(), 9 * CHUNK)
    assert sizes_seen == [CHUNK * (i + 1) for i in range(9)]
    assert target.read_bytes() == b"".join(bytes([i]) * CHUNK for i in range(9))


# -- failures through the store: the error surfaces, nothing is published -------------


def publish_dir(tmp_path: Path, size: int = 3 * MiB + 5) -> Path:
    source = tmp_path / "src"
    source.mkdir()
    (source / "model.bin").write_bytes(random.Random(1).randbytes(size))
    (source / "meta.json").write_text("{}")
    return source


def assert_nothing_published(root: Path) -> None:
    store = FilesystemStore(root)
    assert resolve(store, Depth.DEEP).step is None
    steps = root / STEPS_DIR
    assert not steps.exists() or list(steps.iterdir()) == []  # the tmp area was removed


def is_model(fd: int) -> bool:
    return os.readlink(f"/proc/self/fd/{fd}").endswith("model.bin")


@pytest.mark.parametrize("call", ["sendfile", "fsync"])
def test_a_failing_disk_during_a_copy_publishes_nothing(
    call: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = publish_dir(tmp_path)
    real = getattr(os, call)
    passed: list[int] = []

    def failing(fd: int, *args: Any) -> Any:
        if not is_model(fd) or (call == "sendfile" and not passed):
            passed.append(fd)  # other files, and model.bin's first range, go through
            return real(fd, *args)
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, call, failing)
    root = tmp_path / "root"
    with pytest.raises(StoreError, match=r"model\.bin.*Input/output error"):
        CommitProtocol(FilesystemStore(root), run_id="r", retention=None).publish_directory(
            7, source
        )
    monkeypatch.undo()
    assert_nothing_published(root)


def test_a_failing_disk_during_a_streamed_write_publishes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write = os.write
    written = [0]

    def disk_full_after_1mib(fd: int, data: Any) -> int:
        if written[0] >= MiB:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = real_write(fd, data)
        written[0] += n
        return n

    root = tmp_path / "root"
    protocol = CommitProtocol(FilesystemStore(root), run_id="r", retention=None)
    writer = protocol.begin(3)
    monkeypatch.setattr(os, "write", disk_full_after_1mib)
    chunks = (bytes([i]) * (256 * KiB) for i in range(16))
    with pytest.raises(StoreError, match="No space left on device"):
        writer.write_file("model.bin", chunks)
    monkeypatch.undo()
    writer.abort()
    assert_nothing_published(root)


def test_the_hash_never_outlives_a_failed_copy(
    tmp_path: Path, pool: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy that fails mid-file raises only once its hash has stopped: nothing reads
    the descriptors the caller closes next."""
    source = tmp_path / "s.bin"
    source.write_bytes(random.Random(2).randbytes(40 * CHUNK))
    real = os.sendfile
    calls = [0]

    def fail_late(out: int, src: int, offset: int, count: int) -> int:
        calls[0] += 1
        if calls[0] == 5:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(out, src, offset, count)

    monkeypatch.setattr(os, "sendfile", fail_late)
    running: list[Any] = []
    submit = pool.submit

    def recording(*args: Any, **kwargs: Any) -> Any:
        future = submit(*args, **kwargs)
        running.append(future)
        return future

    monkeypatch.setattr(pool, "submit", recording)
    src = os.open(source, os.O_RDONLY)
    dst = os.open(tmp_path / "t.bin", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        with pytest.raises(OSError, match="Input/output error"):
            pipeline.copy_hashed(src, dst, pool, chunk=CHUNK, call_bytes=3 * CHUNK)
        assert len(running) == 1 and running[0].done()  # checked before the pool shuts down
    finally:
        os.close(src)
        os.close(dst)


def test_publish_directory_copies_two_files_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "src"
    source.mkdir()
    files = {f"shard-{i}.bin": random.Random(i).randbytes(300 * KiB + i) for i in range(6)}
    for name, data in files.items():
        (source / name).write_bytes(data)
    running = [0]
    most = [0]
    lock = threading.Lock()
    real = FilesystemStepWriter.copy_file

    def counting(self: FilesystemStepWriter, path: str, src: Path) -> Any:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        try:
            time.sleep(0.05)
            return real(self, path, src)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(FilesystemStepWriter, "copy_file", counting)
    store = FilesystemStore(tmp_path / "root")
    result = CommitProtocol(store, run_id="r", retention=None).publish_directory(4, source)
    assert most[0] == PUBLISH_STREAMS == 2
    assert {f.path: f.sha256 for f in result.manifest.files} == {
        name: hashlib.sha256(data).hexdigest() for name, data in files.items()
    }
    assert verify_step(store, 4, Depth.DEEP).valid


# -- memory ----------------------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from rtj_shim.checkpoint.protocol import PUBLISH_STREAMS, CommitProtocol
    from rtj_shim.checkpoint.storage.filesystem import FilesystemStepWriter, FilesystemStore

    def hwm():
        with open("/proc/self/status") as fh:
            return [int(l.split()[1]) for l in fh if l.startswith("VmHWM:")][0] * 1024

    before = hwm()
    protocol = CommitProtocol(FilesystemStore(Path(sys.argv[1])), run_id="m", retention=None)
    protocol.publish_directory(1, Path(sys.argv[2]))
    print(json.dumps({"before": before, "after": hwm()}))
    """
)


def test_publishing_a_large_file_keeps_memory_bounded(tmp_path: Path) -> None:
    """Peak RSS grows by a few chunks, not with the file (a 384 MiB sparse file here)."""
    source = tmp_path / "src"
    source.mkdir()
    with (source / "big.bin").open("wb") as fh:
        fh.truncate(384 * MiB)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "root"), str(source)],
        capture_output=True,
        check=True,
        text=True,
    )
    peak = json.loads(out.stdout)
    grown = peak["after"] - peak["before"]
    assert grown < 48 * MiB, f"peak RSS grew by {grown / MiB:.1f} MiB publishing 384 MiB"


def test_mapped_windows_are_one_chunk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hash maps one copied range at a time, never the whole file."""
    lengths: list[int] = []
    real = mmap.mmap

    def record(fd: int, length: int, *args: Any, **kwargs: Any) -> mmap.mmap:
        lengths.append(length)
        return real(fd, length, *args, **kwargs)

    monkeypatch.setattr(mmap, "mmap", record)
    with ThreadPoolExecutor(1) as pool:
        (_sha, size), _ = copy(tmp_path, random.Random(3).randbytes(9 * CHUNK + 1), pool)
    assert size == 9 * CHUNK + 1
    assert lengths and max(lengths) <= CHUNK + mmap.ALLOCATIONGRANULARITY
