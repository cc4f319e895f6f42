from __future__ import annotations

import pytest

from rtj_shim.errors import Refused, RunOwnershipConflict
from rtj_shim.protocol import RunRecord, check_ownership


@pytest.mark.parametrize(
    ("recorded", "attempt", "moves_on"),
    [("3", "3", False), ("3", "4", True), ("a", "b", True)],
)
def test_same_run_may_write(recorded: str, attempt: str, moves_on: bool) -> None:
    assert check_ownership(RunRecord("r", recorded), "r", attempt, "run.json") is moves_on


def test_second_run_is_refused() -> None:
    with pytest.raises(RunOwnershipConflict, match="belongs to run 'r', not 'other'"):
        check_ownership(RunRecord("r", "1"), "other", "1", "run.json")


def test_stale_attempt_is_refused() -> None:
    with pytest.raises(RunOwnershipConflict, match="attempt 2 is stale"):
        check_ownership(RunRecord("r", "10"), "r", "2", "run.json")


@pytest.mark.parametrize("raw", [b"junk", b"{}", b'{"run_id": "", "writer_attempt": 1}'])
def test_malformed_run_record_is_refused_with_its_name(raw: bytes) -> None:
    with pytest.raises(Refused, match=r"^s3://b/p/run\.json: "):
        RunRecord.decode(raw, "s3://b/p/run.json")


def test_run_record_round_trip() -> None:
    record = RunRecord("run-x", "7")
    assert RunRecord.decode(record.encode(), "run.json") == record
