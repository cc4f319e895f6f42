from __future__ import annotations

import pytest

from rtj_shim.checkpoint.protocol import RunRecord, check_ownership
from rtj_shim.errors import Refused, RunOwnershipConflict


@pytest.mark.parametrize(
    ("recorded", "attempt", "moves_on"),
    [("3", "3", False), ("3", "4", True), ("a", "b", True),
     # an in-place restart's generation g of attempt a writes as "a.g" (rtj_shim.agent.supervisor)
     ("3", "3.1", True), ("3.1", "3.2", True), ("3.9", "4", True), ("3.2", "3.2", False)],
)  # fmt: skip
def test_same_run_may_write(recorded: str, attempt: str, moves_on: bool) -> None:
    assert check_ownership(RunRecord("r", recorded), "r", attempt, "run.json") is moves_on


def test_second_run_is_refused() -> None:
    with pytest.raises(RunOwnershipConflict, match="belongs to run 'r', not 'other'"):
        check_ownership(RunRecord("r", "1"), "other", "1", "run.json")


def test_stale_attempt_is_refused() -> None:
    with pytest.raises(RunOwnershipConflict, match="attempt 2 is stale"):
        check_ownership(RunRecord("r", "10"), "r", "2", "run.json")


@pytest.mark.parametrize(("recorded", "attempt"), [("3.2", "3.1"), ("3.1", "3"), ("4", "3.7")])
def test_an_earlier_generation_is_stale_too(recorded: str, attempt: str) -> None:
    """A zombie of generation 1 on a lost node, after its pod was replaced and the others
    restarted in place as generation 2, may not publish."""
    with pytest.raises(RunOwnershipConflict, match=f"attempt {attempt} is stale"):
        check_ownership(RunRecord("r", recorded), "r", attempt, "run.json")


@pytest.mark.parametrize("raw", [b"junk", b"{}", b'{"run_id": "", "writer_attempt": 1}'])
def test_malformed_run_record_is_refused_with_its_name(raw: bytes) -> None:
    with pytest.raises(Refused, match=r"^s3://b/p/run\.json: "):
        RunRecord.decode(raw, "s3://b/p/run.json")


def test_run_record_round_trip() -> None:
    record = RunRecord("run-x", "7")
    assert RunRecord.decode(record.encode(), "run.json") == record
