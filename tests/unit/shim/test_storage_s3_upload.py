"""S3 uploads without a server: parts go up in parallel, at most ``concurrency`` at once,
from at most ``concurrency + 1`` reused buffers; every part is hashed once for its
checksum and once into the whole object's digest; a failure aborts the upload.

A fake client stands in for boto3 (the loopback-server tests in
tests/integration/shim/test_s3_store.py cover the real API)."""

from __future__ import annotations

import base64
import hashlib
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from botocore.exceptions import ClientError

from rtj_shim.checkpoint.storage.s3 import S3Store
from rtj_shim.checkpoint.storage.s3_upload import S3StepWriter
from rtj_shim.errors import StoreError

MiB = 1024 * 1024
PART = 5 * MiB
_sha256 = hashlib.sha256  # the fake's own hashing is not counted by the test that counts


def b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode()


class FakeS3:
    """The calls an S3StepWriter makes, checked as S3 would check them."""

    def __init__(self, *, fail_part: int | None = None, delay_s: float = 0.03) -> None:
        self.meta = SimpleNamespace(events=SimpleNamespace(register=lambda *a, **k: None))
        self.objects: dict[str, tuple[bytes, str]] = {}  # key -> (data, stored checksum)
        self.uploads: dict[str, dict[int, tuple[bytes, bytes]]] = {}
        self.aborted: list[str] = []
        self.bodies: list[Any] = []  # every part body, kept alive: ids stay distinct
        self.fail_part = fail_part
        self.delay_s = delay_s
        self.inflight = 0
        self.max_inflight = 0
        self.lock = threading.Lock()

    def create_multipart_upload(self, **kw: Any) -> dict[str, str]:
        upload_id = f"u{len(self.uploads)}"
        self.uploads[upload_id] = {}
        return {"UploadId": upload_id}

    def upload_part(self, **kw: Any) -> dict[str, str]:
        with self.lock:
            self.inflight += 1
            self.max_inflight = max(self.max_inflight, self.inflight)
            self.bodies.append(kw["Body"])
        try:
            time.sleep(self.delay_s)
            if kw["PartNumber"] == self.fail_part:
                raise ClientError({"Error": {"Code": "InternalError"}}, "UploadPart")
            data = bytes(kw["Body"])
            digest = _sha256(data).digest()
            assert kw["ChecksumSHA256"] == b64(digest), "part checksum is not of the part"
            self.uploads[kw["UploadId"]][kw["PartNumber"]] = (data, digest)
            return {"ETag": f'"{kw["PartNumber"]}"'}
        finally:
            with self.lock:
                self.inflight -= 1

    def complete_multipart_upload(self, **kw: Any) -> dict[str, str]:
        parts = self.uploads.pop(kw["UploadId"])
        listed = kw["MultipartUpload"]["Parts"]
        assert [p["PartNumber"] for p in listed] == sorted(parts)
        digests = b"".join(parts[n][1] for n in sorted(parts))
        data = b"".join(parts[n][0] for n in sorted(parts))
        checksum = f"{b64(_sha256(digests).digest())}-{len(parts)}"
        self.objects[kw["Key"]] = (data, checksum)
        return {}

    def abort_multipart_upload(self, **kw: Any) -> dict[str, str]:
        self.uploads.pop(kw["UploadId"], None)
        self.aborted.append(kw["Key"])
        return {}

    def put_object(self, **kw: Any) -> dict[str, str]:
        data = bytes(kw["Body"])
        assert kw["ChecksumSHA256"] == b64(_sha256(data).digest())
        self.objects[kw["Key"]] = (data, kw["ChecksumSHA256"])
        return {}

    def head_object(self, **kw: Any) -> dict[str, Any]:
        data, checksum = self.objects[kw["Key"]]
        return {"ContentLength": len(data), "ChecksumSHA256": checksum}


def writer(client: FakeS3, concurrency: int = 3) -> S3StepWriter:
    store = S3Store("bucket", "p", client=client, part_size=PART, concurrency=concurrency)  # type: ignore[arg-type]
    return S3StepWriter(store, 1, "0")


def pieces(data: bytes, size: int) -> Iterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


KEY = "p/steps/step-000000000001/shard.bin"


def test_parts_go_up_in_parallel_from_a_bounded_set_of_buffers() -> None:
    client = FakeS3()
    data = random.Random(1).randbytes(12 * PART + 7)
    entry = writer(client, concurrency=3).write_file("shard.bin", pieces(data, 3 * MiB + 1))
    assert (entry.bytes, entry.sha256) == (len(data), hashlib.sha256(data).hexdigest())
    assert client.objects[KEY][0] == data
    assert client.objects[KEY][1].endswith("-13")
    assert 1 < client.max_inflight <= 3
    assert len({id(body) for body in client.bodies}) <= 3 + 1  # buffers are reused


def test_a_local_file_is_read_straight_into_parts(tmp_path: Path) -> None:
    client = FakeS3(delay_s=0.0)
    for name, size in (("exact.bin", 3 * PART), ("one.bin", PART), ("odd.bin", 2 * PART + 1)):
        data = random.Random(size).randbytes(size)
        (tmp_path / name).write_bytes(data)
        entry = writer(client).copy_file(name, tmp_path / name)
        assert (entry.bytes, entry.sha256) == (size, hashlib.sha256(data).hexdigest())
        stored, _checksum = client.objects[f"p/steps/step-000000000001/{name}"]
        assert stored == data
    # One part's size is one PUT; the end of a file exactly at a part boundary adds no part.
    assert "-" not in client.objects["p/steps/step-000000000001/one.bin"][1]
    assert client.objects["p/steps/step-000000000001/exact.bin"][1].endswith("-3")


class CountingSha256:
    """hashlib.sha256 that counts every byte it hashes (all instances together)."""

    hashed = 0

    def __init__(self, data: Any = b"") -> None:
        self._h = _sha256()
        self.update(data)

    def update(self, data: Any) -> None:
        CountingSha256.hashed += memoryview(data).nbytes
        self._h.update(data)

    def digest(self) -> bytes:
        return self._h.digest()

    def hexdigest(self) -> str:
        return self._h.hexdigest()


@pytest.mark.parametrize(("size", "passes"), [(2 * MiB, 1), (3 * PART + 1, 2)])
def test_every_byte_is_hashed_once_per_digest_it_needs(
    size: int, passes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A single PUT's checksum is the object's digest (one pass); a multipart object needs
    its whole digest (the manifest) and each part's (S3's checksum): two passes, no third
    for the request signature (that is botocore's, see test_s3_store.py)."""
    client = FakeS3(delay_s=0.0)
    data = random.Random(size).randbytes(size)
    w = writer(client)
    monkeypatch.setattr(hashlib, "sha256", CountingSha256)
    CountingSha256.hashed = 0
    entry = w.write_file("shard.bin", pieces(data, MiB))
    assert entry.sha256 == _sha256(data).hexdigest()
    composite = 32 * 4 if passes == 2 else 0  # the part digests, hashed into S3's composite
    assert CountingSha256.hashed == passes * size + composite


def test_a_failed_part_aborts_the_upload_and_raises() -> None:
    client = FakeS3(fail_part=3)
    data = random.Random(2).randbytes(8 * PART)
    with pytest.raises(StoreError, match=r"uploading part 3 of .*InternalError"):
        writer(client).write_file("shard.bin", pieces(data, MiB))
    assert client.aborted == [KEY]
    assert client.uploads == {} and client.objects == {}


def test_a_failing_source_aborts_the_upload() -> None:
    client = FakeS3(delay_s=0.0)

    def broken() -> Iterator[bytes]:
        yield b"a" * (2 * PART + 3)
        raise RuntimeError("source broke")

    with pytest.raises(RuntimeError, match="source broke"):
        writer(client).write_file("shard.bin", broken())
    assert client.aborted == [KEY]
    assert client.uploads == {} and client.objects == {}
