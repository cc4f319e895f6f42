"""Slow clients cannot keep the operator out of a pod's progress sidecar (issue 42, finding
3): a request must arrive whole within a deadline over the whole request, connections whose
request is still arriving hold no handler, and when too many wait the peer holding the most
loses its oldest. Through a real ProgressServer on loopback, read with the operator's own
signed read (`rtj_operator.pod_http.fetch_progress`)."""

from __future__ import annotations

import contextlib
import http.client
import json
import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rtj_operator.pod_http import fetch_progress, progress_headers
from rtj_shim.agent.http_gate import Need, framing, victim
from rtj_shim.agent.progress_handler import Reads
from rtj_shim.agent.progress_server import ProgressServer
from rtj_shim.progress import Progress
from rtj_shim.wire import control

UID = "job-uid"
KEY = control.job_key(b"the operator's secret", UID)
SLOW = 20  # more than the 16 connection slots the sidecar had


@contextlib.contextmanager
def sidecar(directory: Path, **options: Any) -> Iterator[ProgressServer]:
    Progress(directory, 0).step_done(11)
    srv = ProgressServer(directory, "127.0.0.1", 0, control_key=KEY, job_uid=UID,
                         reads=Reads.SIGNED, **options)  # fmt: skip
    thread = srv.start_in_thread()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=10)


class Drippers:
    """`count` connections that send a request's first bytes, then one more byte a second,
    never finishing it; each one's end (the server closed it) is recorded."""

    def __init__(self, port: int, count: int, source: str = "127.0.0.1") -> None:
        self.socks = [
            socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
            for _ in range(count)
        ]
        for sock in self.socks:
            sock.sendall(b"GET /progress HTTP/1.1\r\nHost: pod\r\nX-Drip: ")
        self.closed: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drip, daemon=True)
        self._thread.start()

    def _drip(self) -> None:
        while not self._stop.wait(1.0):
            for i, sock in enumerate(self.socks):
                if i not in self.closed and self.ended(sock):
                    self.closed[i] = time.monotonic()
                    continue
                with contextlib.suppress(OSError):
                    sock.sendall(b"a")

    @staticmethod
    def ended(sock: socket.socket) -> bool:
        """Whether the server closed it (readable: end of stream or a reset; it is sent
        nothing else, its request never being whole)."""
        if not select.select([sock], [], [], 0)[0]:
            return False
        try:
            return sock.recv(1024) == b""
        except OSError:
            return True

    def open_now(self) -> int:
        return sum(1 for sock in self.socks if not self.ended(sock))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for sock in self.socks:
            sock.close()


def test_the_operators_signed_read_is_answered_beside_slow_connections(tmp_path: Path) -> None:
    with sidecar(tmp_path, request_deadline=8.0) as srv:  # margin for a loaded machine
        slow = Drippers(srv.port, SLOW)
        try:
            time.sleep(1.2)  # every one has dripped: each read well within any per-read timeout
            body = fetch_progress("127.0.0.1", srv.port, 10.0, KEY)
            assert [r["step"] for r in body["ranks"]] == [11]
            assert slow.open_now() == SLOW and not slow.closed, (
                "answered while every slow connection was still open: none had to go first"
            )
            conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
            conn.request("GET", "/progress")
            assert conn.getresponse().status == 403, "an unsigned read is refused meanwhile"
            conn.close()
            give_up = time.monotonic() + 60  # dripping forever, they were held forever
            while len(slow.closed) < SLOW and time.monotonic() < give_up:
                time.sleep(0.2)
            assert len(slow.closed) == SLOW, "closed at the deadline over the whole request"
        finally:
            slow.close()


def test_many_slow_connections_from_one_peer_push_out_only_their_own(tmp_path: Path) -> None:
    """The operator's kept connection waits for its next round in the same place slow
    requests arrive; with that place full, a peer holding more loses its oldest first."""
    with sidecar(tmp_path, max_waiting=8) as srv:
        kept = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        kept.request("GET", "/progress", headers=progress_headers(KEY, time.time()))
        assert json.loads(kept.getresponse().read())["ranks"][0]["step"] == 11
        slow = Drippers(srv.port, SLOW, source="127.0.0.2")  # another pod's address
        try:
            give_up = time.monotonic() + 30
            while slow.open_now() > 7 and time.monotonic() < give_up:
                time.sleep(0.05)
            assert slow.open_now() == 7, "8 waiting: the kept connection and 7 slow ones"
            kept.request("GET", "/progress", headers=progress_headers(KEY, time.time()))
            assert kept.getresponse().status == 200, "the kept connection was not pushed out"
            assert fetch_progress("127.0.0.1", srv.port, 10.0, KEY)["ranks"][0]["step"] == 11
        finally:
            slow.close()
            kept.close()


def test_a_kept_connection_gets_each_request_it_sent_at_once(tmp_path: Path) -> None:
    """Bytes read past a request are the next one's: two requests in one write, two answers."""
    with sidecar(tmp_path) as srv:
        one = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        one.sendall(b"GET /healthz HTTP/1.1\r\nHost: pod\r\n\r\n" * 2)
        got = b""
        while got.count(b'{"ok":true}') < 2:
            chunk = one.recv(65536)
            assert chunk, f"closed after {got!r}"
            got += chunk
        assert got.count(b"HTTP/1.1 200") == 2
        one.close()


@pytest.mark.parametrize(
    ("data", "need", "size"),
    [
        (b"GET /progress HTTP/1.1\r\nHost: x\r\n", Need.MORE, 0),
        (b"GET /progress HTTP/1.1\r\nHost: x\r\n\r\nGET", Need.WHOLE, 35),
        (b"GET / HTTP/1.1\n\n", Need.WHOLE, 16),
        (b"POST /control HTTP/1.1\r\nContent-Length: 4\r\n\r\n{}", Need.MORE, 0),
        (b"POST /control HTTP/1.1\r\ncontent-length: 2\r\n\r\n{}", Need.WHOLE, 47),
        (b"POST /x HTTP/1.1\r\nContent-Length: 999999\r\n\r\n", Need.WHOLE, 44),  # 413 at once
        (b"GET /" + b"a" * 100, Need.TOO_LARGE, 0),
    ],
)
def test_framing(data: bytes, need: Need, size: int) -> None:
    found = framing(data, max_head=64, max_body=1024)
    assert (found.need, found.size) == (need, size)


def test_the_victim_is_the_oldest_of_the_peer_with_the_most() -> None:
    assert victim(["op", "a", "b", "a", "b", "a"]) == 1
    assert victim(["op", "b", "a", "b", "a"]) == 1, "a tie: the older peer's oldest"
    assert victim(["op"]) == 0
