"""The pod's progress endpoint: reads the ranks' records and serves ``GET /progress``.

It runs as its own process beside the trainers (``rtj-shim progress-server``), so a rank
that is hung in a collective, holds the GIL or is stopped keeps being reported: its record
stops changing and ``seconds_in_section`` grows. ``GET /progress`` answers
`rtj_shim.progress_report.report`, the records aged at the moment of the request (its JSON
is described there).

With a control directory (in-place restart, `rtj_shim.control`), the body also carries
``"supervisor"``: what ``rtj-shim supervise`` last reported (generation, state, exit code),
and ``POST /control`` takes the operator's signed restart orders for it: it writes the order
to the control directory, rings the supervisor's doorbell (`rtj_shim.doorbell`), waits until
the supervisor has taken it (at most ``ORDER_ACK_SECONDS``) and answers 202 with
``{"accepted": <order>, "report": <this body>}``: the pod's report after the order, so the
operator does not need another round to read it back.

With a fast checkpoint tier (``--fast-tier-dir``, `rtj_shim.fast_tier`), the body carries
``"fast_tier": {"step": 1260, "committed_wall_time": 1717000000.1}``: the newest fast step
every rank of the pod holds (null while none). With a control key too, the sidecar takes part
in the fast tier's peer replica (`rtj_shim.peer_replica`): ``POST /replica`` takes the
operator's signed assignment, the body carries ``"replica"`` (whose steps this pod holds a
copy of, `peer_pull.ReplicaPuller.report`) and, after a copy back, ``"fast_fetch"``
(`peer_pull.fetch_back`'s report); ``GET /fast-tier/...`` serves the job's other pods
(`rtj_shim.peer_serve`, signed requests only). Where the pod has a store and a run
(``RTJ_CHECKPOINT_URI``, ``RTJ_RUN_ID``), ``POST /drain`` takes the operator's signed order
to drain the fast tier into the durable store (`rtj_shim.drain_sidecar`; the pod holding
rank 0) and the body carries ``"drain"`` (the last step drained, the error if any).

Who may read: with ``reads=Reads.SIGNED`` (``rtj-shim progress-server`` with
``RTJ_SIGNED_READS=1``, which the operator renders beside the job's control key),
``GET /progress`` must carry the job's request signature, the scheme the sidecars already
sign ``GET /fast-tier/...`` with (`peer_replica.request_headers`: ``X-RTJ-Time`` and
``X-RTJ-Signature = HMAC(key, "GET <path> <time>")``, refused more than
`peer_replica.MAX_SKEW_S` from this pod's clock); anything else is answered 403 and the
connection closed. The pod's progress is its job's state: only the operator (and the job's
own pods) hold the key. ``GET /healthz`` stays open; it says nothing about the job.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable
from enum import Enum
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar, cast
from urllib.parse import parse_qs

from rtj_shim import control, doorbell, drain_order, fast_tier, peer_replica, peer_serve
from rtj_shim.drain_sidecar import Drainer
from rtj_shim.peer_pull import ReplicaPuller, fetch_back
from rtj_shim.progress_report import report
from rtj_shim.supervisor import carried_out

_Message = TypeVar("_Message")

REQUEST_TIMEOUT_S = 5.0
KEEP_ALIVE_IDLE_S = 30.0
"""How long a connection may wait idle for its next request: the operator's poller keeps one
per pod across its rounds (5 s apart by default); a request once begun must still come in
within REQUEST_TIMEOUT_S."""
MAX_CONNECTIONS = 16  # the operator polls with one at a time; anything beyond is refused
ORDER_ACK_SECONDS = 0.25
"""How long ``POST /control`` may wait for the supervisor to take the order (woken by the
doorbell it takes it within milliseconds: ``stopping`` as a stop begins, ``running`` once a
run started) before it answers with the pod's report; no wait where no supervisor holds
the doorbell (one that ended)."""
ORDER_ACK_POLL_SECONDS = 0.005


class Reads(Enum):
    """Who may ``GET /progress``."""

    OPEN = "open"
    """Anyone who reaches the port (a pod rendered without a key, or by an older operator,
    which reads unsigned)."""
    SIGNED = "signed"
    """Only requests signed with the job's control key (`peer_replica.check_request`)."""


def _keep_from_env() -> int:
    raw = os.environ.get(fast_tier.ENV_KEEP, "")
    return int(raw) if raw.isdigit() else fast_tier.MIN_KEEP


def _shard_chunks(path: Path) -> tuple[int, Any]:
    """The shard's size and an open binary file (no symlinks: O_NOFOLLOW)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    handle = os.fdopen(fd, "rb")
    return os.fstat(fd).st_size, handle


class _Handler(BaseHTTPRequestHandler):
    server: ProgressServer
    timeout = REQUEST_TIMEOUT_S  # a client that stalls mid-request is dropped
    protocol_version = "HTTP/1.1"

    def handle(self) -> None:
        """Requests until the client closes the connection, one asks to close it, or it
        stays idle KEEP_ALIVE_IDLE_S between two requests."""
        self.close_connection = True
        self.handle_one_request()
        while not self.close_connection and self._next_request_comes():
            self.handle_one_request()

    def _next_request_comes(self) -> bool:
        self.connection.settimeout(KEEP_ALIVE_IDLE_S)
        try:
            waiting = cast(io.BufferedReader, self.rfile).peek(1)
        except OSError:  # idle too long (TimeoutError), or the client went
            return False
        self.connection.settimeout(self.timeout)
        return bool(waiting)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/progress":
            if not self._may_read():
                return
            body = report(self.server.directory, control_dir=self.server.control_dir,
                          fast_tier_dir=self.server.fast_tier_dir)  # fmt: skip
            self._reply(200, {**body, **self.server.peer_report()})
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
        self._reply(202, {"accepted": order.to_json(), "report": {**body, **server.peer_report()}})

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

    def _reply(self, code: int, body: dict[str, Any]) -> None:
        self._reply_raw(code, (json.dumps(body, separators=(",", ":")) + "\n").encode())

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


class ProgressServer(ThreadingHTTPServer):
    """``GET /progress`` (JSON above) and ``GET /healthz`` for the records in ``directory``."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        directory: Path,
        host: str = "0.0.0.0",  # noqa: S104
        port: int = 0,
        max_connections: int = MAX_CONNECTIONS,
        *,
        control_dir: Path | None = None,
        fast_tier_dir: Path | None = None,
        control_key: str = "",
        job_uid: str = "",
        drainer: Drainer | None = None,
        order_ack_seconds: float = ORDER_ACK_SECONDS,
        reads: Reads = Reads.OPEN,
    ) -> None:
        if reads is Reads.SIGNED and not control_key:
            raise ValueError("signed reads need the job's control key")
        self.directory = directory
        self.reads = reads
        self.order_ack_seconds = order_ack_seconds
        self.control_dir = control_dir
        self.fast_tier_dir = fast_tier_dir
        self.control_key = control_key
        self.job_uid = job_uid
        self._order_lock = threading.Lock()
        self.replica = (
            ReplicaPuller(fast_tier_dir, control_key, _keep_from_env())
            if fast_tier_dir is not None and control_key
            else None
        )
        if self.replica is not None and self.replica.assigned:
            self.replica.start()  # a restarted sidecar goes on with the copy it holds
        self.drainer = drainer  # the fast tier's drain, where this pod's sidecar runs it
        self._fetches: dict[int, threading.Thread] = {}
        self._fetch_report: dict[str, Any] | None = None
        self._slots = threading.BoundedSemaphore(max_connections)
        if ":" in host:
            self.address_family = socket.AF_INET6
        super().__init__((host, port), _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        """At most ``max_connections`` served at once (threads, memory); more are closed."""
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def take_order(
        self, raw: bytes, signature: str | None
    ) -> tuple[control.Order, dict[str, Any] | None]:
        """Check a restart order and hand it to the supervisor (control.accept says what
        is refused); the last accepted order is the one in the control directory. With it,
        the supervisor's report as it was before the order was handed on, or None where the
        order waits for a fast step to be copied back first, or where no supervisor holds
        the doorbell (it ended: the answer comes at once, not after `order_ack_seconds`)."""
        assert self.control_dir is not None
        with self._order_lock:
            held = control.read_json(self.control_dir / control.ORDER_FILE)
            last = None
            if held is not None:
                try:
                    last = control.parse_order(json.dumps(held).encode())
                except control.OrderError:
                    last = None
            order = control.accept(
                raw, signature, key=self.control_key, job_uid=self.job_uid, last=last
            )
            self.control_dir.mkdir(parents=True, exist_ok=True)
            if order.fast_source is not None and self.fast_tier_dir is not None:
                self._fetch_then_pass_on(order)  # the supervisor sees it once copied back
                return order, None
            before = control.read_json(self.control_dir / control.STATE_FILE) or {}
            control.write_json(self.control_dir / control.ORDER_FILE, order.to_json())
            if doorbell.ring(self.control_dir) is doorbell.Ring.NOBODY:
                return order, None  # its supervisor ended: waiting cannot help
            return order, before

    def await_supervisor(self, order: control.Order, before: dict[str, Any]) -> None:
        """Wait (at most `order_ack_seconds`) until the supervisor has taken `order`: its report
        changed since `before` (``stopping`` once a stop begins, ``running`` once a run
        started), or shows nothing left to do for it (an order posted again). The reply
        then carries the pod's report after the order, so the operator need not read it
        back in a later round."""
        assert self.control_dir is not None
        path = self.control_dir / control.STATE_FILE
        deadline = time.monotonic() + self.order_ack_seconds
        while True:
            state = control.read_json(path)
            if state is not None and (state != before or carried_out(state, order)):
                return
            if time.monotonic() >= deadline:
                return
            time.sleep(ORDER_ACK_POLL_SECONDS)

    def _fetch_then_pass_on(self, order: control.Order) -> None:
        """Copy the pinned fast step of this pod's ranks back from the pod holding its
        replica, then hand the order on; once per generation (orders are re-sent)."""
        if order.generation in self._fetches:
            return
        assert self.control_dir is not None and self.fast_tier_dir is not None
        control_dir, fast_dir = self.control_dir, self.fast_tier_dir

        def fetch() -> None:
            assert order.fast_source is not None and order.fast_step is not None
            try:
                got = fetch_back(fast_dir, order.fast_source, self.control_key, order.fast_step)
            except BaseException as exc:  # fetch_back reports its errors; this is the rest
                got = {"step": order.fast_step, "source": order.fast_source, "ok": False,
                       "error": f"{type(exc).__name__}: {exc}"[:500]}  # fmt: skip
            with self._order_lock:
                self._fetch_report = {"generation": order.generation, **got}
                held = control.read_json(control_dir / control.ORDER_FILE)
                if held is None or int(held.get("generation") or 0) <= order.generation:
                    control.write_json(control_dir / control.ORDER_FILE, order.to_json())

        thread = threading.Thread(target=fetch, name="rtj-fast-fetch", daemon=True)
        self._fetches = {order.generation: thread}
        thread.start()

    def peer_report(self) -> dict[str, Any]:
        """The peer replica's part of ``GET /progress`` (nothing without one)."""
        out: dict[str, Any] = {}
        if self.replica is not None:
            out["replica"] = self.replica.report()
        with self._order_lock:
            if self._fetch_report is not None:
                out["fast_fetch"] = self._fetch_report
        if self.drainer is not None:
            out["drain"] = self.drainer.report()
        return out

    def server_close(self) -> None:
        if self.replica is not None:
            self.replica.stop()
        if self.drainer is not None:
            self.drainer.stop()
        super().server_close()

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def start_in_thread(self) -> threading.Thread:
        """Serve from a daemon thread (tests, embedding); ``shutdown()`` stops it."""
        thread = threading.Thread(target=self.serve_forever, name="rtj-progress", daemon=True)
        thread.start()
        return thread
