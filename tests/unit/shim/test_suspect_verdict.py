"""The trainers' verdict on a suspect state (`rtj_shim.wire.suspect_verdict`): one type, in
the exception's message and in the file beside the resume file, parsed by the operator and
the supervisor alike; a field of the wrong kind is named."""

from __future__ import annotations

import json

import pytest

from rtj_shim.integrity import SuspectState
from rtj_shim.wire.suspect_verdict import (
    MAX_RANKS,
    SuspectKind,
    SuspectVerdict,
    SuspectVerdictError,
)

VERDICT = SuspectVerdict(1800, SuspectKind.DIVERGED, (13,), (3,))


def test_a_verdict_round_trips_as_json_and_as_text() -> None:
    assert SuspectVerdict.parse(json.dumps(VERDICT.encode())) == VERDICT
    assert SuspectVerdict.parse(VERDICT.encode()) == VERDICT
    assert SuspectVerdict.find(f"noise\n{VERDICT.encode_text()} trailing") == VERDICT


def test_the_exception_message_ends_with_the_verdict_a_termination_message_keeps() -> None:
    exc = SuspectState("step 1800 not published: replicas diverged", VERDICT)
    line = f"rtj_shim.integrity.SuspectState: {exc}"
    assert str(exc).startswith("step 1800 not published") and exc.detail in str(exc)
    assert SuspectVerdict.find(line) == VERDICT and exc.verdict == VERDICT
    assert str(SuspectState("no verdict")) == "no verdict"


def test_the_last_verdict_in_a_text_counts_and_a_broken_one_is_none() -> None:
    older = SuspectVerdict(1700, SuspectKind.ANOMALY, (2,), (0,))
    assert SuspectVerdict.find(older.encode_text() + "\n" + VERDICT.encode_text()) == VERDICT
    assert SuspectVerdict.find("no verdict here") is None
    assert SuspectVerdict.find('rtj-suspect-verdict={"step": -1, "kind": "diverged"}') is None
    assert SuspectVerdict.find("rtj-suspect-verdict={not json") is None


def test_indexes_are_kept_sorted_once() -> None:
    body = {"step": 4, "kind": "anomaly", "ranks": [3, 1, 3], "pods": [1, 0]}
    assert SuspectVerdict.parse(body) == SuspectVerdict(4, SuspectKind.ANOMALY, (1, 3), (0, 1))


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ("[", "not JSON"),
        ([1], "expected a JSON object"),
        ({"kind": "diverged"}, "step None"),
        ({"step": True, "kind": "diverged"}, "step True"),
        ({"step": 1, "kind": "odd"}, "kind 'odd'"),
        ({"step": 1, "kind": "diverged", "ranks": "2"}, "ranks"),
        ({"step": 1, "kind": "diverged", "pods": [-1]}, "pods"),
        ({"step": 1, "kind": "diverged", "pods": [False]}, "pods"),
        ({"step": 1, "kind": "diverged", "ranks": list(range(MAX_RANKS + 1))}, "ranks"),
    ],
)
def test_a_field_of_the_wrong_kind_is_refused_by_name(body: object, field: str) -> None:
    with pytest.raises(SuspectVerdictError, match=field):
        SuspectVerdict.parse(body)
