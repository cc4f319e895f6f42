"""Who may read a pod's progress (issue 42): a sidecar rendered for signed reads answers
``GET /progress`` only when it carries the job's request signature (the scheme the sidecars
already sign ``GET /fast-tier/...`` with: ``X-RTJ-Time`` and ``HMAC(key, "GET <target>
<time>")``), through a real ProgressServer on loopback."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rtj_shim.agent.progress_cli import reads_from_env
from rtj_shim.agent.progress_handler import Reads
from rtj_shim.agent.progress_server import ProgressServer
from rtj_shim.errors import UsageError
from rtj_shim.fast import peer_replica
from rtj_shim.progress import Progress
from rtj_shim.wire import control

UID = "job-uid"
KEY = control.job_key(b"the operator's secret", UID)
OTHER = control.job_key(b"the operator's secret", "another-job")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ProgressServer]:
    Progress(tmp_path, 0).step_done(7)
    srv = ProgressServer(tmp_path, "127.0.0.1", 0, control_key=KEY, job_uid=UID,
                         reads=Reads.SIGNED)  # fmt: skip
    thread = srv.start_in_thread()
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=10)


def _get(srv: ProgressServer, target: str, headers: dict[str, str]) -> tuple[int, Any, bool]:
    """(status, JSON body, whether the server closed the connection after it)."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    try:
        conn.request("GET", target, headers=headers)
        response = conn.getresponse()
        body = json.loads(response.read())
        return response.status, body, response.getheader("Connection") == "close"
    finally:
        conn.close()


def _signed(key: str, target: str = "/progress", at: float | None = None) -> dict[str, str]:
    return peer_replica.request_headers(key, "GET", target, time.time() if at is None else at)


def test_an_unsigned_read_is_refused_and_its_connection_closed(server: ProgressServer) -> None:
    code, body, closed = _get(server, "/progress", {})
    assert code == 403 and "X-RTJ-Time" in body["error"] and "ranks" not in body
    assert closed
    code, body, _ = _get(server, "/healthz", {})
    assert (code, body) == (200, {"ok": True}), "health says nothing about the job"


def test_the_jobs_signed_read_is_answered(server: ProgressServer) -> None:
    code, body, closed = _get(server, "/progress", _signed(KEY))
    assert code == 200 and [r["step"] for r in body["ranks"]] == [7]
    assert not closed


@pytest.mark.parametrize(
    ("headers", "why"),
    [
        (lambda: _signed(OTHER), "X-RTJ-Signature"),  # another job's key
        (lambda: _signed(KEY, "/fast-tier/holdings?tier=own"), "X-RTJ-Signature"),  # target
        (lambda: _signed(KEY, at=time.time() - 3600), "clock"),  # an hour old: replayed
        (lambda: {control.SIGNATURE_HEADER: control.sign(KEY, b"")}, "X-RTJ-Time"),  # a body's
    ],
)
def test_a_read_signed_otherwise_is_refused(
    server: ProgressServer, headers: Callable[[], dict[str, str]], why: str
) -> None:
    """The headers are made when the test runs (made at collection, a suite running longer
    than the 120 s skew turned every one into a clock refusal)."""
    code, body, _ = _get(server, "/progress", headers())
    assert code == 403 and why in body["error"]


def test_signed_reads_need_the_key(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="key"):
        ProgressServer(tmp_path, "127.0.0.1", 0, reads=Reads.SIGNED)
    assert reads_from_env({}) is Reads.OPEN, "rendered by an older operator: open, as before"
    assert reads_from_env({"RTJ_CONTROL_KEY": KEY}) is Reads.OPEN
    assert reads_from_env({"RTJ_SIGNED_READS": "1", "RTJ_CONTROL_KEY": KEY}) is Reads.SIGNED
    with pytest.raises(UsageError, match="RTJ_CONTROL_KEY"):
        reads_from_env({"RTJ_SIGNED_READS": "1"})
