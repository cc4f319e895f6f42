"""An ``X-RTJ-Signature`` that is not ASCII is simply not this job's signature (issue 42):
refused like a wrong one, never a TypeError from ``hmac.compare_digest`` that leaves the
request without an answer."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rtj_shim.agent.progress_server import ProgressServer
from rtj_shim.fast import peer_replica
from rtj_shim.wire import control
from rtj_shim.wire.control import Order, OrderError
from rtj_shim.wire.drain_order import accept_drain_order

UID = "job-uid"
KEY = control.job_key(b"the operator's secret", UID)
ORDER = Order(UID, 1, "stop").encode()
RIGHT = control.sign(KEY, ORDER)
NON_ASCII = [
    RIGHT[:-1] + "é",  # the right signature but for its last character
    "sha256=" + "é" * 64,
    "sha256=☃",
    "sha256=☃".encode().decode("latin-1"),  # UTF-8 bytes as an HTTP server reads them
]


@pytest.mark.parametrize("signature", NON_ASCII)
def test_every_check_refuses_a_non_ascii_signature(signature: str) -> None:
    assert not control.verify(KEY, ORDER, signature)
    assert not control.signature_matches(RIGHT, signature)
    with pytest.raises(OrderError, match="X-RTJ-Signature"):
        control.accept(ORDER, signature, key=KEY, job_uid=UID, last=None)
    assignment = peer_replica.Assignment(UID, "10.0.3.7:9478", 3).encode()
    with pytest.raises(OrderError, match="signature"):
        peer_replica.accept_assignment(assignment, signature, key=KEY, job_uid=UID)
    drain = json.dumps({"job_uid": UID, "attempt": "a1", "every_steps": 1, "peers": []})
    with pytest.raises(OrderError, match="X-RTJ-Signature"):
        accept_drain_order(drain.encode(), signature, key=KEY, job_uid=UID)
    when = f"{time.time():.3f}"
    refused = peer_replica.check_request(KEY, "GET", "/fast-tier/x", when, signature, time.time())
    assert refused is not None and "X-RTJ-Signature" in refused
    assert not peer_replica.check_answer(KEY, "/fast-tier/x", b"{}", signature)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ProgressServer]:
    (tmp_path / "control").mkdir()
    (tmp_path / "fast").mkdir()
    srv = ProgressServer(tmp_path / "progress", "127.0.0.1", 0, control_dir=tmp_path / "control",
                         fast_tier_dir=tmp_path / "fast", control_key=KEY, job_uid=UID,
                         order_ack_seconds=0.2)  # fmt: skip
    thread = srv.start_in_thread()
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=10)


def _ask(srv: ProgressServer, method: str, path: str, body: bytes | None,
         headers: dict[str, Any]) -> tuple[int, Any]:  # fmt: skip
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    try:
        conn.request(method, path, body, headers)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_the_sidecar_answers_a_non_ascii_signature_403_and_goes_on(server: ProgressServer) -> None:
    snowman = "sha256=☃".encode()  # sent as raw bytes: the server reads them as Latin-1
    code, answer = _ask(server, "POST", "/control", ORDER, {control.SIGNATURE_HEADER: snowman})
    assert code == 403 and "X-RTJ-Signature" in answer["error"]
    target = "/fast-tier/holdings?tier=own"
    fresh = {peer_replica.TIME_HEADER: f"{time.time():.3f}", control.SIGNATURE_HEADER: snowman}
    code, answer = _ask(server, "GET", target, None, fresh)
    assert code == 403 and "X-RTJ-Signature" in answer["error"]
    code, _ = _ask(server, "GET", "/healthz", None, {})
    assert code == 200
    code, answer = _ask(server, "POST", "/control", ORDER, {control.SIGNATURE_HEADER: RIGHT})
    assert code == 202 and answer["accepted"]["action"] == "stop", "the right one still goes"
