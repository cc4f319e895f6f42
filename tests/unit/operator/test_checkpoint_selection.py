"""Checkpoint selection: the pure choice, the init container's report, and the store reader."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from rtj_operator import selection as sel
from rtj_shim.checkpoint.protocol import CommitProtocol
from rtj_shim.checkpoint.storage.filesystem import FilesystemStore

AT = datetime(2025, 3, 14, tzinfo=timezone.utc)


def _verdicts(valid: set[int]) -> object:
    seen: list[int] = []

    def verify(step: int) -> sel.StepVerdict:
        seen.append(step)
        return sel.StepVerdict(step, step in valid, "ok" if step in valid else "size mismatch", AT)

    verify.seen = seen  # type: ignore[attr-defined]
    return verify


def test_newest_verified_step_wins_and_verification_stops_there() -> None:
    verify = _verdicts({300, 100})
    chosen = sel.choose(sel.plan_candidates([100, 200, 300, 400], bad_steps=[]), verify)
    assert chosen.step == 300 and chosen.committed_at == AT
    assert chosen.skipped == ((400, "size mismatch"),)
    assert verify.seen == [400, 300]  # type: ignore[attr-defined]


def test_bad_steps_are_never_candidates_but_are_reported() -> None:
    chosen = sel.choose(sel.plan_candidates([100, 200], [200]), _verdicts({100, 200}), [200])
    assert chosen.step == 100
    assert chosen.skipped[0][0] == 200 and "marked bad" in chosen.skipped[0][1]


def test_no_valid_step_is_no_checkpoint() -> None:
    chosen = sel.choose([2, 1], _verdicts(set()))
    assert chosen.step is None and [s for s, _ in chosen.skipped] == [2, 1]


def test_only_s3_is_read_and_pinned_by_the_operator() -> None:
    picked = sel.Selection(7, "s3://b/p/steps/step-000000000007", AT)
    assert sel.pin_for("s3://b/p", picked, decided=9) == 7
    assert sel.pin_for("s3://b/p", None, decided=9) == 9
    assert sel.pin_for("file:///mnt/ckpt", picked, decided=9) is None


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (json.dumps({"step": 12, "uri": "file:///c/steps/x", "verification": "deep"}),
         sel.InitResult(12, "file:///c/steps/x", verification="deep")),
        (json.dumps({"step": None, "uri": None, "skipped": []}), sel.InitResult(None, None)),
        (json.dumps({"error": "access denied"}), sel.InitResult(None, None, "access denied")),
        ("Traceback: not json", None),
        (json.dumps({"step": -1}), None),
        (json.dumps([1, 2]), None),
    ],
)  # fmt: skip
def test_init_container_termination_message(message: str, expected: sel.InitResult | None) -> None:
    assert sel.parse_init_result(message) == expected


def _publish(root: Path, step: int, tmp: Path) -> None:
    src = tmp / f"src-{step}"
    src.mkdir()
    (src / "model.bin").write_bytes(b"x" * (step + 1))
    CommitProtocol(FilesystemStore(root), run_id="run-test").publish_directory(step, src)


def test_read_store_verifies_shallowly_and_skips_broken_steps(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    for step in (10, 20, 30):
        _publish(root, step, tmp_path)
    (root / "steps" / "step-000000000030" / "model.bin").write_bytes(b"short")
    chosen = sel.read_store(f"file://{root}", bad_steps=[])
    assert chosen.step == 20
    assert chosen.uri is not None and chosen.uri.endswith("steps/step-000000000020")
    assert chosen.committed_at is not None and chosen.committed_at.tzinfo is not None
    assert [s for s, _ in chosen.skipped] == [30]
    assert sel.read_store(f"file://{root}", bad_steps=[20]).step == 10


def test_a_missing_root_is_no_checkpoint_but_an_unreadable_one_is_an_error(tmp_path: Path) -> None:
    assert sel.read_store(f"file://{tmp_path / 'absent'}").step is None
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(sel.CheckpointUnreadable, match="not a directory"):
        sel.read_store(f"file://{not_a_dir}")
    with pytest.raises(sel.CheckpointUnreadable):
        sel.read_store("s3://")
