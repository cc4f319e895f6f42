from __future__ import annotations

from datetime import datetime, timezone

import pytest

from rtj_shim.checkpoint.manifest import (
    FileEntry,
    Manifest,
    committed_marker,
    encode_manifest,
    sha256_hex,
)
from rtj_shim.checkpoint.verification import check_commit, check_digests, check_sizes
from rtj_shim.errors import ManifestError

DATA = {"a.bin": b"alpha", "dir/b.bin": b"bravo-bravo"}


def manifest(step: int = 100) -> Manifest:
    files = tuple(
        FileEntry(path=p, bytes=len(d), sha256=sha256_hex(d)) for p, d in sorted(DATA.items())
    )
    return Manifest(
        run_id="r", step=step, created_at=datetime(2026, 1, 1, tzinfo=timezone.utc), files=files
    )


def test_commit_vouches_for_exact_manifest_bytes() -> None:
    raw = encode_manifest(manifest())
    assert check_commit(100, raw, committed_marker(raw)) == manifest()


@pytest.mark.parametrize(
    ("manifest_raw", "committed", "message"),
    [
        (b"{}", None, "COMMITTED is missing"),
        (None, b"sha256:" + b"0" * 64, "manifest.json is missing"),
        (b'{"step": 100}', committed_marker(b'{"step": 1}'), "edited or swapped manifest"),
        (b"not json", committed_marker(b"not json"), "not valid JSON"),
    ],
)
def test_commit_failures_say_why(
    manifest_raw: bytes | None, committed: bytes | None, message: str
) -> None:
    with pytest.raises(ManifestError, match=message):
        check_commit(100, manifest_raw, committed)


def test_manifest_of_another_step_is_rejected() -> None:
    raw = encode_manifest(manifest(step=200))
    with pytest.raises(ManifestError, match="field 'step' is 200, expected 100"):
        check_commit(100, raw, committed_marker(raw))


def test_sizes() -> None:
    m = manifest()
    sizes = {p: len(d) for p, d in DATA.items()}
    assert check_sizes(m, sizes) is None
    assert check_sizes(m, {**sizes, "extra": 3}) is None
    assert "is missing" in (check_sizes(m, {"a.bin": 5}) or "")
    assert "has 4 bytes" in (check_sizes(m, {**sizes, "a.bin": 4}) or "")


def test_digests() -> None:
    m = manifest()
    digests = {p: sha256_hex(d) for p, d in DATA.items()}
    assert check_digests(m, digests) is None
    bad = {**digests, "dir/b.bin": sha256_hex(b"flipped")}
    assert "'dir/b.bin' has sha256" in (check_digests(m, bad) or "")
    assert "was not hashed" in (check_digests(m, {}) or "")
