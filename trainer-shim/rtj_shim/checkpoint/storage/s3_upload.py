"""Writing one step to S3: every shard streamed into an object, its parts uploaded in parallel.

An object up to one part's size goes up as a single PUT whose SHA-256 checksum is the
shard's own digest (one hash pass). A larger one is a multipart upload: part buffers are
filled here (copied from the caller's chunks, or read straight from a local file into the
buffer) and each full part is handed to two helpers at once:

* the whole-object SHA-256 (one thread, parts in order): the digest the manifest records;
* an upload worker, which computes the part's SHA-256 once and sends the part with it
  (``x-amz-checksum-sha256``: S3 refuses a part that does not match, and the request
  signature does not hash the body again, see :mod:`rtj_shim.checkpoint.storage.s3_client`).

At most ``concurrency`` parts are in flight and one is filling, so memory is bounded by
``concurrency + 1`` parts; a buffer is reused once its part is stored. Afterwards the
object's size and the checksum S3 stored (the composite of the part checksums) are
compared with what was sent. Any failure aborts the multipart upload and raises; nothing
of the object remains.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from collections.abc import Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, cast

from botocore.exceptions import BotoCoreError, ClientError

from rtj_shim.checkpoint.layout import COMMITTED_FILE, MANIFEST_FILE, step_key
from rtj_shim.checkpoint.manifest import FileEntry, confine_path, decode_manifest
from rtj_shim.checkpoint.storage.s3_client import CONDITION_FAILED, b64, error_code, s3_errors
from rtj_shim.errors import Refused, StepAlreadyPublished, StoreError

if TYPE_CHECKING:
    from mypy_boto3_s3.type_defs import CompletedPartTypeDef

    from rtj_shim.checkpoint.storage.s3 import S3Store

MiB = 1024 * 1024
DEFAULT_PART_BYTES = 16 * MiB
MIN_PART_BYTES = 5 * MiB  # S3's minimum for every part but the last
MAX_PARTS = 10_000
PARTS_PER_SIZE_STEP = 1_000  # the part size doubles every 1000 parts (files > 16 GB)
DEFAULT_CONCURRENCY = 4  # parts of one object uploaded at once


def part_size_for(number: int, base: int) -> int:
    """Size of part ``number`` (1-based): doubles every 1000 parts, so 10,000 parts reach
    far past what one part size allows while memory stays bounded for ordinary files."""
    return base << ((number - 1) // PARTS_PER_SIZE_STEP)


@dataclass(frozen=True)
class _Part:
    number: int
    etag: str
    digest: bytes  # raw SHA-256 of the part


@dataclass(frozen=True)
class _Expected:
    """What an uploaded object must look like: its size and S3's SHA-256 checksum."""

    size: int
    checksum: str  # base64; the composite for multipart objects
    parts: int | None  # number of parts of a multipart object, None for a single PUT


class S3StepWriter:
    """Writes one step in place under ``steps/step-N/``; COMMITTED makes it visible."""

    def __init__(self, store: S3Store, step: int, attempt: str) -> None:
        self._store = store
        self._step = step
        self._attempt = attempt
        self._uploaded: dict[str, None] = {}  # keys this writer created, in order
        self._committed = False

    @property
    def step(self) -> int:
        return self._step

    @property
    def attempt(self) -> str:
        """Recorded only: S3 has no per-attempt area (no rename), see the module doc."""
        return self._attempt

    def _key(self, path: str) -> str:
        return self._store._object_key(step_key(self._step, confine_path(path)))

    def write_file(self, path: str, chunks: Iterable[bytes]) -> FileEntry:
        key = self._key(path)
        with _ObjectUpload(self._store, key, exclusive=key not in self._uploaded) as upload:
            for chunk in chunks:
                upload.feed(chunk)
            sha, size = self._finish(key, upload)
        return FileEntry(path=path, bytes=size, sha256=sha)

    def copy_file(self, path: str, source: Path) -> FileEntry:
        refused = Refused(f"{source}: not a regular file (symlinks and special files are refused)")
        with s3_errors("reading", str(source)):
            if not stat.S_ISREG(source.lstat().st_mode):
                raise refused
            fd = os.open(source, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # replaced since the lstat
                raise refused
            key = self._key(path)
            with _ObjectUpload(self._store, key, exclusive=key not in self._uploaded) as upload:
                with s3_errors("reading", str(source)):
                    upload.feed_file(fd)
                sha, size = self._finish(key, upload)
        finally:
            os.close(fd)
        return FileEntry(path=path, bytes=size, sha256=sha)

    def commit(self, manifest: bytes, committed: bytes) -> None:
        if self._committed:
            raise StepAlreadyPublished(f"step {self._step} was already published by this writer")
        self._put_marker(MANIFEST_FILE, manifest)
        self._put_marker(COMMITTED_FILE, committed)
        self._committed = True

    def close(self) -> None:
        """Nothing to release: every upload has finished when write_file returns."""

    def abort(self) -> None:
        """Delete what this writer uploaded (best effort); of a step published meanwhile,
        whoever published it, only the keys its manifest does not list: the keys of a step
        are the same for every writer, so a zombie of an old attempt that aborts after a
        newer one published the step would otherwise delete the newer one's files."""
        if self._committed or not self._uploaded:
            return
        keys = list(self._uploaded)
        self._uploaded.clear()
        with contextlib.suppress(StoreError, ClientError, ValueError, Refused):
            if self._store._exists(self._key(COMMITTED_FILE)):
                raw = self._store.read(step_key(self._step, MANIFEST_FILE))
                listed = decode_manifest(raw).files if raw is not None else ()
                published = {self._key(f.path) for f in listed} | {self._key(MANIFEST_FILE)}
                keys = [k for k in keys if k not in published] if raw is not None else []
            self._store._delete_keys(keys)

    # -- internals ---------------------------------------------------------------------

    def _finish(self, key: str, upload: _ObjectUpload) -> tuple[str, int]:
        expected, created = upload.finish()
        if created:
            self._uploaded[key] = None
        self._verify(key, expected, self._store._uri_of(key))
        return upload.sha256_hex, expected.size

    def _put_marker(self, name: str, data: bytes) -> None:
        """Create manifest.json / COMMITTED only if absent; losing the race means another
        writer publishes this step. A 412 on our own retried request is recognised by
        content (the manifest holds a creation timestamp, COMMITTED its sha256)."""
        store = self._store
        key = self._key(name)
        with s3_errors("publishing", store._uri_of(key), store.bucket):
            try:
                store.put_object_checked(key, data, if_none_match=True)
            except ClientError as exc:
                if error_code(exc) not in CONDITION_FAILED:
                    raise
                if store.read(step_key(self._step, name)) != data:
                    raise StepAlreadyPublished(
                        f"step {self._step} is already published (or being published by "
                        f"another writer) at {store.key_uri(step_key(self._step))}: "
                        f"{name} exists; published steps are immutable"
                    ) from exc
        self._uploaded[key] = None

    def _verify(self, key: str, expected: _Expected, where: str) -> None:
        """The stored object has the size we sent and the SHA-256 checksum we computed."""
        store = self._store
        with s3_errors("verifying", where, store.bucket):
            head = store.client.head_object(Bucket=store.bucket, Key=key, ChecksumMode="ENABLED")
        size = head.get("ContentLength")
        stored = head.get("ChecksumSHA256")
        if size != expected.size:
            raise StoreError(
                f"verifying {where}: the store holds {size} bytes, {expected.size} were "
                "written (another writer's object, or a broken upload)"
            )
        if not stored:
            raise StoreError(
                f"verifying {where}: the store returned no SHA-256 checksum for the object; "
                "an S3 API that records ChecksumSHA256 is required"
            )
        value, _, parts = stored.partition("-")  # composite: "<base64>-<parts>"
        if value != expected.checksum or (
            parts and (expected.parts is None or parts != str(expected.parts))
        ):
            raise StoreError(
                f"verifying {where}: stored SHA-256 checksum {stored!r} differs from the "
                f"uploaded data's {expected.checksum!r}"
                + (f"-{expected.parts}" if expected.parts is not None else "")
                + " (another writer's object, or data corrupted in transit)"
            )


class _ObjectUpload:
    """One object: fed by chunks or a file, sent as one PUT or as parallel parts."""

    def __init__(self, store: S3Store, key: str, *, exclusive: bool) -> None:
        self._store = store
        self._key = key
        self._exclusive = exclusive  # If-None-Match: never replace another writer's object
        self._where = store._uri_of(key)
        self._whole = hashlib.sha256()
        self._size = 0  # bytes handed to parts so far
        self._buffer: bytearray | None = None  # the part being filled
        self._fill = 0
        self._number = 1  # of the part being filled
        self._free: list[bytearray] = []
        self._inflight: list[tuple[Future[_Part], Future[None], bytearray]] = []
        self._parts: list[_Part] = []
        self._upload_id: str | None = None
        self._hasher: ThreadPoolExecutor | None = None
        self._senders: ThreadPoolExecutor | None = None
        self.sha256_hex = ""

    def __enter__(self) -> _ObjectUpload:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None:
            self._abort()
        self._shutdown()

    # -- filling -----------------------------------------------------------------------

    def feed(self, chunk: bytes | memoryview) -> None:
        """Copy ``chunk`` into part buffers; a full part is sent once more data follows."""
        view = memoryview(chunk).cast("B")
        while view:
            buffer = self._current()
            room = len(buffer) - self._fill
            if room == 0:
                self._ship()
                continue
            take = min(room, len(view))
            buffer[self._fill : self._fill + take] = view[:take]
            self._fill += take
            view = view[take:]

    def feed_file(self, fd: int) -> None:
        """Read a local file from its start straight into part buffers (no other copy)."""
        offset = 0
        while True:
            buffer = self._current()
            if self._fill == len(buffer):
                if not os.pread(fd, 1, offset):  # the end, exactly at a part boundary
                    return
                self._ship()
                continue
            with memoryview(buffer) as view:
                got = os.preadv(fd, [view[self._fill :]], offset)
            if got == 0:
                return
            self._fill += got
            offset += got

    def _current(self) -> bytearray:
        if self._buffer is None:
            self._buffer = self._take(part_size_for(self._number, self._store.part_size))
            self._fill = 0
        return self._buffer

    def _take(self, size: int) -> bytearray:
        """A free buffer of ``size`` bytes, once fewer than ``concurrency`` parts are in flight."""
        while len(self._inflight) >= self._store.concurrency:
            self._collect(block=True)
        for i, buffer in enumerate(self._free):
            if len(buffer) == size:
                return self._free.pop(i)
        self._free.clear()  # the part size grew: smaller buffers are never used again
        return bytearray(size)

    # -- parts -------------------------------------------------------------------------

    def _ship(self) -> None:
        """Send the part being filled (hash it into the whole object, upload it)."""
        buffer, self._buffer = self._buffer, None
        assert buffer is not None
        del buffer[self._fill :]  # the last part may be short
        if self._number > MAX_PARTS:
            raise StoreError(f"uploading {self._where}: more than {MAX_PARTS} parts")
        if self._upload_id is None:
            self._start()
        assert self._hasher is not None and self._senders is not None
        hashed = self._hasher.submit(self._whole.update, buffer)  # in order: one thread
        sent = self._senders.submit(self._send_part, self._number, buffer)
        self._inflight.append((sent, hashed, buffer))
        self._size += len(buffer)
        self._number += 1

    def _start(self) -> None:
        store = self._store
        with s3_errors("starting multipart upload of", self._where, store.bucket):
            created = store.client.create_multipart_upload(
                Bucket=store.bucket, Key=self._key, ChecksumAlgorithm="SHA256"
            )
        self._upload_id = created["UploadId"]
        self._hasher = ThreadPoolExecutor(1, thread_name_prefix="rtj-s3-hash")
        self._senders = ThreadPoolExecutor(store.concurrency, thread_name_prefix="rtj-s3-part")

    def _send_part(self, number: int, data: bytearray) -> _Part:
        store = self._store
        assert self._upload_id is not None
        digest = hashlib.sha256(data).digest()  # the part's only hash pass
        with s3_errors(f"uploading part {number} of", self._where, store.bucket):
            sent = store.client.upload_part(
                Bucket=store.bucket,
                Key=self._key,
                UploadId=self._upload_id,
                PartNumber=number,
                Body=cast(bytes, data),  # botocore takes a bytearray (no copy)
                ChecksumAlgorithm="SHA256",
                ChecksumSHA256=b64(digest),
            )
        return _Part(number, sent["ETag"], digest)

    def _collect(self, *, block: bool) -> None:
        """Take in finished parts (raising the first failure); ``block``: wait for one."""
        if block:
            wait([sent for sent, _, _ in self._inflight], return_when=FIRST_COMPLETED)
        running = []
        for sent, hashed, buffer in self._inflight:
            if not sent.done():
                running.append((sent, hashed, buffer))
                continue
            self._parts.append(sent.result())
            hashed.result()
            self._free.append(buffer)
        self._inflight = running

    # -- the end -----------------------------------------------------------------------

    def finish(self) -> tuple[_Expected, bool]:
        """Send what is left; returns what the object must look like and whether this
        upload created it (False: the key existed and If-None-Match refused it)."""
        if self._upload_id is None:
            data = self._buffer if self._buffer is not None else bytearray()
            del data[self._fill :]
            self._buffer = None
            self._whole.update(data)
            self._size = len(data)
            self.sha256_hex = self._whole.hexdigest()
            expected = _Expected(len(data), b64(self._whole.digest()), None)
            return expected, self._put_single(data, expected)
        if self._buffer is not None and self._fill:
            self._ship()
        self._buffer = None
        while self._inflight:
            self._collect(block=True)
        self.sha256_hex = self._whole.hexdigest()
        parts = sorted(self._parts, key=lambda p: p.number)
        composite = b64(hashlib.sha256(b"".join(p.digest for p in parts)).digest())
        return _Expected(self._size, composite, len(parts)), self._complete(parts)

    def _put_single(self, data: bytearray, expected: _Expected) -> bool:
        store = self._store
        with s3_errors("uploading", self._where, store.bucket):
            try:
                store.put_object_checked(
                    self._key, data, checksum=expected.checksum, if_none_match=self._exclusive
                )
            except ClientError as exc:
                # The key exists already: fine only if it holds exactly these bytes (our own
                # retried request); _verify decides, and says whose object it is otherwise.
                if error_code(exc) not in CONDITION_FAILED:
                    raise
                return False
        return True

    def _complete(self, parts: list[_Part]) -> bool:
        store = self._store
        assert self._upload_id is not None
        listed: list[CompletedPartTypeDef] = [
            {"ETag": p.etag, "PartNumber": p.number, "ChecksumSHA256": b64(p.digest)} for p in parts
        ]
        with s3_errors("completing multipart upload of", self._where, store.bucket):
            try:
                if self._exclusive:
                    store.client.complete_multipart_upload(
                        Bucket=store.bucket,
                        Key=self._key,
                        UploadId=self._upload_id,
                        MultipartUpload={"Parts": listed},
                        IfNoneMatch="*",
                    )
                else:
                    store.client.complete_multipart_upload(
                        Bucket=store.bucket,
                        Key=self._key,
                        UploadId=self._upload_id,
                        MultipartUpload={"Parts": listed},
                    )
            except ClientError as exc:
                if error_code(exc) not in CONDITION_FAILED:
                    raise
                self._abort()  # the key exists: _verify decides whether it holds our bytes
                return False
        self._upload_id = None  # completed: nothing to abort any more
        return True

    def _abort(self) -> None:
        """Stop every part, then abort the multipart upload (best effort)."""
        for sent, _, _ in self._inflight:
            sent.cancel()
        self._inflight.clear()
        self._shutdown()
        upload_id, self._upload_id = self._upload_id, None
        if upload_id is not None:
            store = self._store
            with contextlib.suppress(ClientError, BotoCoreError):
                store.client.abort_multipart_upload(
                    Bucket=store.bucket, Key=self._key, UploadId=upload_id
                )

    def _shutdown(self) -> None:
        for pool in (self._senders, self._hasher):
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
