"""The S3 backend against a real S3 API server on loopback (moto's server, auth enforced).

Publishing goes through ``CommitProtocol.publish_directory``; resolution through
``resolver.resolve``; verification through ``verifier.verify_step``. Corruption is made
behind the store's back with a separate client. Crash consistency runs a child process
that publishes through the same code and is SIGKILLed at named points of its S3 calls.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from botocore.exceptions import ClientError

from e2e import s3server
from rtj_shim.checkpoint.layout import (
    COMMITTED_FILE,
    LATEST_FILE,
    MANIFEST_FILE,
    RUN_FILE,
    StepDirName,
)
from rtj_shim.checkpoint.manifest import committed_marker, decode_manifest
from rtj_shim.checkpoint.protocol import CommitProtocol, StepMetadata
from rtj_shim.checkpoint.resolver import resolve
from rtj_shim.checkpoint.storage import open_store
from rtj_shim.checkpoint.storage import s3 as s3mod
from rtj_shim.checkpoint.storage.s3 import S3Store, part_size_for
from rtj_shim.checkpoint.verification import Depth
from rtj_shim.checkpoint.verifier import verify_step
from rtj_shim.errors import Refused, RunOwnershipConflict, StepAlreadyPublished, StoreError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

pytestmark = pytest.mark.s3

MiB = 1024 * 1024
RUN = "run-s3"


# -- helpers ---------------------------------------------------------------------------


def split_root(root: str) -> tuple[str, str]:
    bucket, _, prefix = root[len("s3://") :].partition("/")
    return bucket, prefix


def obj_key(root: str, rel: str) -> str:
    return f"{split_root(root)[1]}/{rel}"


def step_rel(step: int, name: str = "") -> str:
    base = f"steps/step-{step:012d}"
    return f"{base}/{name}" if name else base


def make_dir(base: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        path = base / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return base


def small_files(step: int) -> dict[str, bytes]:
    rng = random.Random(step)
    return {
        "model/rank-0.bin": rng.randbytes(70_001),
        "optim/rank-0.bin": rng.randbytes(33_333),
        "state.json": json.dumps({"step": step}).encode(),
        "empty.bin": b"",
    }


def publish(root: str, tmp_path: Path, step: int, attempt: str = "1", run_id: str = RUN) -> None:
    source = make_dir(tmp_path / f"src-{step}-{attempt}-{run_id}", small_files(step))
    CommitProtocol(open_store(root), run_id=run_id, attempt=attempt).publish_directory(step, source)


def get(admin: S3Client, root: str, rel: str) -> bytes:
    bucket = split_root(root)[0]
    return admin.get_object(Bucket=bucket, Key=obj_key(root, rel))["Body"].read()


def put(admin: S3Client, root: str, rel: str, data: bytes) -> None:
    admin.put_object(Bucket=split_root(root)[0], Key=obj_key(root, rel), Body=data)


def delete(admin: S3Client, root: str, rel: str) -> None:
    admin.delete_object(Bucket=split_root(root)[0], Key=obj_key(root, rel))


def keys_under(admin: S3Client, root: str, rel: str) -> list[str]:
    bucket = split_root(root)[0]
    prefix = obj_key(root, rel)
    listed = admin.list_objects_v2(Bucket=bucket, Prefix=prefix)
    return sorted(item["Key"][len(prefix) :] for item in listed.get("Contents", []))


def pending_uploads(admin: S3Client, root: str) -> list[str]:
    bucket, prefix = split_root(root)
    listed = admin.list_multipart_uploads(Bucket=bucket, Prefix=prefix + "/")
    return [u["Key"] for u in listed.get("Uploads", [])]


def reasons(resolution: object) -> dict[int, str]:
    return {s.step: s.reason for s in resolution.skipped}  # type: ignore[attr-defined]


# -- URIs and configuration ------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("s3://bucket/a/b", "s3://bucket/a/b"),
        ("s3://bucket/a/b/", "s3://bucket/a/b"),
        ("s3://bucket", "s3://bucket"),
    ],
)
def test_uri_parsing(uri: str, expected: str, s3_root: str) -> None:
    store = S3Store.from_uri(uri)
    assert store.uri == expected
    assert store.key_uri("latest.json") == f"{expected}/latest.json"
    assert store.key_uri("") == expected


@pytest.mark.parametrize(
    "uri", ["s3://", "s3:///prefix", "s3://b/a//c", "s3://b/../x", "s3://b/p?x"]
)
def test_bad_uris_are_refused(uri: str) -> None:
    with pytest.raises(Refused):
        S3Store.from_uri(uri)


def test_part_sizes_grow_so_10000_parts_reach_far() -> None:
    base = 16 * MiB
    assert part_size_for(1, base) == base
    assert part_size_for(1000, base) == base
    assert part_size_for(1001, base) == 2 * base
    total = sum(part_size_for(n, base) for n in range(1, s3mod.MAX_PARTS + 1))
    assert total > 10 * 1024**4  # far beyond any shard; memory stays 2 parts


def test_client_honours_generic_endpoint_env(
    s3_root: str, s3_server: s3server.S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.url)
    publish(s3_root, tmp_path, 3)
    assert resolve(open_store(s3_root), Depth.DEEP).step == 3


# -- round trip ------------------------------------------------------------------------


def test_round_trip_small_and_multipart(s3_root: str, s3_admin: S3Client, tmp_path: Path) -> None:
    big = random.Random(7).randbytes(40 * MiB + 123)
    files = {**small_files(5), "big/shard.bin": big}
    source = make_dir(tmp_path / "src", files)
    store = open_store(s3_root)
    assert isinstance(store, S3Store) and store.part_size == 16 * MiB
    assert store.root_exists() is False

    result = CommitProtocol(store, run_id=RUN, attempt="1").publish_directory(5, source)
    assert result.step == 5 and result.files == len(files)
    assert result.uri == f"{s3_root}/steps/step-000000000005"

    resolution = resolve(store, Depth.DEEP)
    assert (resolution.step, resolution.uri, resolution.skipped) == (5, result.uri, ())
    assert resolution.hint_problem is None
    verdict = verify_step(store, 5, Depth.DEEP)
    assert verdict.valid, verdict.reason
    assert verdict.manifest is not None
    recorded = {f.path: (f.bytes, f.sha256) for f in verdict.manifest.files}
    assert recorded == {
        path: (len(data), hashlib.sha256(data).hexdigest()) for path, data in files.items()
    }
    listed = store.list_files(StepDirName(5))
    assert set(listed) == {*files, MANIFEST_FILE, COMMITTED_FILE}
    assert store.sha256(StepDirName(5), "big/shard.bin") == hashlib.sha256(big).hexdigest()
    assert [e.name for e in store.list_step_dirs()] == [StepDirName(5)]

    # The large shard went up as a 3-part multipart upload with a SHA-256 composite checksum.
    bucket = split_root(s3_root)[0]
    key = obj_key(s3_root, step_rel(5, "big/shard.bin"))
    head = s3_admin.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    assert head["ETag"].strip('"').endswith("-3")
    part_digests = b"".join(
        hashlib.sha256(big[i : i + 16 * MiB]).digest() for i in range(0, len(big), 16 * MiB)
    )
    composite = base64.b64encode(hashlib.sha256(part_digests).digest()).decode()
    assert head["ChecksumSHA256"].partition("-")[0] == composite
    small = s3_admin.head_object(
        Bucket=bucket, Key=obj_key(s3_root, step_rel(5, "state.json")), ChecksumMode="ENABLED"
    )
    assert (
        small["ChecksumSHA256"]
        == base64.b64encode(hashlib.sha256(files["state.json"]).digest()).decode()
    )

    latest = json.loads(get(s3_admin, s3_root, LATEST_FILE))
    assert (latest["step"], latest["run_id"]) == (5, RUN)
    assert json.loads(get(s3_admin, s3_root, RUN_FILE))["writer_attempt"] == "1"
    committed = get(s3_admin, s3_root, step_rel(5, COMMITTED_FILE))
    assert committed == committed_marker(get(s3_admin, s3_root, step_rel(5, MANIFEST_FILE)))
    assert pending_uploads(s3_admin, s3_root) == []


def test_write_file_streams_odd_chunks_across_parts(s3_root: str, s3_admin: S3Client) -> None:
    store = S3Store.from_uri(s3_root, part_size=5 * MiB)
    data = random.Random(3).randbytes(12 * MiB + 5)
    piece = 3 * MiB + 7

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(data), piece):
            yield data[i : i + piece]

    writer = store.begin_step(9, "1")
    entry = writer.write_file("w/odd.bin", chunks())
    assert (entry.bytes, entry.sha256) == (len(data), hashlib.sha256(data).hexdigest())
    assert get(s3_admin, s3_root, step_rel(9, "w/odd.bin")) == data
    head = s3_admin.head_object(
        Bucket=split_root(s3_root)[0], Key=obj_key(s3_root, step_rel(9, "w/odd.bin"))
    )
    assert head["ETag"].strip('"').endswith("-3")
    writer.abort()
    assert keys_under(s3_admin, s3_root, step_rel(9)) == []


def test_checksummed_bodies_are_hashed_once_not_again_for_the_signature(
    s3_root: str, s3_admin: S3Client
) -> None:
    """A PUT or part carrying the SHA-256 of its body in the signed x-amz-checksum-sha256
    header is signed with UNSIGNED-PAYLOAD (no second hash of the body); other requests
    keep their signed payload hash; the server accepts both (auth is enforced)."""
    store = S3Store.from_uri(s3_root, part_size=5 * MiB)
    sent: list[tuple[str, str, bool]] = []

    def record(request: object, **_: object) -> None:
        headers = request.headers  # type: ignore[attr-defined]
        sent.append(
            (
                request.method,  # type: ignore[attr-defined]
                str(headers.get("X-Amz-Content-SHA256", b""), "ascii"),
                "x-amz-checksum-sha256" in headers,
            )
        )

    store.client.meta.events.register("before-send.s3", record)
    writer = store.begin_step(3, "1")
    data = random.Random(4).randbytes(11 * MiB)
    entry = writer.write_file("big.bin", [data])
    small = writer.write_file("small.bin", [b"tiny"])
    assert entry.sha256 == hashlib.sha256(data).hexdigest()
    assert small.sha256 == hashlib.sha256(b"tiny").hexdigest()
    assert get(s3_admin, s3_root, step_rel(3, "big.bin")) == data
    bodies = [(method, payload) for method, payload, checksummed in sent if checksummed]
    assert len(bodies) == 3 + 1  # three parts and one PUT
    assert {payload for _, payload in bodies} == {"UNSIGNED-PAYLOAD"}
    others = [payload for _, payload, checksummed in sent if not checksummed]
    assert others and "UNSIGNED-PAYLOAD" not in others
    writer.abort()


def test_failed_multipart_upload_is_aborted(s3_root: str, s3_admin: S3Client) -> None:
    store = S3Store.from_uri(s3_root, part_size=5 * MiB)

    def failing() -> Iterator[bytes]:
        yield b"x" * (6 * MiB)
        yield b"y" * MiB
        raise RuntimeError("source broke")

    writer = store.begin_step(4, "1")
    with pytest.raises(RuntimeError, match="source broke"):
        writer.write_file("a.bin", failing())
    assert pending_uploads(s3_admin, s3_root) == []
    assert keys_under(s3_admin, s3_root, step_rel(4)) == []


def test_copy_file_refuses_non_regular_files(s3_root: str, tmp_path: Path) -> None:
    target = tmp_path / "real.bin"
    target.write_bytes(b"x")
    link = tmp_path / "link.bin"
    link.symlink_to(target)
    writer = open_store(s3_root).begin_step(1, "1")
    with pytest.raises(Refused, match="not a regular file"):
        writer.copy_file("link.bin", link)
    with pytest.raises(Refused, match="not a regular file"):
        writer.copy_file("dir", tmp_path)
    writer.abort()


# -- corruption ------------------------------------------------------------------------


def _flip(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0x01]) + data[middle + 1 :]


def _escape_manifest(admin: S3Client, root: str) -> None:
    """A manifest whose COMMITTED matches but whose path leaves the step."""
    manifest = json.loads(get(admin, root, step_rel(20, MANIFEST_FILE)))
    manifest["files"][0]["path"] = "../step-000000000010/model/rank-0.bin"
    raw = (json.dumps(manifest, sort_keys=True, indent=2) + "\n").encode()
    put(admin, root, step_rel(20, MANIFEST_FILE), raw)
    put(admin, root, step_rel(20, COMMITTED_FILE), committed_marker(raw))


CORRUPTIONS = {
    "missing-committed": (
        lambda a, r: delete(a, r, step_rel(20, COMMITTED_FILE)),
        "COMMITTED is missing",
    ),
    "truncated-shard": (
        lambda a, r: put(
            a, r, step_rel(20, "model/rank-0.bin"), get(a, r, step_rel(20, "model/rank-0.bin"))[:-1]
        ),
        "has 70000 bytes",
    ),
    "missing-shard": (
        lambda a, r: delete(a, r, step_rel(20, "optim/rank-0.bin")),
        "'optim/rank-0.bin' listed in manifest.json is missing",
    ),
    "edited-manifest": (
        lambda a, r: put(
            a,
            r,
            step_rel(20, MANIFEST_FILE),
            get(a, r, step_rel(20, MANIFEST_FILE)).replace(b'"world_size": 1', b'"world_size": 2'),
        ),
        "edited or swapped manifest",
    ),
    "swapped-manifest": (
        lambda a, r: put(a, r, step_rel(20, MANIFEST_FILE), get(a, r, step_rel(10, MANIFEST_FILE))),
        "edited or swapped manifest",
    ),
    "manifest-path-escapes": (_escape_manifest, "escapes the step directory"),
    "garbage-committed": (
        lambda a, r: put(a, r, step_rel(20, COMMITTED_FILE), b"\x00\xffnot a marker"),
        "expected 'sha256:<64 hex digits>'",
    ),
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_deep_resolution_skips_a_corrupted_step(
    kind: str, s3_root: str, s3_admin: S3Client, tmp_path: Path
) -> None:
    publish(s3_root, tmp_path, 10)
    publish(s3_root, tmp_path, 20)
    corrupt, reason = CORRUPTIONS[kind]
    corrupt(s3_admin, s3_root)
    store = open_store(s3_root)
    for depth in (Depth.SHALLOW, Depth.DEEP):
        resolution = resolve(store, depth)
        assert resolution.step == 10, (depth, resolution)
        assert reason in reasons(resolution)[20]
        assert not verify_step(store, 20, depth).valid


def test_flipped_byte_is_caught_by_deep_only(
    s3_root: str, s3_admin: S3Client, tmp_path: Path
) -> None:
    publish(s3_root, tmp_path, 10)
    publish(s3_root, tmp_path, 20)
    shard = step_rel(20, "optim/rank-0.bin")
    put(s3_admin, s3_root, shard, _flip(get(s3_admin, s3_root, shard)))
    store = open_store(s3_root)
    assert resolve(store, Depth.SHALLOW).step == 20
    deep = resolve(store, Depth.DEEP)
    assert deep.step == 10
    assert "'optim/rank-0.bin' has sha256" in reasons(deep)[20]


def test_garbage_and_stale_hints_never_decide(
    s3_root: str, s3_admin: S3Client, tmp_path: Path
) -> None:
    publish(s3_root, tmp_path, 10)
    publish(s3_root, tmp_path, 20)
    store = open_store(s3_root)
    put(s3_admin, s3_root, LATEST_FILE, b"{not json")
    resolution = resolve(store, Depth.DEEP)
    assert resolution.step == 20 and resolution.skipped == ()
    assert resolution.hint_problem is not None and "not valid JSON" in resolution.hint_problem
    put(s3_admin, s3_root, LATEST_FILE, json.dumps({"step": 10}).encode())
    resolution = resolve(store, Depth.DEEP)
    assert resolution.step == 20
    assert resolution.hint_problem is not None and "stale" in resolution.hint_problem
    put(s3_admin, s3_root, LATEST_FILE, json.dumps({"step": 999}).encode())
    resolution = resolve(store, Depth.DEEP)
    assert resolution.step == 20
    assert resolution.hint_problem is not None and "not published" in resolution.hint_problem


def test_leftover_uncommitted_step_is_skipped(
    s3_root: str, s3_admin: S3Client, tmp_path: Path
) -> None:
    publish(s3_root, tmp_path, 10)
    store = open_store(s3_root)
    writer = store.begin_step(30, "2")
    writer.write_file("model/rank-0.bin", [b"half", b" written"])  # then the writer dies
    resolution = resolve(store, Depth.DEEP)
    assert resolution.step == 10
    assert "COMMITTED is missing" in reasons(resolution)[30]
    # The next attempt starts the step afresh: the leftover is gone, the publish succeeds.
    publish(s3_root, tmp_path, 30, attempt="3")
    assert resolve(store, Depth.DEEP).step == 30
    assert "model/rank-0.bin" in store.list_files(StepDirName(30))
    assert (
        get(s3_admin, s3_root, step_rel(30, "model/rank-0.bin"))
        == small_files(30)["model/rank-0.bin"]
    )


# -- publishing rules ------------------------------------------------------------------


def test_publishing_a_step_twice_is_refused(
    s3_root: str, s3_admin: S3Client, tmp_path: Path
) -> None:
    publish(s3_root, tmp_path, 10)
    before = {
        k: get(s3_admin, s3_root, step_rel(10, k))
        for k in keys_under(s3_admin, s3_root, step_rel(10) + "/")
    }
    with pytest.raises(StepAlreadyPublished):
        publish(s3_root, tmp_path, 10, attempt="2")
    after = {
        k: get(s3_admin, s3_root, step_rel(10, k))
        for k in keys_under(s3_admin, s3_root, step_rel(10) + "/")
    }
    assert after == before
    assert verify_step(open_store(s3_root), 10, Depth.DEEP).valid


def test_a_zombie_writers_abort_leaves_a_step_another_writer_published_alone(
    s3_root: str,
) -> None:
    """The keys of a step are the same for every writer: a zombie (attempt 1) that wrote
    rank-0.bin, was frozen, and aborts after attempt 2 started the step afresh, wrote the
    same key and published, deletes nothing of it."""
    store = open_store(s3_root)
    zombie = store.begin_step(50, "1")
    zombie.write_file("rank-0.bin", [b"old" * 100])
    protocol = CommitProtocol(store, run_id=RUN, attempt="2")
    fresh = protocol.begin(50)
    entry = fresh.write_file("rank-0.bin", [b"new" * 100])
    protocol.publish(fresh, [entry], StepMetadata())
    zombie.abort()
    verdict = verify_step(store, 50, Depth.DEEP)
    assert verdict.valid, verdict.reason


def test_racing_writers_one_commit_wins_and_the_loser_leaves_it_intact(
    s3_root: str, s3_admin: S3Client
) -> None:
    store = open_store(s3_root)
    protocol = CommitProtocol(store, run_id=RUN, attempt="1")
    first = protocol.begin(40)
    second = store.begin_step(40, "1", fresh=False)
    a = first.write_file("rank-0.bin", [b"zero" * 100])
    b = second.write_file("rank-1.bin", [b"one" * 100])
    protocol.publish(first, [a], StepMetadata())
    with pytest.raises(StepAlreadyPublished):
        protocol.publish(second, [b], StepMetadata())
    second.abort()  # deletes only what the loser itself created
    first.abort()  # after a successful commit: a no-op, the step is immutable
    verdict = verify_step(store, 40, Depth.DEEP)
    assert verdict.valid, verdict.reason
    assert verdict.manifest is not None and [f.path for f in verdict.manifest.files] == [
        "rank-0.bin"
    ]
    assert "rank-1.bin" not in keys_under(s3_admin, s3_root, step_rel(40) + "/")


def test_a_shard_another_writer_created_is_never_replaced(s3_root: str, s3_admin: S3Client) -> None:
    store = open_store(s3_root)
    first = store.begin_step(50, "1")
    first.write_file("shared.bin", [b"first writer"])
    second = store.begin_step(50, "1", fresh=False)
    with pytest.raises(StoreError, match="holds 12 bytes, 14 were written"):
        second.write_file("shared.bin", [b"second writer!"])
    with pytest.raises(StoreError, match=r"stored SHA-256 checksum .* differs"):
        second.write_file("shared.bin", [b"other writer"])  # same size, other bytes
    assert get(s3_admin, s3_root, step_rel(50, "shared.bin")) == b"first writer"
    # Identical bytes (a retried request whose first answer was lost) are accepted.
    entry = second.write_file("shared.bin", [b"first writer"])
    assert entry.bytes == len(b"first writer")
    second.abort()  # the object was not created by `second`: it stays
    assert get(s3_admin, s3_root, step_rel(50, "shared.bin")) == b"first writer"


def test_delete_step_dir_removes_commit_first_then_everything(
    s3_root: str, s3_admin: S3Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    publish(s3_root, tmp_path, 10)
    publish(s3_root, tmp_path, 20)
    monkeypatch.setattr(s3mod, "DELETE_BATCH", 2)  # exercise the batching
    store = open_store(s3_root)
    store.delete_step_dir(StepDirName(10))
    assert keys_under(s3_admin, s3_root, step_rel(10) + "/") == []
    assert [e.name.step for e in store.list_step_dirs()] == [20]
    assert resolve(store, Depth.DEEP).step == 20


def test_delete_marks_first_so_a_failed_delete_leaves_no_resumable_step(
    s3_root: str, s3_admin: S3Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    publish(s3_root, tmp_path, 10)
    publish(s3_root, tmp_path, 20)
    store = open_store(s3_root)
    assert isinstance(store, S3Store)

    def broken(**kwargs: object) -> object:
        raise ClientError({"Error": {"Code": "InternalError", "Message": "boom"}}, "DeleteObjects")

    monkeypatch.setattr(store.client, "delete_objects", broken)
    with pytest.raises(StoreError, match="InternalError"):
        store.delete_step_dir(StepDirName(20))
    assert "model/rank-0.bin" in keys_under(s3_admin, s3_root, step_rel(20) + "/")
    resolution = resolve(store, Depth.DEEP)
    assert resolution.step == 10
    assert "COMMITTED is missing" in reasons(resolution)[20]


def test_begin_refuses_a_published_step_even_when_joining(s3_root: str, tmp_path: Path) -> None:
    publish(s3_root, tmp_path, 10)
    store = open_store(s3_root)
    for fresh in (True, False):
        with pytest.raises(StepAlreadyPublished):
            store.begin_step(10, "2", fresh=fresh)
    assert verify_step(store, 10, Depth.DEEP).valid


def test_listings_paginate(s3_root: str, tmp_path: Path) -> None:
    for step in (1, 2, 3):
        publish(s3_root, tmp_path, step)
    store = S3Store.from_uri(s3_root)
    store.page_size = 2
    assert sorted(e.name.step for e in store.list_step_dirs()) == [1, 2, 3]
    assert len(store.list_files(StepDirName(2))) == len(small_files(2)) + 2
    assert resolve(store, Depth.DEEP).step == 3


# -- conditional writes and ownership --------------------------------------------------


def test_conditional_writes(s3_root: str, s3_admin: S3Client) -> None:
    store = open_store(s3_root)
    assert store.put_if("latest.json", b"v1", None) is True
    assert store.put_if("latest.json", b"again", None) is False  # If-None-Match: * on a key
    data, v1 = store.read_versioned("latest.json")
    assert data == b"v1" and v1 is not None
    assert store.put_if("latest.json", b"v2", v1) is True
    assert store.put_if("latest.json", b"stale", v1) is False  # If-Match on an old ETag
    assert store.read("latest.json") == b"v2"
    _, v2 = store.read_versioned("latest.json")
    delete(s3_admin, s3_root, "latest.json")
    assert store.put_if("latest.json", b"gone", v2) is False  # deleted since it was read
    assert store.read_versioned("latest.json") == (None, None)


def test_advance_hint_never_moves_backwards(
    s3_root: str, s3_admin: S3Client, tmp_path: Path
) -> None:
    publish(s3_root, tmp_path, 30)
    protocol = CommitProtocol(open_store(s3_root), run_id=RUN, attempt="1")
    assert protocol.advance_hint(20) is False
    assert json.loads(get(s3_admin, s3_root, LATEST_FILE))["step"] == 30
    assert protocol.advance_hint(30) is False
    assert protocol.advance_hint(31) is True
    assert json.loads(get(s3_admin, s3_root, LATEST_FILE))["step"] == 31


def test_run_ownership(s3_root: str, s3_admin: S3Client, tmp_path: Path) -> None:
    publish(s3_root, tmp_path, 10, attempt="2")
    with pytest.raises(RunOwnershipConflict, match="belongs to run"):
        publish(s3_root, tmp_path, 11, attempt="2", run_id="run-other")
    with pytest.raises(RunOwnershipConflict, match="stale"):
        publish(s3_root, tmp_path, 12, attempt="1")
    publish(s3_root, tmp_path, 13, attempt="3")
    assert json.loads(get(s3_admin, s3_root, RUN_FILE))["writer_attempt"] == "3"
    assert [e.name.step for e in open_store(s3_root).list_step_dirs()] == [10, 13]


# -- store errors are never "no checkpoint" --------------------------------------------


def test_a_root_that_does_not_exist_yet_is_no_checkpoint(s3_root: str) -> None:
    resolution = resolve(open_store(s3_root), Depth.DEEP)
    assert (resolution.step, resolution.skipped) == (None, ())
    bucket = split_root(s3_root)[0]
    assert resolve(open_store(f"s3://{bucket}"), Depth.DEEP).step is None


def _assert_store_error(root: str, *needles: str) -> StoreError:
    store = open_store(root)
    with pytest.raises(StoreError) as caught:
        resolve(store, Depth.DEEP)
    for needle in needles:
        assert needle in str(caught.value)
    return caught.value


def test_wrong_credentials_are_a_store_error(
    s3_root: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    publish(s3_root, tmp_path, 10)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWRONGWRONGWRONG0")
    _assert_store_error(s3_root, "InvalidAccessKeyId", split_root(s3_root)[0])


def test_wrong_secret_is_a_store_error(
    s3_root: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    publish(s3_root, tmp_path, 10)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    _assert_store_error(s3_root, "SignatureDoesNotMatch")


def test_access_denied_is_a_store_error(
    s3_root: str, s3_server: s3server.S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    publish(s3_root, tmp_path, 10)
    s3server.set_aws_env(monkeypatch, s3_server.url, s3_server.denied)
    _assert_store_error(s3_root, "AccessDenied", split_root(s3_root)[0])
    with pytest.raises(StoreError, match="AccessDenied"):
        publish(s3_root, tmp_path, 11)


def test_missing_bucket_is_a_store_error(s3_root: str, tmp_path: Path) -> None:
    root = "s3://rtj-no-such-bucket/some/prefix"
    _assert_store_error(root, "NoSuchBucket", "'rtj-no-such-bucket' does not exist")
    with pytest.raises(StoreError, match="NoSuchBucket"):
        publish(root, tmp_path, 1)


def test_endpoint_down_is_a_store_error_in_bounded_time(
    s3_root: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{s3server.closed_port()}")
    started = time.monotonic()
    _assert_store_error(s3_root, "EndpointConnectionError")
    with pytest.raises(StoreError):
        publish(s3_root, tmp_path, 1)
    assert time.monotonic() - started < 20


# -- crash consistency -----------------------------------------------------------------

# The child publishes STEP (files below) through CommitProtocol.publish_directory with a
# 5 MiB part size. Every S3 call of its client announces ``before:<op>:<name>`` and
# ``after:<op>:<name>`` (``#n`` for the n-th repeat); at the requested point it writes the
# marker file and sleeps until the parent SIGKILLs it.
CHILD = r"""
import collections, os, sys, time
from pathlib import Path
from rtj_shim.checkpoint.protocol import CommitProtocol, StepMetadata
from rtj_shim.checkpoint.storage.s3 import S3Store

root, step, attempt, source, stop, marker = sys.argv[1:7]
store = S3Store.from_uri(root, part_size=5 * 1024 * 1024)
seen = collections.Counter()

def point(name):
    seen[name] += 1
    if seen[name] > 1:
        name = f"{name}#{seen[name]}"
    if name == stop:
        tmp = marker + ".tmp"
        Path(tmp).write_text(name)
        os.replace(tmp, marker)
        while True:
            time.sleep(60)

def wrap(op):
    real = getattr(store.client, op)
    def call(**kwargs):
        name = kwargs["Key"].rsplit("/", 1)[-1]
        point(f"before:{op}:{name}")
        result = real(**kwargs)
        point(f"after:{op}:{name}")
        return result
    setattr(store.client, op, call)

for op in ("put_object", "create_multipart_upload", "upload_part", "complete_multipart_upload"):
    wrap(op)
protocol = CommitProtocol(store, run_id=sys.argv[7], attempt=attempt)
protocol.publish_directory(int(step), Path(source))
sys.exit(3)  # the stop point was never reached
"""

PREV, STEP = 100, 200
REACH_TIMEOUT_S = 30.0


def crash_files(tag: int) -> dict[str, bytes]:
    rng = random.Random(tag)
    return {
        "a.bin": rng.randbytes(1000 + tag),
        "big.bin": rng.randbytes(6 * MiB + tag),  # two parts of 5 MiB + rest
        "z/c.bin": rng.randbytes(2000 + tag),
    }


# (stop point, published by the child)
KILL_POINTS = [
    ("after:put_object:run.json", False),
    ("after:put_object:a.bin", False),
    ("after:upload_part:big.bin", False),  # mid multipart upload: one part stored
    ("after:complete_multipart_upload:big.bin", False),
    ("after:put_object:c.bin", False),  # every shard uploaded
    ("after:put_object:manifest.json", False),
    ("before:put_object:COMMITTED", False),
    ("after:put_object:COMMITTED", True),  # published; latest.json not yet advanced
]


@pytest.mark.parametrize(("stop", "published"), KILL_POINTS, ids=[p for p, _ in KILL_POINTS])
def test_sigkill_during_publish_leaves_the_previous_step(
    stop: str, published: bool, s3_root: str, s3_admin: S3Client, tmp_path: Path
) -> None:
    store = open_store(s3_root)
    previous = make_dir(tmp_path / "prev", crash_files(1))
    CommitProtocol(store, run_id=RUN, attempt="1").publish_directory(PREV, previous)

    script = tmp_path / "child.py"
    script.write_text(CHILD)
    source = make_dir(tmp_path / "child-src", crash_files(2))
    marker = tmp_path / "reached"
    args = [s3_root, str(STEP), "2", str(source), stop, str(marker), RUN]
    child = subprocess.Popen(
        [sys.executable, str(script), *args], stderr=subprocess.PIPE, env=dict(os.environ)
    )
    try:
        deadline = time.monotonic() + REACH_TIMEOUT_S
        while not marker.exists():
            if child.poll() is not None:
                stderr = child.stderr.read().decode() if child.stderr else ""
                pytest.fail(f"child exited {child.returncode} before {stop!r}:\n{stderr}")
            if time.monotonic() > deadline:
                pytest.fail(f"child did not reach {stop!r} in {REACH_TIMEOUT_S} s")
            time.sleep(0.02)
        assert marker.read_text() == stop
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        if child.stderr:
            child.stderr.close()

    if stop == "after:upload_part:big.bin":
        assert pending_uploads(s3_admin, s3_root) == [obj_key(s3_root, step_rel(STEP, "big.bin"))]

    resolution = resolve(store, Depth.DEEP)
    leftovers = keys_under(s3_admin, s3_root, step_rel(STEP) + "/")
    if published:
        assert resolution.step == STEP
        assert resolution.hint_problem is not None and "stale" in resolution.hint_problem
        with pytest.raises(StepAlreadyPublished):
            CommitProtocol(store, run_id=RUN, attempt="3").publish_directory(STEP, source)
        return
    assert resolution.step == PREV
    if leftovers:
        assert "COMMITTED is missing" in reasons(resolution)[STEP]
    else:
        assert resolution.skipped == ()

    # The next attempt publishes the same step from different bytes: the crashed attempt's
    # objects and unfinished uploads are cleared first, so nothing of it survives.
    retry = make_dir(tmp_path / "retry-src", crash_files(3))
    CommitProtocol(store, run_id=RUN, attempt="3").publish_directory(STEP, retry)
    resolution = resolve(store, Depth.DEEP)
    assert (resolution.step, resolution.skipped, resolution.hint_problem) == (STEP, (), None)
    for rel, data in crash_files(3).items():
        assert get(s3_admin, s3_root, step_rel(STEP, rel)) == data
    assert pending_uploads(s3_admin, s3_root) == []
    manifest = decode_manifest(get(s3_admin, s3_root, step_rel(STEP, MANIFEST_FILE)))
    assert {f.path for f in manifest.files} == set(crash_files(3))
