"""The peer replica's messages and signatures (issue 16). Pure."""

from __future__ import annotations

import json

import pytest

from rtj_shim.fast.peer_replica import (
    MAX_SKEW_S,
    Assignment,
    AssignmentError,
    accept_assignment,
    answer_signature,
    check_answer,
    check_request,
    parse_assignment,
    request_headers,
    request_signature,
)
from rtj_shim.wire.control import job_key, sign

UID = "0c2f7a4e-1b7c-4f0e-9d55-3f1f0b1a2c3d"
KEY = job_key(b"operator secret", UID)
OTHER = job_key(b"operator secret", "another-job")


def test_an_assignment_round_trips_and_names_a_bad_field() -> None:
    a = Assignment(UID, "10.0.3.7:9478", 3)
    assert parse_assignment(a.encode()) == a
    for field, value in (("source", "nowhere"), ("source_index", -1), ("job_uid", "")):
        raw = json.dumps({**a.to_json(), field: value}).encode()
        with pytest.raises(AssignmentError, match=rf"assignment\.{field}"):
            parse_assignment(raw)
    with pytest.raises(AssignmentError, match="at most"):
        parse_assignment(b" " * 5000)


def test_only_this_jobs_signed_assignment_is_followed() -> None:
    raw = Assignment(UID, "10.0.3.7:9478", 3).encode()
    assert accept_assignment(raw, sign(KEY, raw), key=KEY, job_uid=UID).source_index == 3
    with pytest.raises(AssignmentError, match="signature"):
        accept_assignment(raw, sign(OTHER, raw), key=KEY, job_uid=UID)
    with pytest.raises(AssignmentError, match="no control key"):
        accept_assignment(raw, sign(KEY, raw), key="", job_uid=UID)
    theirs = Assignment("another-job", "10.0.3.7:9478", 3).encode()
    with pytest.raises(AssignmentError, match="not this pod's job"):
        accept_assignment(theirs, sign(KEY, theirs), key=KEY, job_uid=UID)


def test_a_request_is_refused_unless_signed_for_this_target_and_fresh() -> None:
    target = "/fast-tier/holdings?tier=own"
    headers = request_headers(KEY, "GET", target, 1000.0)
    when, sig = headers["X-RTJ-Time"], headers["X-RTJ-Signature"]
    assert check_request(KEY, "GET", target, when, sig, 1000.5) is None
    assert "signature" in str(check_request(KEY, "GET", target + "x", when, sig, 1000.5))
    assert "signature" in str(check_request(OTHER, "GET", target, when, sig, 1000.5))
    assert "clock" in str(check_request(KEY, "GET", target, when, sig, 1001.0 + MAX_SKEW_S))
    assert "Unix seconds" in str(check_request(KEY, "GET", target, None, sig, 1000.0))
    # a signed "nan" (or "inf") is no time: NaN compares as never too far off
    for odd in ("nan", "inf", "-inf"):
        signed = request_signature(KEY, "GET", target, odd)  # a key holder's own request
        assert "Unix seconds" in str(check_request(KEY, "GET", target, odd, signed, 1000.0))
    assert "no control key" in str(check_request("", "GET", target, when, sig, 1000.0))


def test_an_answer_is_bound_to_its_request_and_its_key() -> None:
    body = b'{"steps":[40]}'
    sig = answer_signature(KEY, "/a", body)
    assert check_answer(KEY, "/a", body, sig)
    assert not check_answer(KEY, "/b", body, sig)
    assert not check_answer(KEY, "/a", body + b" ", sig)
    assert not check_answer(OTHER, "/a", body, sig)
    assert not check_answer(KEY, "/a", body, None)
