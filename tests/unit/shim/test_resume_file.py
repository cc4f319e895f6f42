"""The resume file (`rtj_shim.wire.resume_file`): one type for its two writers (the init
container's resolution, the supervisor's in-place pin) and its three readers (the durable
restore, the fast restore, the operator's reading of the init container's verdict)."""

from __future__ import annotations

import json

import pytest

from rtj_shim.checkpoint.selection import Resolution, Skipped
from rtj_shim.checkpoint.verification import Depth
from rtj_shim.wire.resume_file import ResumeFile, ResumeFileError


def test_a_resolution_round_trips_with_every_field() -> None:
    resolution = Resolution(
        step=40, uri="s3://b/run/steps/40", verification=Depth.DEEP,
        skipped=(Skipped(50, "COMMITTED is missing"),),
    )  # fmt: skip
    pin = ResumeFile.of_resolution(resolution)
    body = pin.encode()
    assert body == {
        "step": 40, "uri": "s3://b/run/steps/40", "verification": "deep",
        "skipped": [{"step": 50, "reason": "COMMITTED is missing"}],
    }  # fmt: skip
    assert ResumeFile.parse(json.dumps(body)) == pin
    assert pin.pins_step and pin.verified_deeply


def test_no_checkpoint_is_a_decision_and_a_fast_only_pin_is_not() -> None:
    fresh = ResumeFile.parse(b'{"step": null, "uri": null, "skipped": []}')
    assert fresh.pins_step and fresh.step is None
    fast_only = ResumeFile(pins_step=False, fast_step=60, fast_lineage="ab12", source="in place")
    assert "step" not in fast_only.encode()
    again = ResumeFile.parse(fast_only.encode_bytes())
    assert not again.pins_step and (again.fast_step, again.fast_lineage) == (60, "ab12")


def test_an_error_verdict_is_only_the_error() -> None:
    assert ResumeFile(error="access denied").encode() == {"error": "access denied"}
    assert ResumeFile.parse('{"error": "x", "truncated": true}').error == "x"


def test_unknown_keys_are_ignored() -> None:
    assert ResumeFile.parse('{"step": 3, "skipped_truncated": true, "new": 1}').step == 3


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ('{"step": -1}', "step"),
        ('{"step": true}', "step"),
        ('{"step": "12"}', "step"),
        ('{"step": 1, "uri": 5}', "uri"),
        ('{"step": 1, "verification": "thorough"}', "verification"),
        ('{"step": 1, "skipped": {}}', "skipped"),
        ('{"step": 1, "skipped": [3]}', "skipped[0]"),
        ('{"step": 1, "skipped": [{"reason": "r"}]}', "skipped[0].step"),
        ('{"fast_step": 1.5}', "fast_step"),
        ('{"fast_step": 2, "fast_lineage": 7}', "fast_lineage"),
        ("[1, 2]", "JSON object"),
        ("Traceback (most recent call last):", "not JSON"),
    ],
)
def test_a_field_of_the_wrong_kind_is_refused_by_name(raw: str, field: str) -> None:
    with pytest.raises(ResumeFileError, match=field.replace("[", r"\[").replace("]", r"\]")):
        ResumeFile.parse(raw)
