"""Lineage: which history a step continues (issue 43). Pure, apart from a temporary
directory standing in for the pod's fast tier."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from rtj_shim.checkpoint import lineage
from rtj_shim.checkpoint.lineage import LEGACY, Held
from rtj_shim.checkpoint.manifest import (
    FileEntry,
    Manifest,
    decode_manifest,
    encode_manifest,
    with_lineage,
)
from rtj_shim.checkpoint.protocol import CommitProtocol
from rtj_shim.fast.fast_tier import held, holdings, rank_store

A = lineage.derive(None, None, lineage.FRESH, "run-1")


def test_lineage_ids_are_deterministic_chained_and_distinct() -> None:
    assert lineage.derive(None, None, lineage.FRESH, "run-1") == A, "every rank computes it"
    assert lineage.valid(A) and len(A) == lineage.ID_HEX
    b = lineage.derive(A, 1200, "ab" * 32, "run-1")
    assert b == lineage.derive(A, 1200, "ab" * 32, "run-1")
    others = {
        lineage.derive(None, None, lineage.FRESH, "run-2"),
        lineage.derive(A, 1250, "ab" * 32, "run-1"),
        lineage.derive(A, 1200, "cd" * 32, "run-1"),
        lineage.derive(b, 1200, "ab" * 32, "run-1"),
        lineage.derive(A, 1200, lineage.FAST_ORIGIN, "run-1"),
    }
    assert len(others | {A, b}) == 7, "another parent, step, origin or run: another history"
    assert lineage.of(None) == LEGACY and lineage.of("x" * 16) == LEGACY and lineage.of(b) == b


def test_a_holding_encodes_and_parses_back_and_refuses_what_is_not_one() -> None:
    h = Held(1250, A)
    assert Held.parse(h.encode()) == h and h.encode() == f"{A}@1250" and h.pinnable
    assert not Held.parse("legacy@7").pinnable
    for bad in (1250, "1250", f"{A}@-1", f"{A}@01", f"{A}@x", "zz@1", f"{A}@1@2", f"@{1}"):
        with pytest.raises(ValueError):
            Held.parse(bad)
    assert lineage.parse_all([f"{A}@5", "junk", 7, f"{A}@5"]) == {Held(5, A)}
    assert lineage.parse_all("5") == frozenset()


def test_a_manifest_without_a_lineage_reads_as_legacy_and_round_trips() -> None:
    entry = FileEntry(path="a.bin", bytes=1, sha256="0" * 64)
    when = datetime(2026, 1, 1, tzinfo=timezone.utc)
    old = Manifest(run_id="r", step=3, created_at=when, files=(entry,))
    raw = encode_manifest(old)
    assert b"lineage" not in raw, "an old reader (extra='forbid') still reads it"
    assert lineage.of(decode_manifest(raw).lineage) == LEGACY
    new = Manifest(run_id="r", step=3, created_at=when, files=(entry,),
                   extra=with_lineage({}, A))  # fmt: skip
    raw = encode_manifest(new)
    assert decode_manifest(raw).lineage == A
    # a shim older than lineages forbids unknown fields: the lineage is in `extra`, so
    # every top-level key is one it knows
    known_before = {"schema_version", "run_id", "step", "world_size", "parallelism",
                    "framework", "code_commit", "image_digest", "dataset_snapshot",
                    "created_at", "files", "extra"}  # fmt: skip
    assert set(json.loads(raw)) <= known_before
    # a manifest written with the lineage as a field of its own still reads
    first = {**json.loads(encode_manifest(old)), "lineage": A}
    assert decode_manifest(json.dumps(first).encode()).lineage == A


def _publish(root: Path, rank: int, step: int, payload: Path, history: str | None) -> None:
    protocol = CommitProtocol(rank_store(root, rank), retention=None)
    protocol.lineage = history
    protocol.publish_directory(step, payload)


def test_a_pod_holds_a_step_only_when_every_rank_has_it_in_one_lineage(tmp_path: Path) -> None:
    payload = tmp_path / "payload"
    payload.mkdir()
    (payload / "state.bin").write_bytes(b"x" * 64)
    fast = tmp_path / "fast"
    b = lineage.derive(A, 1200, "ab" * 32, "run-1")
    for rank in (0, 1):
        _publish(fast, rank, 1200, payload, A)
    _publish(fast, 0, 1250, payload, A)  # rank 0 kept the history it left
    _publish(fast, 1, 1250, payload, b)  # rank 1 saved it again after the fallback
    _publish(fast, 0, 1260, payload, None)
    _publish(fast, 1, 1260, payload, None)
    assert held(fast) == [Held(1200, A), Held(1260, LEGACY)]
    assert holdings(fast) == [1200, 1260], "numbers alone: 1250 is not one step of one history"


def test_the_ranks_copies_must_be_of_one_lineage_and_the_pinned_one() -> None:
    b = lineage.derive(A, 1200, "ab" * 32, "run-1")
    assert lineage.mismatch(1250, None, [b, b]) is None
    assert lineage.mismatch(1250, b, [b, b]) is None
    mixed = lineage.mismatch(1250, None, [A, b])
    assert mixed is not None and f"rank 1 holds lineage {b}" in mixed
    wrong = lineage.mismatch(1250, A, [b, b])
    assert wrong is not None and f"pinned lineage {A}" in wrong and "rank 0 holds" in wrong
    legacy = lineage.mismatch(1250, None, [LEGACY, LEGACY])
    assert legacy is not None and "rank 0 holds lineage legacy" in legacy
