"""The operator's signed drain order, as the sidecar checks it (pure)."""

from __future__ import annotations

import json

import pytest

from rtj_shim.wire.control import job_key, sign
from rtj_shim.wire.drain_order import (
    MAX_DRAIN_ORDER_BYTES,
    DrainOrder,
    DrainOrderError,
    accept_drain_order,
    parse_drain_order,
)

UID = "5d1f0c2a-9a4e-4f7b-8c61-2b7e0f3d9a10"
KEY = job_key(b"operator secret", UID)
ORDER = DrainOrder(UID, "3.1", 100, ("10.0.3.7:9478", "[fd00::7]:9478"))


def test_an_order_round_trips_and_is_followed_when_signed_for_this_job() -> None:
    raw = ORDER.encode()
    assert parse_drain_order(raw) == ORDER
    assert accept_drain_order(raw, sign(KEY, raw), key=KEY, job_uid=UID) == ORDER


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"job_uid": ""}, "drain.job_uid: expected a non-empty string"),
        ({"attempt": 3}, "drain.attempt: expected a string"),
        ({"attempt": "../x"}, "drain.attempt: attempt must match"),
        ({"every_steps": 0}, "drain.every_steps: expected an integer >= 1"),
        ({"every_steps": True}, "drain.every_steps: expected an integer >= 1"),
        ({"peers": "10.0.0.1:1"}, "drain.peers: expected a list"),
        ({"peers": ["pod-1:9478"]}, "drain.peers: expected HOST:PORT entries, got 'pod-1:9478'"),
    ],
)
def test_a_bad_field_is_named(change: dict[str, object], message: str) -> None:
    raw = json.dumps({**ORDER.to_json(), **change}).encode()
    with pytest.raises(DrainOrderError, match=message):
        parse_drain_order(raw)


def test_another_jobs_order_or_key_is_refused() -> None:
    raw = ORDER.encode()
    other = job_key(b"operator secret", "another-job")
    with pytest.raises(DrainOrderError, match="not this job's signature"):
        accept_drain_order(raw, sign(other, raw), key=KEY, job_uid=UID)
    with pytest.raises(DrainOrderError, match="is not this pod's job"):
        accept_drain_order(raw, sign(KEY, raw), key=KEY, job_uid="another-job")
    with pytest.raises(DrainOrderError, match="no control key"):
        accept_drain_order(raw, sign(KEY, raw), key="", job_uid=UID)


def test_an_oversized_order_is_refused() -> None:
    raw = b"{" + b" " * MAX_DRAIN_ORDER_BYTES + b"}"
    with pytest.raises(DrainOrderError, match="at most"):
        parse_drain_order(raw)
