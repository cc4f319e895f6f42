"""The progress endpoint over real HTTP on loopback, reading real records."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rtj_shim.agent.doorbell import Doorbell
from rtj_shim.agent.progress_report import SCHEMA, report
from rtj_shim.agent.progress_server import ProgressServer
from rtj_shim.progress import Progress
from rtj_shim.wire import control
from rtj_shim.wire.control import Order
from rtj_shim.wire.progress_record import FILE_SIZE

RANK_KEYS = {
    "rank", "local_rank", "pid", "restart", "state", "step", "steps_completed", "section",
    "seconds_in_section", "seconds_since_update", "seconds_since_step", "seconds_since_start",
    "last_step_seconds", "median_step_seconds", "median_busy_seconds", "recent_step_seconds",
    "recent_wait_seconds", "last_checkpoint_seconds", "max_checkpoint_seconds", "checkpoints",
    "seq", "updated_wall_time",
}  # fmt: skip


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ProgressServer]:
    srv = ProgressServer(tmp_path, "127.0.0.1", 0)
    thread = srv.start_in_thread()
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=10)


def _answer(srv: ProgressServer, path: str) -> tuple[int, str | None, Any]:
    """Status, Content-Type and the JSON body (None for a refusal's empty one)."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        raw = response.read()
        return (
            response.status,
            response.getheader("Content-Type"),
            json.loads(raw) if raw.strip().startswith(b"{") else None,
        )
    finally:
        conn.close()


def get(srv: ProgressServer, path: str) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        assert response.getheader("Content-Type") == "application/json"
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_progress_of_every_rank_with_ages_that_grow(server: ProgressServer, tmp_path: Path) -> None:
    ranks = [Progress(tmp_path, rank, rank % 2) for rank in (1, 0)]
    for p in ranks:
        p.step_done(0)
        time.sleep(0.01)
        p.step_done(1)
        time.sleep(0.01)
        p.step_done(2)
    ranks[1].enter("backward")
    ranks[0].enter("forward")  # rank 1 freezes here: its record stops changing
    status, body = get(server, "/progress")
    assert status == 200
    assert body["schema"] == SCHEMA and body["errors"] == []
    assert isinstance(body["pod_wall_time"], float) and body["hostname"]
    assert [r["rank"] for r in body["ranks"]] == [0, 1]
    one = body["ranks"][1]
    assert set(one) == RANK_KEYS | {"milestones"}
    assert one["milestones"]["first_step"]["step"] == 0  # its process's first step_done
    assert set(one["milestones"]) == {"first_step"}
    assert (one["local_rank"], one["state"], one["step"], one["section"]) == (
        1, "running", 2, "forward",
    )  # fmt: skip
    assert one["steps_completed"] == 3 and len(one["recent_step_seconds"]) == 2
    assert one["last_step_seconds"] >= 0.01 and one["median_step_seconds"] >= 0.01
    assert one["median_busy_seconds"] == one["median_step_seconds"]  # no waiting section
    assert one["last_checkpoint_seconds"] is None and one["checkpoints"] == 0
    time.sleep(0.05)
    _, later = get(server, "/progress")
    again = later["ranks"][1]
    assert again["seq"] == one["seq"] and again["section"] == "forward"
    assert again["seconds_in_section"] >= one["seconds_in_section"] + 0.05
    assert again["seconds_since_update"] >= one["seconds_since_update"] + 0.05
    for p in ranks:
        p.close()
    _, done = get(server, "/progress")
    assert [r["state"] for r in done["ranks"]] == ["exited", "exited"]


def test_before_the_first_step_durations_are_null(server: ProgressServer, tmp_path: Path) -> None:
    p = Progress(tmp_path, 0)
    _, body = get(server, "/progress")
    (rank,) = body["ranks"]
    assert (rank["step"], rank["section"], rank["steps_completed"]) == (None, "start", 0)
    assert rank["seconds_since_step"] is None and rank["median_step_seconds"] is None
    assert rank["recent_step_seconds"] == [] and rank["seconds_since_start"] >= 0
    p.close()


def test_other_files_are_ignored_and_broken_records_reported(
    server: ProgressServer, tmp_path: Path
) -> None:
    Progress(tmp_path, 3).close()
    (tmp_path / "rank-00004.progress").write_bytes(b"garbage")
    (tmp_path / "notes.txt").write_text("not a record")
    (tmp_path / ".rank-00005.progress.tmp-1").write_bytes(b"")
    (tmp_path / "rank-00006.progress").mkdir()
    _, body = get(server, "/progress")
    assert [r["rank"] for r in body["ranks"]] == [3]
    assert body["errors"] == [
        {"file": "rank-00004.progress", "error": f"7 bytes, expected {FILE_SIZE}"}
    ]


def test_health_and_unknown_paths(server: ProgressServer) -> None:
    assert get(server, "/healthz") == (200, {"ok": True})
    status, body = get(server, "/metrics")
    assert status == 404 and "/progress" in body["error"]
    status, body = get(server, "/progress?x=1")
    assert status == 200 and body["ranks"] == []


def test_a_missing_directory_is_an_empty_report(tmp_path: Path) -> None:
    body = report(tmp_path / "absent")
    assert body["ranks"] == [] and body["errors"] == []


def test_the_number_of_records_read_is_bounded(tmp_path: Path) -> None:
    for rank in range(5):
        Progress(tmp_path, rank).close()
    assert [r["rank"] for r in report(tmp_path, limit=3)["ranks"]] == [0, 1, 2]


def test_whole_requests_beyond_the_serving_bound_are_answered_503(tmp_path: Path) -> None:
    """At most `max_serving` requests are answered at once (a thread each): here a restart
    order holds the one slot while its sidecar waits for a supervisor that never moves."""
    control_dir = tmp_path / "control"
    control_dir.mkdir()
    control.write_json(control_dir / control.STATE_FILE, {"generation": 0, "state": "running"})
    bell = Doorbell(control_dir)  # held: the sidecar waits its bound for a change
    srv = ProgressServer(tmp_path / "progress", "127.0.0.1", 0, max_serving=1,
                         control_dir=control_dir, control_key=KEY, job_uid="job-uid",
                         order_ack_seconds=30.0)  # fmt: skip
    thread = srv.start_in_thread()
    posted: list[tuple[int, Any]] = []
    try:
        order = threading.Thread(
            target=lambda: posted.append(_post_order(srv, Order("job-uid", 1, "stop")))
        )
        order.start()
        while not (control_dir / control.ORDER_FILE).exists():  # its handler holds the slot
            time.sleep(0.01)
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        conn.request("GET", "/healthz")
        busy = conn.getresponse()
        assert busy.status == 503 and busy.getheader("Connection") == "close"
        conn.close()
        assert not posted, "the order is still being answered"
        control.write_json(control_dir / control.STATE_FILE, {"generation": 1, "state": "stopped"})
        order.join(30)
        assert posted and posted[0][0] == 202
        # the slot is released when a request's thread ends, just after its answer went out:
        # a client quicker than that still gets 503 (seen in CI), so ask until answered, and
        # never by a second probe (each probe holds the one slot too)
        deadline, answer = time.monotonic() + 10, _answer(srv, "/healthz")
        while answer[0] == 503 and time.monotonic() < deadline:
            time.sleep(0.05)
            answer = _answer(srv, "/healthz")
        assert answer == (200, "application/json", {"ok": True}), "its slot is free again"
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=10)
        bell.close()


def test_a_kept_connection_waits_idle_longer_than_a_request_may_stall(tmp_path: Path) -> None:
    """The operator keeps a connection per pod across its poll rounds: idle between two
    requests it lasts `keep_alive_idle`, while a request once begun must arrive whole within
    `request_deadline`; idle past `keep_alive_idle` the server closes it."""
    srv = ProgressServer(tmp_path, "127.0.0.1", 0, request_deadline=0.3, keep_alive_idle=1.5)
    thread = srv.start_in_thread()
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    try:
        for idle in (0.0, 0.8):  # 0.8 s idle: past the request deadline, within keep-alive
            time.sleep(idle)
            conn.request("GET", "/healthz")
            assert json.loads(conn.getresponse().read()) == {"ok": True}
        sock = conn.sock
        assert sock is not None
        sock.settimeout(10)
        assert sock.recv(1) == b"", "idle past keep_alive_idle: closed by the server"
        stalled = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        stalled.sendall(b"GET /healthz HTTP/1.1\r\n")  # begun, never finished
        started = time.monotonic()
        assert stalled.recv(1024) == b""
        assert time.monotonic() - started < 1.2, "a stalled request is dropped at its deadline"
        stalled.close()
    finally:
        conn.close()
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=10)


def _post_order(srv: ProgressServer, order: Order) -> tuple[int, Any]:
    raw = order.encode()
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    try:
        conn.request("POST", "/control", raw, {control.SIGNATURE_HEADER: control.sign(KEY, raw)})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


KEY = control.job_key(b"the operator's secret", "job-uid")


def test_a_restart_order_is_answered_with_the_report_once_the_supervisor_took_it(
    tmp_path: Path,
) -> None:
    """The sidecar rings the doorbell and waits for the supervisor's report to change: the
    answer is the pod's report after the order (the stand-in supervisor below moves only
    when rung, and the sidecar may wait 30 s: a pass proves both)."""
    control_dir = tmp_path / "control"
    control_dir.mkdir()
    control.write_json(control_dir / control.STATE_FILE, {"generation": 0, "state": "running"})
    bell = Doorbell(control_dir)
    srv = ProgressServer(tmp_path / "progress", "127.0.0.1", 0, control_dir=control_dir,
                         control_key=KEY, job_uid="job-uid", order_ack_seconds=30.0)  # fmt: skip
    thread = srv.start_in_thread()
    rung: list[int] = []

    def supervisor() -> None:  # one look per ring, as `rtj-shim supervise` does
        while len(rung) < 2 and bell.wait(30.0):
            order = control.read_json(control_dir / control.ORDER_FILE) or {}
            rung.append(order["generation"])
            state = "stopped" if order["action"] == "stop" else "running"
            control.write_json(control_dir / control.STATE_FILE,
                               {"generation": order["generation"], "state": state})  # fmt: skip

    looks = threading.Thread(target=supervisor, daemon=True)
    looks.start()
    try:
        code, answer = _post_order(srv, Order("job-uid", 1, "stop"))
        assert code == 202 and answer["accepted"]["action"] == "stop"
        assert answer["report"]["supervisor"] == {"generation": 1, "state": "stopped"}
        assert answer["report"]["schema"] == SCHEMA
        code, answer = _post_order(srv, Order("job-uid", 1, "run", attempt=2))
        assert answer["report"]["supervisor"] == {"generation": 1, "state": "running"}
        looks.join(10)
        assert rung == [1, 1]
        started = time.monotonic()
        code, answer = _post_order(srv, Order("job-uid", 1, "run", attempt=2))
        assert code == 202 and answer["report"]["supervisor"]["state"] == "running"
        assert time.monotonic() - started < 20.0, "carried out already: no wait for a change"
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=10)
        bell.close()


def test_where_the_supervisor_ended_the_answer_comes_at_once(tmp_path: Path) -> None:
    """Its doorbell is there but nobody holds it (the supervisor ended): nothing will take
    the order now, so the sidecar does not wait its bound (30 s here: a pass proves it)."""
    control_dir = tmp_path / "control"
    control_dir.mkdir()
    control.write_json(control_dir / control.STATE_FILE, {"generation": 0, "state": "running"})
    Doorbell(control_dir).close()  # a supervisor made it, then ended
    srv = ProgressServer(tmp_path / "progress", "127.0.0.1", 0, control_dir=control_dir,
                         control_key=KEY, job_uid="job-uid", order_ack_seconds=30.0)  # fmt: skip
    thread = srv.start_in_thread()
    try:
        started = time.monotonic()
        code, answer = _post_order(srv, Order("job-uid", 1, "stop"))
        assert time.monotonic() - started < 20.0, "no wait for a supervisor that ended"
        assert code == 202 and answer["report"]["supervisor"] == {
            "generation": 0,
            "state": "running",
        }, "the report as it is: the order not taken"
        assert control.read_json(control_dir / control.ORDER_FILE) == answer["accepted"]
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=10)


def test_without_a_supervisor_the_answer_comes_after_the_bound(tmp_path: Path) -> None:
    control_dir = tmp_path / "control"
    srv = ProgressServer(tmp_path / "progress", "127.0.0.1", 0, control_dir=control_dir,
                         control_key=KEY, job_uid="job-uid", order_ack_seconds=0.2)  # fmt: skip
    thread = srv.start_in_thread()
    try:
        code, answer = _post_order(srv, Order("job-uid", 1, "stop"))
        assert code == 202 and answer["report"]["supervisor"] is None, "nobody took it yet"
        assert control.read_json(control_dir / control.ORDER_FILE) == answer["accepted"]
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=10)
