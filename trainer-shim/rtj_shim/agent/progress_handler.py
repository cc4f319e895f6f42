"""The progress sidecar's HTTP endpoints: the request handler of
`rtj_shim.agent.progress_server.ProgressServer` (what each endpoint answers, and who may call it,
is described there).

Every request that changes the job's state (``POST``: the body's signature) or reads its
checkpoint shards (``GET /fast-tier/...``: the request signature) is checked against the
job's control key before anything else is done for it, and so is ``GET /progress`` with
`Reads.SIGNED`. The request has arrived whole before the handler runs (`rtj_shim.agent.http_gate`).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import time
from collections.abc import Callable
from enum import Enum
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast
from urllib.parse import parse_qs

from rtj_shim.agent import http_gate
from rtj_shim.agent.progress_report import report
from rtj_shim.fast import peer_replica, peer_serve
from rtj_shim.wire import answer_seal, control, drain_order, interval_order

if TYPE_CHECKING:
    from rtj_shim.agent.progress_server import ProgressServer

_Message = TypeVar("_Message")


class Reads(Enum):
    """Who may ``GET /progress``."""

    OPEN = "open"
    """Anyone who reaches the port (a pod rendered without a key, or by an older operator,
    which reads unsigned)."""
    SIGNED = "signed"
    """Only requests signed with the job's control key (`peer_replica.check_request`)."""


def _shard_chunks(path: Path) -> tuple[int, Any]:
    """The shard's size and an open binary file (no symlinks: O_NOFOLLOW)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    handle = os.fdopen(fd, "rb")
    return os.fstat(fd).st_size, handle


class Handler(BaseHTTPRequestHandler):
    """One request, read whole by the gate (`http_gate.Arrived`); after it, unless it
    closes the connection, the server hands the connection back to the gate for the next
    one, with `leftover` (bytes sent past this request)."""

    server: ProgressServer
    protocol_version = "HTTP/1.1"
    leftover = b""

    def setup(self) -> None:
        arrived = cast(http_gate.Arrived, self.request)
        self.connection = arrived.sock
        self.rfile = io.BytesIO(arrived.data)
        self.wfile = http_gate.SocketWriter(arrived.sock)

    def handle(self) -> None:
        self.close_connection = True
        self.handle_one_request()

    def finish(self) -> None:
        self.leftover = self.rfile.read()

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/progress":
            if not self._may_read():
                return
            body = report(self.server.directory, control_dir=self.server.control_dir,
                          fast_tier_dir=self.server.fast_tier_dir)  # fmt: skip
            self._reply(200, {**body, **self.server.peer_report()}, sealed=True)
        elif path.startswith(peer_serve.PREFIX):
            self._fast_tier(path)
        elif path == "/healthz":
            self._reply(200, {"ok": True})
        else:
            self._reply(404, {"error": f"no such path {path!r}; try /progress"})

    def _refused(self) -> str | None:
        """Why this GET does not carry the job's request signature (None: it does)."""
        return peer_replica.check_request(
            self.server.control_key, "GET", self.path,
            self.headers.get(peer_replica.TIME_HEADER),
            self.headers.get(control.SIGNATURE_HEADER), time.time(),
        )  # fmt: skip

    def _may_read(self) -> bool:
        """Whether the pod's report may be read by this request; else it is answered 403
        (the reason) and the connection closed."""
        if self.server.reads is Reads.OPEN:
            return True
        refused = self._refused()
        if refused is None:
            return True
        self.close_connection = True
        self._reply(403, {"error": refused})
        return False

    def _fast_tier(self, path: str) -> None:
        server = self.server
        refused = self._refused()
        fast_dir = server.fast_tier_dir
        if fast_dir is None:
            refused = "this pod has no fast tier"
        if refused is not None or fast_dir is None:
            self._reply(403, {"error": refused})
            return
        query = parse_qs(self.path.split("?", 1)[1] if "?" in self.path else "")
        try:
            read = peer_serve.parse_read(path, query)
            if read.what == "file":
                size, handle = _shard_chunks(peer_serve.file_path(fast_dir, read))
                with handle:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/octet-stream")
                    self.send_header("Content-Length", str(size))
                    self.end_headers()
                    shutil.copyfileobj(handle, self.wfile, 1 << 20)
                return
            if read.what == "holdings":
                body = peer_serve.holdings(fast_dir, read.tier, server.job_uid)
            else:
                body = peer_serve.manifest_body(fast_dir, read)
        except peer_serve.BadRead as exc:
            self._reply(exc.status, {"error": str(exc)})
            return
        except OSError as exc:
            self._reply(404, {"error": f"{type(exc).__name__}: {exc}"[:300]})
            return
        raw = json.dumps(body, separators=(",", ":")).encode()
        signature = peer_replica.answer_signature(server.control_key, self.path, raw)
        self._reply_raw(200, raw, {control.SIGNATURE_HEADER: signature})

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        server = self.server
        if path == "/replica" and server.replica is not None:
            assignment = self._signed(peer_replica.MAX_ASSIGNMENT_BYTES,
                                      peer_replica.accept_assignment)  # fmt: skip
            if assignment is not None:
                server.replica.assign(assignment)
                self._reply(202, {"accepted": assignment.to_json()})
            return
        if path == "/drain" and server.drainer is not None:
            drain = self._signed(drain_order.MAX_DRAIN_ORDER_BYTES, drain_order.accept_drain_order)
            if drain is not None:
                server.drainer.follow(drain)
                self._reply(202, {"accepted": {"attempt": drain.attempt,
                                               "peers": len(drain.peers)}})  # fmt: skip
            return
        if path == "/intervals" and server.control_key:
            self._interval_order()
            return
        if path != "/control" or self.server.control_dir is None:
            self.close_connection = True  # its body is not read: the connection cannot go on
            self._reply(404, {"error": f"no such path {path!r} here"})
            return
        raw = self._body(control.MAX_ORDER_BYTES)
        if raw is None:
            return
        try:
            order, before = server.take_order(raw, self.headers.get(control.SIGNATURE_HEADER))
        except control.OrderError as exc:
            self._reply(403, {"error": str(exc)})
            return
        if before is not None:
            server.await_supervisor(order, before)
        body = report(server.directory, control_dir=server.control_dir,
                      fast_tier_dir=server.fast_tier_dir)  # fmt: skip
        self._reply(202, {"accepted": order.to_json(), "report": {**body, **server.peer_report()}},
                    sealed=True)  # fmt: skip

    def _interval_order(self) -> None:
        """`plannedIntervalSeconds: auto`: the operator's interval, written where the
        trainers read it (`rtj_shim.wire.interval_order`)."""
        order = self._signed(interval_order.MAX_INTERVAL_ORDER_BYTES,
                             interval_order.accept_interval_order)  # fmt: skip
        if order is None:
            return
        try:
            interval_order.write(self.server.directory, order)
        except OSError as exc:  # a progress volume mounted read-only (an older operator's)
            self._reply(409, {"error": f"not written: {type(exc).__name__}: {exc}"[:300]})
            return
        self._reply(202, {"accepted": order.to_json()})

    def _signed(self, limit: int, accept: Callable[..., _Message]) -> _Message | None:
        """The body of a signed message from the operator, checked by ``accept`` (this job's
        key and uid); None once refused (the reply says why)."""
        raw = self._body(limit)
        if raw is None:
            return None
        try:
            return accept(raw, self.headers.get(control.SIGNATURE_HEADER),
                          key=self.server.control_key, job_uid=self.server.job_uid)  # fmt: skip
        except control.OrderError as exc:
            self._reply(403, {"error": str(exc)})
            return None

    def _body(self, limit: int) -> bytes | None:
        try:
            length = int(self.headers.get("Content-Length") or -1)
        except ValueError:
            length = -1
        if not 0 <= length <= limit:
            self.close_connection = True  # its body is not read: the connection cannot go on
            self._reply(413, {"error": f"Content-Length: 0..{limit} bytes"})
            return None
        return self.rfile.read(length)

    def _reply(self, code: int, body: dict[str, Any], sealed: bool = False) -> None:
        """Answer `body`; `sealed`: with this pod's seal where the request carries a nonce
        and the pod seals its answers (`rtj_shim.wire.answer_seal`)."""
        raw = (json.dumps(body, separators=(",", ":")) + "\n").encode()
        nonce = self.headers.get(answer_seal.NONCE_HEADER)
        answerer = self.server.answerer
        headers = {}
        if sealed and answerer is not None and answer_seal.valid_nonce(nonce):
            assert nonce is not None
            headers[answer_seal.SEAL_HEADER] = answer_seal.seal(
                self.server.control_key, nonce, answerer, raw
            )
        self._reply_raw(code, raw, headers)

    def _reply_raw(self, code: int, raw: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.send_header("Cache-Control", "no-store")
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, format: str, *args: Any) -> None:
        return None  # one line per poll would flood the pod's log
