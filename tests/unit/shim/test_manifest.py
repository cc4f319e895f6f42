from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rtj_shim.checkpoint.manifest import (
    FileEntry,
    Manifest,
    committed_marker,
    confine_path,
    decode_manifest,
    encode_manifest,
    parse_committed,
    sha256_hex,
)
from rtj_shim.errors import ManifestError

SHA = "a" * 64


def make_manifest(**overrides: object) -> Manifest:
    fields: dict[str, object] = {
        "run_id": "run-1",
        "step": 100,
        "world_size": 2,
        "parallelism": {"dp": 2},
        "created_at": datetime(2026, 1, 1, tzinfo=timezone.utc),
        "files": (FileEntry(path="model/rank-0.pt", bytes=10, sha256=SHA),),
    }
    fields.update(overrides)
    return Manifest.model_validate(fields)


@pytest.mark.parametrize("path", ["a", "a/b.pt", "model/__0_0.distcp", "x..y", ".hidden"])
def test_confined_paths_pass(path: str) -> None:
    assert confine_path(path) == path


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("", "non-empty"),
        ("/etc/passwd", "relative"),
        ("../x", "escapes"),
        ("..", "escapes"),
        (".", "escapes"),
        ("a/../../x", "not normalized"),
        ("a//b", "not normalized"),
        ("./a", "not normalized"),
        ("a\\b", "'/' separators"),
    ],
)
def test_escaping_paths_are_rejected(path: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        confine_path(path)


def test_round_trip_is_canonical() -> None:
    manifest = make_manifest()
    raw = encode_manifest(manifest)
    assert decode_manifest(raw) == manifest
    assert encode_manifest(decode_manifest(raw)) == raw
    assert json.loads(raw)["schema_version"] == 1


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d.update(schema_version=2), "schema_version"),
        (lambda d: d.update(step=-1), "step"),
        (lambda d: d.update(world_size=0), "world_size"),
        (lambda d: d.pop("run_id"), "run_id"),
        (lambda d: d["files"][0].update(path="../escape"), "files.0.path"),
        (lambda d: d["files"][0].update(sha256="zz"), "files.0.sha256"),
        (lambda d: d["files"][0].update(bytes=-5), "files.0.bytes"),
        (lambda d: d["files"][0].update(path="COMMITTED"), "files.0.path"),
        (lambda d: d.update(unexpected=1), "unexpected"),
    ],
)
def test_invalid_manifest_names_the_field(mutate, field: str) -> None:  # type: ignore[no-untyped-def]
    data = json.loads(encode_manifest(make_manifest()))
    mutate(data)
    with pytest.raises(ManifestError, match=f"field '{field}'"):
        decode_manifest(json.dumps(data).encode(), "steps/x/manifest.json")


def test_duplicate_and_file_dir_clash_rejected() -> None:
    entry = FileEntry(path="a", bytes=1, sha256=SHA)
    with pytest.raises(ValueError, match="listed twice"):
        make_manifest(files=(entry, entry))
    with pytest.raises(ValueError, match="both a file and a directory"):
        make_manifest(files=(entry, FileEntry(path="a/b", bytes=1, sha256=SHA)))


def test_garbage_is_a_manifest_error_naming_the_file() -> None:
    with pytest.raises(ManifestError, match=r"^steps/s/manifest\.json: not valid JSON"):
        decode_manifest(b"\xff{", "steps/s/manifest.json")


@given(st.binary(max_size=2048))
def test_committed_marker_round_trip(manifest_bytes: bytes) -> None:
    assert parse_committed(committed_marker(manifest_bytes)) == sha256_hex(manifest_bytes)


@pytest.mark.parametrize(
    "raw", [b"", b"sha256:", b"md5:" + b"a" * 64, b"sha256:" + b"g" * 64, b"\xff"]
)
def test_malformed_committed_is_rejected(raw: bytes) -> None:
    with pytest.raises(ManifestError, match="COMMITTED: expected 'sha256:<64 hex digits>'"):
        parse_committed(raw)
