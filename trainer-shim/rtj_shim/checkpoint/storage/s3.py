"""Checkpoint store on S3 (or any S3 API): boto3 is imported by this module and its parts.

S3 has no rename, so a step is written in place under ``steps/step-<12 digits>/`` and is
made visible by its ``COMMITTED`` object alone: a step without COMMITTED does not exist
for a resolver. Publishing therefore:

1. uploads every shard directly under the step prefix, never replacing an object another
   writer created (``If-None-Match: *``), with a SHA-256 checksum the server checks per
   request (per part for multipart uploads, whose parts go up in parallel), hashing the
   whole shard locally while uploading; afterwards each object's size and stored checksum
   are compared with what was sent (:mod:`rtj_shim.checkpoint.storage.s3_upload`);
2. writes ``manifest.json`` and then ``COMMITTED`` with ``If-None-Match: *``, so of two
   writers racing to publish the same step exactly one wins;
3. leaves ``latest.json`` to :class:`rtj_shim.checkpoint.protocol.CommitProtocol` (``put_if``:
   ``If-Match`` on the ETag it read, or ``If-None-Match: *`` when it read nothing).

``begin_step(fresh=True)`` deletes what a crashed attempt left under the step prefix
(objects and unfinished multipart uploads). Every boto3/botocore error is raised as
:class:`rtj_shim.errors.StoreError` naming the bucket, the key and the S3 error code
(:mod:`rtj_shim.checkpoint.storage.s3_client`); a key that does not exist is an ordinary ``None``, a
bucket that does not exist is an error.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, cast

from botocore.exceptions import ClientError

from rtj_shim.checkpoint.layout import (
    COMMITTED_FILE,
    STEPS_DIR,
    StepDirName,
    parse_step_dir,
    step_dir_name,
    step_key,
    validate_attempt,
)
from rtj_shim.checkpoint.manifest import confine_path
from rtj_shim.checkpoint.storage.base import StepDirEntry, Version
from rtj_shim.checkpoint.storage.s3_client import (
    CONDITION_FAILED,
    NOT_FOUND,
    b64,
    client_config,
    error_code,
    make_client,
    s3_errors,
    sign_checksummed_bodies_once,
)
from rtj_shim.checkpoint.storage.s3_upload import (
    DEFAULT_CONCURRENCY,
    DEFAULT_PART_BYTES,
    MAX_PARTS,
    MIN_PART_BYTES,
    S3StepWriter,
    part_size_for,
)
from rtj_shim.errors import Refused, StepAlreadyPublished, StoreError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import ObjectIdentifierTypeDef

__all__ = [
    "MAX_PARTS",
    "S3StepWriter",
    "S3Store",
    "client_config",
    "make_client",
    "part_size_for",
    "s3_errors",
]

DELETE_BATCH = 1_000  # DeleteObjects' limit
LIST_PAGE = 1_000  # ListObjectsV2's maximum page
READ_CHUNK = 1024 * 1024
_BUCKET_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{1,254}$")


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
        concurrency: int = DEFAULT_CONCURRENCY,
    ) -> None:
        """``concurrency``: parts of one object uploaded at once; memory while uploading
        is bounded by ``concurrency + 1`` parts of ``part_size``."""
        if not _BUCKET_RE.match(bucket):
            raise Refused(f"bucket: {bucket!r} is not a valid S3 bucket name")
        prefix = prefix.strip("/")
        if prefix:
            parts = prefix.split("/")
            if any(p in ("", ".", "..") for p in parts):
                raise Refused(f"prefix: S3 prefix {prefix!r} has empty, '.' or '..' components")
        if part_size < MIN_PART_BYTES:
            raise ValueError(f"part_size must be at least {MIN_PART_BYTES} bytes (S3's minimum)")
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.bucket = bucket
        self.prefix = prefix
        self.part_size = part_size
        self.page_size = page_size
        self.concurrency = concurrency
        self.client: S3Client = client if client is not None else make_client()
        sign_checksummed_bodies_once(self.client)

    @classmethod
    def from_uri(
        cls,
        uri: str,
        *,
        client: S3Client | None = None,
        part_size: int = DEFAULT_PART_BYTES,
        concurrency: int = DEFAULT_CONCURRENCY,
        name: str = "root",
    ) -> S3Store:
        """The store at ``uri``; errors name the argument it came from (``name``: the
        library's ``root``, the CLI's ``--root``)."""
        if not uri.startswith("s3://"):
            raise Refused(f"{name}: expected s3://BUCKET/PREFIX, got {uri!r}")
        rest = uri[len("s3://") :]
        if "?" in rest or "#" in rest:
            raise Refused(f"{name}: {uri!r}: query strings and fragments are not supported")
        bucket, _, prefix = rest.partition("/")
        if not bucket:
            raise Refused(f"{name}: {uri!r} names no bucket; expected s3://BUCKET/PREFIX")
        try:
            return cls(bucket, prefix, client=client, part_size=part_size, concurrency=concurrency)
        except Refused as exc:  # the bucket or prefix of the URI: name where it came from
            raise Refused(f"{name}: {exc}") from None

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
        data: bytes | bytearray,
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
            Body=cast(bytes, data),  # botocore takes a bytearray (no copy)
            ChecksumAlgorithm="SHA256",
            ChecksumSHA256=checksum or b64(hashlib.sha256(data).digest()),
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
                if code in CONDITION_FAILED:
                    return False
                if expected is not None and code in NOT_FOUND:
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
            if error_code(exc) in NOT_FOUND:
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
