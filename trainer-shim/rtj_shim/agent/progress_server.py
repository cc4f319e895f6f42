"""The pod's progress endpoint: reads the ranks' records and serves ``GET /progress``.

It runs as its own process beside the trainers (``rtj-shim progress-server``), so a rank
that is hung in a collective, holds the GIL or is stopped keeps being reported: its record
stops changing and ``seconds_in_section`` grows. ``GET /progress`` answers
`rtj_shim.agent.progress_report.report`, the records aged at the moment of the request (its JSON
is described there).

With a control directory (in-place restart, `rtj_shim.wire.control`), the body also carries
``"supervisor"``: what ``rtj-shim supervise`` last reported (generation, state, exit code),
and ``POST /control`` takes the operator's signed restart orders for it: it writes the order
to the control directory, rings the supervisor's doorbell (`rtj_shim.agent.doorbell`), waits until
the supervisor has taken it (at most ``ORDER_ACK_SECONDS``) and answers 202 with
``{"accepted": <order>, "report": <this body>}``: the pod's report after the order, so the
operator does not need another round to read it back.

With a fast checkpoint tier (``--fast-tier-dir``, `rtj_shim.fast.fast_tier`), the body carries
``"fast_tier": {"step": 1260, "committed_wall_time": 1717000000.1}``: the newest fast step
every rank of the pod holds (null while none). With a control key too, the sidecar takes part
in the fast tier's peer replica (`rtj_shim.fast.peer_replica`): ``POST /replica`` takes the
operator's signed assignment, the body carries ``"replica"`` (whose steps this pod holds a
copy of, `peer_pull.ReplicaPuller.report`) and, after a copy back, ``"fast_fetch"``
(`peer_pull.fetch_back`'s report); ``GET /fast-tier/...`` serves the job's other pods
(`rtj_shim.fast.peer_serve`, signed requests only). Where the pod has a store and a run
(``RTJ_CHECKPOINT_URI``, ``RTJ_RUN_ID``), ``POST /drain`` takes the operator's signed order
to drain the fast tier into the durable store (`rtj_shim.fast.drain_sidecar`; the pod holding
rank 0) and the body carries ``"drain"`` (the last step drained, the error if any).
``POST /intervals`` takes the operator's signed checkpoint interval
(`rtj_shim.wire.interval_order`, `plannedIntervalSeconds: auto`) and writes it into the
progress directory for the trainers; the body carries ``"intervals"`` (the one held).

Who may read: with ``reads=Reads.SIGNED`` (``rtj-shim progress-server`` with
``RTJ_SIGNED_READS=1``, which the operator renders beside the job's control key),
``GET /progress`` must carry the job's request signature, the scheme the sidecars already
sign ``GET /fast-tier/...`` with (`peer_replica.request_headers`: ``X-RTJ-Time`` and
``X-RTJ-Signature = HMAC(key, "GET <path> <time>")``, refused more than
`peer_replica.MAX_SKEW_S` from this pod's clock); anything else is answered 403 and the
connection closed. The pod's progress is its job's state: only the operator (and the job's
own pods) hold the key. ``GET /healthz`` stays open; it says nothing about the job.

Who answers: with an `answer_seal.Answerer` (``RTJ_SEALED_ANSWERS=1``, ``RTJ_POD_NAME`` and
``RTJ_POD_ATTEMPT``, rendered by the operator beside the key), the answer to a read or a
restart order that carries ``X-RTJ-Nonce`` is sealed (``X-RTJ-Seal``) over the nonce, this
pod's name and attempt and the body, so the operator knows the answer came from this pod
and not from whatever holds its IP now.

Slow clients (issue 42): every request is read whole, head and body, by one thread
(`rtj_shim.agent.http_gate`) within ``REQUEST_DEADLINE_S`` of its first byte, before a handler
thread is given to it; at most ``MAX_SERVING`` are answered at once (a whole request beyond
them is answered 503). So connections that drip their requests hold no handler, and the
operator's signed read is answered beside any number of them.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from http.server import HTTPServer
from pathlib import Path
from typing import Any, cast

from rtj_shim.agent import doorbell, http_gate
from rtj_shim.agent.progress_handler import Handler, Reads
from rtj_shim.agent.supervisor import carried_out
from rtj_shim.fast import fast_tier, peer_replica
from rtj_shim.fast.drain_sidecar import Drainer
from rtj_shim.fast.peer_pull import ReplicaPuller, fetch_back
from rtj_shim.wire import answer_seal, control, drain_order, interval_order

REQUEST_DEADLINE_S = 5.0
"""A request must arrive whole (head and body) within this of its first byte (a new
connection's: of its accept), or its connection is closed; also the bound on each answer's
send to a client that does not read."""
KEEP_ALIVE_IDLE_S = 30.0
"""How long a connection may wait idle for its next request: the operator's poller keeps one
per pod across its rounds (5 s apart by default); a request once begun must still come in
whole within REQUEST_DEADLINE_S."""
MAX_SERVING = 16
"""Requests answered at once (a thread each); the operator sends one at a time per pod."""
MAX_WAITING = 128
"""Connections whose next request has not arrived whole; one more closes the oldest of the
peer with the most (`http_gate.victim`)."""
MAX_HEAD_BYTES = 16 * 1024
MAX_BODY_BYTES = max(
    control.MAX_ORDER_BYTES, peer_replica.MAX_ASSIGNMENT_BYTES, drain_order.MAX_DRAIN_ORDER_BYTES
)
"""The largest body any endpoint takes (a drain order's)."""
ORDER_ACK_SECONDS = 0.25
"""How long ``POST /control`` may wait for the supervisor to take the order (woken by the
doorbell it takes it within milliseconds: ``stopping`` as a stop begins, ``running`` once a
run started) before it answers with the pod's report; no wait where no supervisor holds
the doorbell (one that ended)."""
ORDER_ACK_POLL_SECONDS = 0.005


def _keep_from_env() -> int:
    raw = os.environ.get(fast_tier.ENV_KEEP, "")
    return int(raw) if raw.isdigit() else fast_tier.MIN_KEEP


class ProgressServer(HTTPServer):
    """``GET /progress`` (JSON above) and ``GET /healthz`` for the records in ``directory``."""

    allow_reuse_address = True

    def __init__(
        self,
        directory: Path,
        host: str = "0.0.0.0",  # noqa: S104
        port: int = 0,
        max_serving: int = MAX_SERVING,
        *,
        request_deadline: float = REQUEST_DEADLINE_S,
        keep_alive_idle: float = KEEP_ALIVE_IDLE_S,
        max_waiting: int = MAX_WAITING,
        control_dir: Path | None = None,
        fast_tier_dir: Path | None = None,
        control_key: str = "",
        job_uid: str = "",
        drainer: Drainer | None = None,
        order_ack_seconds: float = ORDER_ACK_SECONDS,
        reads: Reads = Reads.OPEN,
        answerer: answer_seal.Answerer | None = None,
    ) -> None:
        if reads is Reads.SIGNED and not control_key:
            raise ValueError("signed reads need the job's control key")
        if answerer is not None and not control_key:
            raise ValueError("sealed answers need the job's control key")
        self.answerer = answerer
        """This pod (its name and attempt): with it, an answer to a read that carries a
        nonce is sealed (`rtj_shim.wire.answer_seal`)."""
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
        self._slots = threading.BoundedSemaphore(max_serving)
        self.request_deadline = request_deadline
        self._gate = http_gate.Gate(
            self._dispatch, deadline=request_deadline, idle=keep_alive_idle,
            max_waiting=max_waiting, max_head=MAX_HEAD_BYTES, max_body=MAX_BODY_BYTES,
        )  # fmt: skip
        if ":" in host:
            self.address_family = socket.AF_INET6
        super().__init__((host, port), Handler)  # a failed bind calls server_close

    def process_request(self, request: Any, client_address: Any) -> None:
        """A new connection: its request is read by the gate, no thread before it is whole."""
        self._gate.admit(request, client_address)

    def _dispatch(self, arrived: http_gate.Arrived) -> None:
        """A whole request: answered on a thread of its own, at most ``max_serving`` at once
        (threads, memory); beyond them, 503."""
        if not self._slots.acquire(blocking=False):
            http_gate.refuse(arrived.sock, 503, "Service Unavailable")
            return
        try:
            threading.Thread(target=self._serve, args=(arrived,), daemon=True,
                             name="rtj-progress-request").start()  # fmt: skip
        except RuntimeError:  # no thread to be had
            self._slots.release()
            http_gate.refuse(arrived.sock, 503, "Service Unavailable")

    def _serve(self, arrived: http_gate.Arrived) -> None:
        try:
            arrived.sock.settimeout(self.request_deadline)  # an answer nobody reads: dropped
            # the request is the gate's Arrived, not a socket: Handler.setup reads it
            handler = Handler(cast(Any, arrived), arrived.address, self)
            if handler.close_connection:
                self.shutdown_request(arrived.sock)
            else:
                self._gate.admit(arrived.sock, arrived.address, handler.leftover, kept=True)
        except OSError:  # the client went mid-answer, or stopped reading it
            self.shutdown_request(arrived.sock)
        except Exception:  # a bug: its traceback on stderr (socketserver's), the pod goes on
            self.handle_error(arrived.sock, arrived.address)
            self.shutdown_request(arrived.sock)
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
        if self.control_key and (held := interval_order.read(self.directory)) is not None:
            out["intervals"] = {"durable_seconds": held.durable_seconds}
        return out

    def server_close(self) -> None:
        self._gate.close()
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
