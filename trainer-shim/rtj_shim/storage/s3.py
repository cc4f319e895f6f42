"""Checkpoint store on S3 (or any S3 API): the only module that imports boto3.

S3 has no rename, so a step is written in place under ``steps/step-<12 digits>/`` and is
made visible by its ``COMMITTED`` object alone: a step without COMMITTED does not exist
for a resolver. Publishing therefore:

1. uploads every shard directly under the step prefix, never replacing an object another
   writer created (``If-None-Match: *``), with a SHA-256 checksum the server checks per
   request (per part for multipart uploads), hashing the whole shard locally while
   uploading; afterwards each object's size and stored checksum are compared with what
   was sent;
2. writes ``manifest.json`` and then ``COMMITTED`` with ``If-None-Match: *``, so of two
   writers racing to publish the same step exactly one wins;
3. leaves ``latest.json`` to :class:`rtj_shim.protocol.CommitProtocol` (``put_if``:
   ``If-Match`` on the ETag it read, or ``If-None-Match: *`` when it read nothing).

``begin_step(fresh=True)`` deletes what a crashed attempt left under the step prefix
(objects and unfinished multipart uploads). Every boto3/botocore error is raised as
:class:`rtj_shim.errors.StoreError` naming the bucket, the key and the S3 error code; a
key that does not exist is an ordinary ``None``, a bucket that does not exist is an error.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import re
import stat
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from rtj_shim.errors import Refused, StepAlreadyPublished, StoreError
from rtj_shim.layout import (
    COMMITTED_FILE,
    MANIFEST_FILE,
    STEPS_DIR,
    StepDirName,
    parse_step_dir,
    step_dir_name,
    step_key,
    validate_attempt,
)
from rtj_shim.manifest import FileEntry, confine_path
from rtj_shim.storage.base import CHUNK_BYTES, StepDirEntry, Version, iter_file

if TYPE_CHECKING:
    from botocore.config import _RetryDict
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import CompletedPartTypeDef, ObjectIdentifierTypeDef

MiB = 1024 * 1024
DEFAULT_PART_BYTES = 16 * MiB
MIN_PART_BYTES = 5 * MiB  # S3's minimum for every part but the last
MAX_PARTS = 10_000
PARTS_PER_SIZE_STEP = 1_000  # the part size doubles every 1000 parts (files > 16 GB)
DELETE_BATCH = 1_000  # DeleteObjects' limit
LIST_PAGE = 1_000  # ListObjectsV2's maximum page
READ_CHUNK = 1 * MiB

# A conditional write lost: 412 PreconditionFailed, or 409 ConditionalRequestConflict when
# another conditional write to the key was in flight.
_CONDITION_FAILED = frozenset({"PreconditionFailed", "ConditionalRequestConflict", "412", "409"})
# HEAD answers a bare 404 without an error body; GET answers NoSuchKey.
_NOT_FOUND = frozenset({"NoSuchKey", "NotFound", "404"})
_BUCKET_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{1,254}$")


def client_config() -> Config:
    """Bounded retries and timeouts, so an unreachable endpoint fails in bounded time.

    ``AWS_MAX_ATTEMPTS`` / ``AWS_RETRY_MODE``, when set, win over the defaults here.
    Checksums are ones this module computes and sends itself (SHA-256), so botocore's own
    request checksums (CRC32 by default) and response validation are turned off; object
    content is verified by hashing it locally.
    """
    retries: _RetryDict = {}
    if not os.environ.get("AWS_MAX_ATTEMPTS"):
        retries["max_attempts"] = 3
    if not os.environ.get("AWS_RETRY_MODE"):
        retries["mode"] = "standard"
    return Config(
        connect_timeout=10,
        read_timeout=60,
        retries=retries or None,
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        user_agent_extra="rtj-shim",
    )


def make_client() -> S3Client:
    """An S3 client from the standard AWS environment.

    botocore itself reads credentials (``AWS_ACCESS_KEY_ID``, profiles, web identity, ...),
    the region and the endpoint: ``AWS_ENDPOINT_URL_S3`` and then ``AWS_ENDPOINT_URL``
    (botocore >= 1.31, see ``botocore.configprovider``), unless
    ``AWS_IGNORE_CONFIGURED_ENDPOINT_URLS`` is set.
    """
    with s3_errors("creating S3 client for", "the configured endpoint"):
        return boto3.session.Session().client("s3", config=client_config())


def error_code(exc: ClientError) -> str:
    error = exc.response.get("Error", {})
    code = error.get("Code")
    if code:
        return str(code)
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return str(status) if status is not None else "Unknown"


def describe_client_error(exc: ClientError, bucket: str) -> str:
    code = error_code(exc)
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    message = exc.response.get("Error", {}).get("Message") or ""
    detail = f"{code} (HTTP {status})" if status is not None else code
    if message and message != code:
        detail = f"{detail}: {message}"
    if code == "NoSuchBucket":
        return f"bucket {bucket!r} does not exist ({detail})"
    if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken"):
        return f"credentials rejected ({detail})"
    if code in ("AccessDenied", "403"):
        return f"access denied ({detail})"
    return detail


@contextlib.contextmanager
def s3_errors(what: str, where: str, bucket: str = "") -> Iterator[None]:
    """Translate boto3/botocore (and local file) errors into StoreError."""
    try:
        yield
    except ClientError as exc:
        raise StoreError(f"{what} {where}: {describe_client_error(exc, bucket)}") from exc
    except BotoCoreError as exc:
        raise StoreError(f"{what} {where}: {type(exc).__name__}: {exc}") from exc
    except OSError as exc:
        raise StoreError(f"{what} {where}: {exc.strerror or exc}") from exc


def _b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode("ascii")


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
        sha, size = self._upload(key, chunks)
        return FileEntry(path=path, bytes=size, sha256=sha)

    def copy_file(self, path: str, source: Path) -> FileEntry:
        with s3_errors("reading", str(source)):
            mode = source.lstat().st_mode
        if not stat.S_ISREG(mode):
            raise Refused(f"{source}: not a regular file (symlinks and special files are refused)")
        return self.write_file(path, _local_chunks(source))

    def commit(self, manifest: bytes, committed: bytes) -> None:
        if self._committed:
            raise StepAlreadyPublished(f"step {self._step} was already published by this writer")
        self._put_marker(MANIFEST_FILE, manifest)
        self._put_marker(COMMITTED_FILE, committed)
        self._committed = True

    def close(self) -> None:
        """Nothing to release: every upload has finished when write_file returns."""

    def abort(self) -> None:
        """Delete what this writer uploaded (best effort); a published step is left alone."""
        if self._committed or not self._uploaded:
            return
        keys = list(self._uploaded)
        self._uploaded.clear()
        with contextlib.suppress(StoreError):
            self._store._delete_keys(keys)

    # -- internals ---------------------------------------------------------------------

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
                if error_code(exc) not in _CONDITION_FAILED:
                    raise
                if store.read(step_key(self._step, name)) != data:
                    raise StepAlreadyPublished(
                        f"step {self._step} is already published (or being published by "
                        f"another writer) at {store.key_uri(step_key(self._step))}: "
                        f"{name} exists; published steps are immutable"
                    ) from exc
        self._uploaded[key] = None

    def _upload(self, key: str, chunks: Iterable[bytes]) -> tuple[str, int]:
        """Stream ``chunks`` to ``key``: one PUT up to a part's size, else multipart with at
        most two parts in memory (one uploading, one filling). Returns (sha256 hex, size)."""
        store = self._store
        where = store._uri_of(key)
        exclusive = key not in self._uploaded
        whole = hashlib.sha256()
        size = 0
        buf = bytearray()
        upload: _MultipartUpload | None = None
        try:
            for chunk in chunks:
                whole.update(chunk)
                size += len(chunk)
                view = memoryview(chunk)
                while view:
                    limit = part_size_for(upload.next_number if upload else 1, store.part_size)
                    if len(buf) >= limit:  # full, and more data follows: send it
                        if upload is None:
                            upload = _MultipartUpload.start(store, key)
                        upload.send(buf)
                        buf = bytearray()
                        continue
                    take = limit - len(buf)
                    buf += view[:take]
                    view = view[take:]
            if upload is None:
                expected, created = self._put_single(key, bytes(buf), exclusive)
            else:
                upload.send(buf)
                buf = bytearray()
                expected, created = upload.complete(exclusive)
        except BaseException:
            if upload is not None:
                upload.abort()
            raise
        if created:
            self._uploaded[key] = None
        self._verify(key, expected, where)
        return whole.hexdigest(), size

    def _put_single(self, key: str, data: bytes, exclusive: bool) -> tuple[_Expected, bool]:
        store = self._store
        expected = _Expected(len(data), _b64(hashlib.sha256(data).digest()), None)
        created = True
        with s3_errors("uploading", store._uri_of(key), store.bucket):
            try:
                store.put_object_checked(
                    key, data, checksum=expected.checksum, if_none_match=exclusive
                )
            except ClientError as exc:
                # The key exists already: fine only if it holds exactly these bytes (our own
                # retried request); _verify decides, and says whose object it is otherwise.
                if error_code(exc) not in _CONDITION_FAILED:
                    raise
                created = False
        return expected, created

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


class _MultipartUpload:
    """One multipart upload: a helper thread sends a part while the next one fills."""

    def __init__(self, store: S3Store, key: str, upload_id: str) -> None:
        self._store = store
        self._key = key
        self._upload_id = upload_id
        self._parts: list[_Part] = []
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rtj-s3-part")
        self._pending: Future[_Part] | None = None
        self._bytes_sent = 0
        self.next_number = 1

    @classmethod
    def start(cls, store: S3Store, key: str) -> _MultipartUpload:
        with s3_errors("starting multipart upload of", store._uri_of(key), store.bucket):
            created = store.client.create_multipart_upload(
                Bucket=store.bucket, Key=key, ChecksumAlgorithm="SHA256"
            )
        return cls(store, key, created["UploadId"])

    def _wait(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self._parts.append(pending.result())

    def send(self, buf: bytearray) -> None:
        """Upload ``buf`` as the next part once the previous part is stored: one part in
        flight beside the one being filled, and the copy made only after that wait."""
        if self.next_number > MAX_PARTS:
            raise StoreError(
                f"uploading {self._store._uri_of(self._key)}: more than {MAX_PARTS} parts"
            )
        self._wait()
        data = bytes(buf)
        self._pending = self._pool.submit(self._upload_part, self.next_number, data)
        self._bytes_sent += len(data)
        self.next_number += 1

    def _upload_part(self, number: int, data: bytes) -> _Part:
        store = self._store
        digest = hashlib.sha256(data).digest()
        with s3_errors(f"uploading part {number} of", store._uri_of(self._key), store.bucket):
            sent = store.client.upload_part(
                Bucket=store.bucket,
                Key=self._key,
                UploadId=self._upload_id,
                PartNumber=number,
                Body=data,
                ChecksumAlgorithm="SHA256",
                ChecksumSHA256=_b64(digest),
            )
        return _Part(number, sent["ETag"], digest)

    def complete(self, exclusive: bool) -> tuple[_Expected, bool]:
        """Complete the upload; returns what the object must look like and whether this
        upload created it (False: the key existed and If-None-Match refused it)."""
        store = self._store
        self._wait()
        self._pool.shutdown()
        parts: list[CompletedPartTypeDef] = [
            {"ETag": p.etag, "PartNumber": p.number, "ChecksumSHA256": _b64(p.digest)}
            for p in self._parts
        ]
        composite = _b64(hashlib.sha256(b"".join(p.digest for p in self._parts)).digest())
        expected = _Expected(self._bytes_sent, composite, len(self._parts))
        created = True
        with s3_errors("completing multipart upload of", store._uri_of(self._key), store.bucket):
            try:
                if exclusive:
                    store.client.complete_multipart_upload(
                        Bucket=store.bucket,
                        Key=self._key,
                        UploadId=self._upload_id,
                        MultipartUpload={"Parts": parts},
                        IfNoneMatch="*",
                    )
                else:
                    store.client.complete_multipart_upload(
                        Bucket=store.bucket,
                        Key=self._key,
                        UploadId=self._upload_id,
                        MultipartUpload={"Parts": parts},
                    )
            except ClientError as exc:
                if error_code(exc) not in _CONDITION_FAILED:
                    raise
                self.abort()  # the key exists: _verify decides whether it holds our bytes
                created = False
        return expected, created

    def abort(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        store = self._store
        with contextlib.suppress(ClientError, BotoCoreError):
            store.client.abort_multipart_upload(
                Bucket=store.bucket, Key=self._key, UploadId=self._upload_id
            )


def _local_chunks(source: Path) -> Iterator[bytes]:
    with s3_errors("reading", str(source)):
        yield from iter_file(source, CHUNK_BYTES)


class S3Store:
    """A checkpoint root ``s3://bucket/prefix``."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        client: S3Client | None = None,
        part_size: int = DEFAULT_PART_BYTES,
        page_size: int = LIST_PAGE,
    ) -> None:
        if not _BUCKET_RE.match(bucket):
            raise Refused(f"--root: {bucket!r} is not a valid S3 bucket name")
        prefix = prefix.strip("/")
        if prefix:
            parts = prefix.split("/")
            if any(p in ("", ".", "..") for p in parts):
                raise Refused(f"--root: S3 prefix {prefix!r} has empty, '.' or '..' components")
        if part_size < MIN_PART_BYTES:
            raise ValueError(f"part_size must be at least {MIN_PART_BYTES} bytes (S3's minimum)")
        self.bucket = bucket
        self.prefix = prefix
        self.part_size = part_size
        self.page_size = page_size
        self.client: S3Client = client if client is not None else make_client()

    @classmethod
    def from_uri(
        cls,
        uri: str,
        *,
        client: S3Client | None = None,
        part_size: int = DEFAULT_PART_BYTES,
    ) -> S3Store:
        if not uri.startswith("s3://"):
            raise Refused(f"--root: expected s3://BUCKET/PREFIX, got {uri!r}")
        rest = uri[len("s3://") :]
        if "?" in rest or "#" in rest:
            raise Refused(f"--root: {uri!r}: query strings and fragments are not supported")
        bucket, _, prefix = rest.partition("/")
        if not bucket:
            raise Refused(f"--root: {uri!r} names no bucket; expected s3://BUCKET/PREFIX")
        return cls(bucket, prefix, client=client, part_size=part_size)

    # -- names -------------------------------------------------------------------------

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def key_uri(self, key: str) -> str:
        return f"{self.uri}/{key}" if key else self.uri

    def _object_key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _root_prefix(self) -> str:
        return f"{self.prefix}/" if self.prefix else ""

    def _uri_of(self, object_key: str) -> str:
        return f"s3://{self.bucket}/{object_key}"

    def _step_prefix(self, name: str) -> str:
        return self._object_key(f"{STEPS_DIR}/{name}/")

    # -- reads -------------------------------------------------------------------------

    def root_exists(self) -> bool:
        """False when the bucket exists and nothing lies under the prefix yet; a missing
        bucket, denied access or an unreachable endpoint raise StoreError."""
        with s3_errors("listing", self.uri, self.bucket):
            listed = self.client.list_objects_v2(
                Bucket=self.bucket, Prefix=self._root_prefix(), MaxKeys=1
            )
        return bool(listed.get("KeyCount") or listed.get("Contents"))

    def read(self, key: str) -> bytes | None:
        return self.read_versioned(key)[0]

    def read_versioned(self, key: str) -> tuple[bytes | None, Version | None]:
        object_key = self._object_key(confine_path(key))
        with s3_errors("reading", self._uri_of(object_key), self.bucket):
            try:
                got = self.client.get_object(Bucket=self.bucket, Key=object_key)
            except ClientError as exc:
                if error_code(exc) == "NoSuchKey":
                    return None, None
                raise
            body = got["Body"]
            try:
                data = body.read()
            finally:
                body.close()
        return data, got["ETag"]

    def put_object_checked(
        self,
        object_key: str,
        data: bytes,
        *,
        checksum: str | None = None,
        if_none_match: bool = False,
        if_match: str | None = None,
    ) -> None:
        """One PUT with a SHA-256 the server checks, optionally conditional (raises
        ClientError; callers translate it)."""
        conditions: dict[str, str] = {}
        if if_none_match:
            conditions["IfNoneMatch"] = "*"
        if if_match is not None:
            conditions["IfMatch"] = if_match
        self.client.put_object(
            Bucket=self.bucket,
            Key=object_key,
            Body=data,
            ChecksumAlgorithm="SHA256",
            ChecksumSHA256=checksum or _b64(hashlib.sha256(data).digest()),
            **conditions,  # type: ignore[arg-type]
        )

    def put_if(self, key: str, data: bytes, expected: Version | None) -> bool:
        object_key = self._object_key(confine_path(key))
        with s3_errors("writing", self._uri_of(object_key), self.bucket):
            try:
                self.put_object_checked(
                    object_key, data, if_none_match=expected is None, if_match=expected
                )
            except ClientError as exc:
                code = error_code(exc)
                if code in _CONDITION_FAILED:
                    return False
                if expected is not None and code in _NOT_FOUND:
                    return False  # deleted since it was read: not the version expected
                raise
        return True

    def _list(self, prefix: str) -> Iterator[tuple[str, int]]:
        """(key, size) of every object under ``prefix``, following pagination."""
        paginator = self.client.get_paginator("list_objects_v2")
        with s3_errors("listing", self._uri_of(prefix), self.bucket):
            pages = paginator.paginate(
                Bucket=self.bucket, Prefix=prefix, PaginationConfig={"PageSize": self.page_size}
            )
            for page in pages:
                for item in page.get("Contents", []):
                    yield item["Key"], item.get("Size", 0)

    def list_step_dirs(self) -> list[StepDirEntry]:
        """Step prefixes under ``steps/`` (one delimited listing, no per-object walk), so
        ``modified`` is None: a prefix has no time of its own on S3."""
        steps = self._object_key(f"{STEPS_DIR}/")
        entries: list[StepDirEntry] = []
        paginator = self.client.get_paginator("list_objects_v2")
        with s3_errors("listing", self._uri_of(steps), self.bucket):
            pages = paginator.paginate(
                Bucket=self.bucket,
                Prefix=steps,
                Delimiter="/",
                PaginationConfig={"PageSize": self.page_size},
            )
            for page in pages:
                for common in page.get("CommonPrefixes", []):
                    child = common.get("Prefix", "")[len(steps) :].removesuffix("/")
                    name = parse_step_dir(child)
                    if name is not None:
                        entries.append(StepDirEntry(name, None))
        return entries

    def list_files(self, name: StepDirName) -> dict[str, int]:
        base = self._step_prefix(str(name))
        sizes: dict[str, int] = {}
        for key, size in self._list(base):
            rel = key[len(base) :]
            if rel and not rel.endswith("/"):  # "dir/" marker objects are not files
                sizes[rel] = size
        return sizes

    def sha256(self, name: StepDirName, path: str) -> str:
        """Hash the object's bytes here (streamed, bounded memory); ETags are not trusted."""
        object_key = self._step_prefix(str(name)) + confine_path(path)
        digest = hashlib.sha256()
        with s3_errors("hashing", self._uri_of(object_key), self.bucket):
            body = self.client.get_object(Bucket=self.bucket, Key=object_key)["Body"]
            try:
                for chunk in body.iter_chunks(READ_CHUNK):
                    digest.update(chunk)
            finally:
                body.close()
        return digest.hexdigest()

    # -- writes ------------------------------------------------------------------------

    def begin_step(self, step: int, attempt: str, *, fresh: bool = True) -> S3StepWriter:
        """Refuse a published step; with ``fresh`` delete a crashed attempt's leftovers
        (objects and unfinished multipart uploads) under the step prefix."""
        validate_attempt(attempt)
        prefix = self._step_prefix(step_dir_name(step))
        committed = prefix + COMMITTED_FILE
        published = StepAlreadyPublished(
            f"step {step} is already published at {self.key_uri(step_key(step))}; "
            "published steps are immutable"
        )
        with s3_errors("starting step", self._uri_of(prefix), self.bucket):
            if self._exists(committed):
                raise published
            if fresh:
                self._abort_uploads(prefix)
                leftovers = [key for key, _size in self._list(prefix)]
                if committed in leftovers:  # published meanwhile by another writer
                    raise published
                self._delete_keys(leftovers)
        return S3StepWriter(self, step, attempt)

    def delete_step_dir(self, name: StepDirName) -> None:
        """Delete COMMITTED first (the step stops verifying), then everything else."""
        prefix = self._step_prefix(str(name))
        with s3_errors("deleting", self._uri_of(prefix), self.bucket):
            self.client.delete_object(Bucket=self.bucket, Key=prefix + COMMITTED_FILE)
            self._delete_keys([key for key, _size in self._list(prefix)])

    def _exists(self, object_key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=object_key)
        except ClientError as exc:
            if error_code(exc) in _NOT_FOUND:
                return False
            raise
        return True

    def _abort_uploads(self, prefix: str) -> None:
        paginator = self.client.get_paginator("list_multipart_uploads")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
            for upload in page.get("Uploads", []):
                try:
                    self.client.abort_multipart_upload(
                        Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                    )
                except ClientError as exc:
                    if error_code(exc) != "NoSuchUpload":
                        raise

    def _delete_keys(self, keys: list[str]) -> None:
        with s3_errors("deleting objects under", self.uri, self.bucket):
            for start in range(0, len(keys), DELETE_BATCH):
                batch: list[ObjectIdentifierTypeDef] = [
                    {"Key": key} for key in keys[start : start + DELETE_BATCH]
                ]
                result = self.client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True}
                )
                errors = result.get("Errors", [])
                if errors:
                    first = errors[0]
                    raise StoreError(
                        f"deleting {self._uri_of(first.get('Key', '?'))}: "
                        f"{first.get('Code', 'Unknown')}: {first.get('Message', '')} "
                        f"({len(errors)} object(s) not deleted)"
                    )
