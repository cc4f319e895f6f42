"""The operator's checkpoint interval (`plannedIntervalSeconds: auto`): its message, the
sidecar that writes it for the trainers (real HTTP on loopback), and the trainers' view."""

from __future__ import annotations

import http.client
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rtj_shim.agent.progress_server import ProgressServer
from rtj_shim.wire import control, interval_order
from rtj_shim.wire.interval_order import (
    FILE,
    RECHECK_S,
    START_SECONDS,
    FollowedInterval,
    IntervalOrder,
    IntervalOrderError,
    accept_interval_order,
    parse_interval_order,
)

KEY = control.job_key(b"the operator's secret", "job-uid")


def test_an_order_round_trips_and_a_bad_one_names_its_field() -> None:
    order = IntervalOrder("job-uid", 240)
    assert parse_interval_order(order.encode()) == order
    with pytest.raises(IntervalOrderError, match=r"intervals\.durable_seconds"):
        parse_interval_order(b'{"job_uid": "job-uid", "durable_seconds": 0}')
    with pytest.raises(IntervalOrderError, match=r"intervals\.durable_seconds"):
        parse_interval_order(b'{"job_uid": "job-uid", "durable_seconds": "60"}')
    with pytest.raises(IntervalOrderError, match=r"intervals\.job_uid"):
        parse_interval_order(b'{"durable_seconds": 60}')


def test_only_an_order_signed_with_the_jobs_key_for_the_job_is_taken() -> None:
    raw = IntervalOrder("job-uid", 120).encode()
    taken = accept_interval_order(raw, control.sign(KEY, raw), key=KEY, job_uid="job-uid")
    assert taken.durable_seconds == 120
    other = control.job_key(b"the operator's secret", "another-job")
    with pytest.raises(IntervalOrderError):  # the tenant of another job cannot set it
        accept_interval_order(raw, control.sign(other, raw), key=KEY, job_uid="job-uid")
    foreign = IntervalOrder("another-job", 5).encode()
    with pytest.raises(IntervalOrderError):
        accept_interval_order(foreign, control.sign(KEY, foreign), key=KEY, job_uid="job-uid")


def test_the_trainers_follow_the_file_at_most_every_recheck(tmp_path: Path) -> None:
    followed = FollowedInterval(tmp_path)
    assert followed.seconds(now=100.0) == START_SECONDS  # no order yet
    interval_order.write(tmp_path, IntervalOrder("job-uid", 90))
    assert followed.seconds(now=100.0 + RECHECK_S / 2) == START_SECONDS  # not looked yet
    assert followed.seconds(now=100.0 + RECHECK_S) == 90.0
    (tmp_path / FILE).write_text('{"job_uid": "job-uid", "durable_seconds": -3}')
    os.utime(tmp_path / FILE, ns=(1, 1))  # a changed file, whatever the clock's grain
    assert followed.seconds(now=100.0 + 2 * RECHECK_S) == 90.0  # a bad file changes nothing
    assert FollowedInterval(None).seconds(now=1.0) == START_SECONDS  # outside an operator's pod


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[ProgressServer]:
    srv = ProgressServer(tmp_path, "127.0.0.1", 0, control_key=KEY, job_uid="job-uid")
    thread = srv.start_in_thread()
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=10)


def _post(srv: ProgressServer, raw: bytes, signature: str) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    try:
        conn.request("POST", "/intervals", raw, {control.SIGNATURE_HEADER: signature})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_the_sidecar_writes_a_signed_order_for_the_trainers_and_reports_it(
    sidecar: ProgressServer, tmp_path: Path
) -> None:
    raw = IntervalOrder("job-uid", 75).encode()
    status, body = _post(sidecar, raw, control.sign("not-the-key", raw))
    assert status == 403 and not (tmp_path / FILE).exists()
    status, body = _post(sidecar, raw, control.sign(KEY, raw))
    assert status == 202 and body["accepted"]["durable_seconds"] == 75
    assert interval_order.read(tmp_path) == IntervalOrder("job-uid", 75)
    assert sidecar.peer_report()["intervals"] == {"durable_seconds": 75}
