"""The poller's HTTP exchange with the sidecars (rtj_operator.pod_http): a connection kept per
pod across rounds against a real `rtj-shim progress-server`, one replaced when the server
closed it, one never kept after a failure, and the one watchdog that bounds every request."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
from test_rank_polls import CONTROL_KEY, UID, _CountingProxy, control_sidecar

from rtj_operator.pod_http import Deadlines, PollFailed, SidecarConnections, read_progress
from rtj_operator.rank_polls import JobTargets, RankPolls
from rtj_operator.reconcile import PollMessage, PollTarget
from rtj_operator.reconcile.world import CONTROL_PATH
from rtj_shim.wire.control import Order, sign


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[int]:
    with control_sidecar(tmp_path) as (port, _):
        yield port


def _order(generation: int, key: str = CONTROL_KEY) -> PollMessage:
    body = Order(UID, generation, "stop").encode()
    return PollMessage(CONTROL_PATH, body, sign(key, body))


def test_rounds_reuse_one_connection_per_pod_and_orders_ride_on_it(sidecar: int) -> None:
    connections = SidecarConnections()
    with _CountingProxy(sidecar) as proxy:
        answers = [connections.exchange("127.0.0.1", proxy.port, 5.0, (), True) for _ in range(3)]
        taken = connections.exchange("127.0.0.1", proxy.port, 5.0, [_order(1)], True)
        accepted = proxy.accepted
    assert all(a.error is None and isinstance(a.body, dict) for a in answers), answers
    assert taken.error is None and not taken.refused
    assert (accepted, connections.opened) == (1, 1), "four exchanges, one connection"
    connections.close()


def test_an_order_posted_without_a_read_brings_the_pods_report_back(sidecar: int) -> None:
    """The sidecar answers a restart order with the pod's report after it: the exchange's
    body without a GET (here no supervisor takes it: the report says so after the wait)."""
    connections = SidecarConnections()
    with _CountingProxy(sidecar) as proxy:
        posted = connections.exchange("127.0.0.1", proxy.port, 5.0, [_order(1)], False)
        accepted = proxy.accepted
    assert posted.error is None and not posted.refused
    assert isinstance(posted.body, dict) and posted.body["schema"] == 1
    assert "supervisor" in posted.body and posted.body["supervisor"] is None
    assert accepted == 1
    connections.close()


def test_a_refused_order_or_a_failed_read_leaves_no_connection_kept(sidecar: int) -> None:
    connections = SidecarConnections()
    with _CountingProxy(sidecar) as proxy:
        refused = connections.exchange("127.0.0.1", proxy.port, 5.0, [_order(1, "0" * 64)], True)
        after = connections.exchange("127.0.0.1", proxy.port, 5.0, (), True)
        again = connections.exchange("127.0.0.1", proxy.port, 5.0, (), True)
        accepted = proxy.accepted
    assert refused.refused and "HTTP 403" in refused.refused[0][1]
    assert refused.error is None, "a refusal does not stop the read"
    assert after.error is None and again.error is None
    # the refused order's connection closed (the read after it on a second one), that read's
    # connection kept for the third exchange
    assert accepted == 3
    assert connections.exchange("127.0.0.1", 9, 1.0, (), True).error is not None
    connections.close()


class _OneRequestPerConnection(BaseHTTPRequestHandler):
    """Answers the first request of a connection with a progress body; a second request on
    the same connection finds it closed with no answer (a sidecar that dropped a kept
    connection just as the poller used it: http.client's RemoteDisconnected)."""

    protocol_version = "HTTP/1.1"
    served: ClassVar[list[str]] = []

    def handle(self) -> None:
        self.handle_one_request()
        if self.rfile.readline():  # the next request's first line: drop it unanswered
            self.served.append("dropped")  # before the close the poller sees

    def do_GET(self) -> None:
        self.served.append("answered")  # before the answer: the poller may assert at once
        body = json.dumps({"schema": 1, "ranks": []}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_a_kept_connection_the_sidecar_dropped_is_asked_again_on_a_new_one() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OneRequestPerConnection)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    connections = SidecarConnections()
    try:
        first = connections.exchange("127.0.0.1", port, 5.0, (), True)
        second = connections.exchange("127.0.0.1", port, 5.0, (), True)
    finally:
        server.shutdown()
        server.server_close()
    assert first.body == {"schema": 1, "ranks": []} and second.body == first.body, second
    assert connections.opened == 2
    assert _OneRequestPerConnection.served[:3] == ["answered", "dropped", "answered"]
    connections.close()


def test_the_watchdog_cuts_only_requests_still_running_at_their_deadline() -> None:
    """A server that accepts and never answers: the request is cut at its deadline, not at
    the socket's own timeout (60 s here); a request disarmed in time is never cut."""
    import http.client

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    deadlines = Deadlines()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60.0)
    started = time.monotonic()
    with pytest.raises(PollFailed):
        read_progress(conn, 0.5, deadlines=deadlines)
    assert time.monotonic() - started < 10.0
    conn.close()
    kept = http.client.HTTPConnection("127.0.0.1", port, timeout=60.0)
    kept.connect()
    assert kept.sock is not None
    token = deadlines.arm(kept, 0.2)
    deadlines.disarm(token)
    time.sleep(0.6)
    kept.sock.setblocking(False)
    with pytest.raises(BlockingIOError):  # still open and readable-quiet: not shut down
        kept.sock.recv(1)
    kept.close()
    listener.close()


def test_the_poller_keeps_a_connection_per_pod_across_rounds(sidecar: int) -> None:
    clock = datetime(2026, 1, 1, tzinfo=timezone.utc)
    polls = RankPolls(lambda: clock, lambda key: None, concurrency=2)
    with _CountingProxy(sidecar) as proxy:
        targets = (PollTarget("llm-a1-worker-0-0-abcde", "127.0.0.1", proxy.port, 1),)
        for _ in range(3):
            asyncio.run(polls.poll_once([JobTargets(("team-a", "llm"), targets)]))
        accepted = proxy.accepted
        reading = polls.reading(("team-a", "llm"))
        # a round without the pod closes its connection
        asyncio.run(polls.poll_once([JobTargets(("team-a", "other"), ())]))
    assert reading is not None and not reading.unanswered and len(reading.reports) == 1
    assert accepted == 1
    assert polls.connections is not None and not polls.connections._idle
    polls.close()
