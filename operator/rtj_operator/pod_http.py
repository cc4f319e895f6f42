"""The HTTP exchange with a pod's progress sidecar: the signed messages posted to it, then
`GET /progress`, each request bounded as a whole by its timeout (`Deadlines`), over a
connection kept per pod across the poller's rounds (`SidecarConnections`).

Why kept connections and one watchdog: at 1,250 pods a round that opened a connection and
started a timer thread per pod cost the operator ~1.4 CPU-seconds (bench.poll_round), more
than a 1 s poll period; the sidecar serves HTTP/1.1 and keeps a connection open while it is
used (`rtj_shim.agent.progress_server.KEEP_ALIVE_IDLE_S` idle), so the next round reuses it.

Every read of a job that has a control key is signed with it (`progress_headers`: the
request signature the sidecars sign ``GET /fast-tier/...`` with, `rtj_shim.fast.peer_replica`): a
sidecar rendered with ``RTJ_SIGNED_READS`` answers nobody else; an older one ignores the
headers. Where the pod was rendered to seal its answers (`Answerer`: its name and attempt),
the read and every message carry a fresh nonce and an answer counts only with the pod's
seal over it (`rtj_shim.wire.answer_seal`): whatever answers at a reused pod IP is not the pod.
"""

from __future__ import annotations

import contextlib
import heapq
import http.client
import itertools
import json
import resource
import select
import socket
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from rtj_operator.reconcile.world import PollMessage
from rtj_shim.fast.peer_replica import request_headers
from rtj_shim.wire import answer_seal
from rtj_shim.wire.answer_seal import Answerer
from rtj_shim.wire.control import SIGNATURE_HEADER

PROGRESS_PATH = "/progress"
MAX_BODY = 1 << 20
"""A progress body is ~1 KiB per rank (1,024 ranks at most per pod): 1 MiB bounds it."""
IDLE_REUSE_SECONDS = 25.0
"""A kept connection idle longer than this is not used again: the sidecar drops one idle for
`rtj_shim.agent.progress_server.KEEP_ALIVE_IDLE_S` (30 s; an older sidecar after 5 s, which the
look before reuse sees as closed), and a request racing that close would fail for nothing."""
STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)
"""What a request on a kept connection the server has closed meets: asked again once, on a
new connection (every message and the read are idempotent)."""


class PollFailed(Exception):
    """The pod's progress server did not give a usable answer (the message says why)."""


class Deadlines:
    """One watchdog thread for every request in flight: a request still running at its
    deadline has its socket shut down, which wakes the thread reading it. A timer thread per
    request did the same at the cost of a thread start each."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, http.client.HTTPConnection]] = []
        self._armed: set[int] = set()
        self._tokens = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def arm(self, conn: http.client.HTTPConnection, timeout: float) -> int:
        token = next(self._tokens)
        deadline = time.monotonic() + timeout
        with self._cond:
            self._armed.add(token)
            heapq.heappush(self._heap, (deadline, token, conn))
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, daemon=True,
                                                name="rtj-progress-deadlines")  # fmt: skip
                self._thread.start()
            elif self._heap[0][1] == token:
                self._cond.notify()  # earlier than what the watchdog sleeps towards
        return token

    def disarm(self, token: int) -> None:
        """The request ended: its connection is never cut for it after this returns."""
        with self._cond:
            self._armed.discard(token)

    def _watch(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                while self._heap and self._heap[0][0] <= now:
                    _, token, conn = heapq.heappop(self._heap)
                    if token in self._armed:
                        self._armed.discard(token)
                        cut(conn)
                self._cond.wait(self._heap[0][0] - now if self._heap else None)


def cut(conn: http.client.HTTPConnection) -> None:
    """The request's time is up: unblock the thread reading it (shutdown wakes a recv)."""
    sock = conn.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


DEADLINES = Deadlines()
"""The process's watchdog (one thread, started by the first request)."""


def progress_headers(key: str | None, now: float) -> dict[str, str]:
    """The headers of `GET /progress`: signed with the job's control key where it has one
    (``X-RTJ-Time``, ``X-RTJ-Signature``; `now`: Unix seconds)."""
    headers = {"Accept": "application/json"}
    if key:
        headers.update(request_headers(key, "GET", PROGRESS_PATH, now))
    return headers


class Sealing:
    """One request's nonce and the check of its answer's seal (`rtj_shim.wire.answer_seal`):
    nothing to check without the job's key or an `Answerer` (a pod rendered without
    sealing, or by an older operator)."""

    def __init__(self, key: str | None, answerer: Answerer | None) -> None:
        self.key, self.answerer = key, answerer
        self.nonce = answer_seal.new_nonce() if key and answerer is not None else None

    def headers(self) -> dict[str, str]:
        return {answer_seal.NONCE_HEADER: self.nonce} if self.nonce is not None else {}

    def problem(self, response: http.client.HTTPResponse, body: bytes) -> str | None:
        """Why `body` is not the pod's own answer to this request (None: it is, or nothing
        is checked)."""
        if self.nonce is None or self.key is None or self.answerer is None:
            return None
        got = response.getheader(answer_seal.SEAL_HEADER)
        if answer_seal.check(self.key, self.nonce, self.answerer, body, got):
            return None
        return (f"{answer_seal.SEAL_HEADER}: missing or not {self.answerer.pod}'s seal (not "
                "that pod answering at its address)")  # fmt: skip


def read_progress(
    conn: http.client.HTTPConnection,
    timeout: float,
    max_body: int = MAX_BODY,
    deadlines: Deadlines = DEADLINES,
    key: str | None = None,
    answerer: Answerer | None = None,
) -> Any:
    """`GET /progress` on `conn` (signed with `key`, the job's control key, where given): the
    parsed JSON body, or PollFailed. `timeout` bounds the whole request, not each socket
    read: a server that drips bytes is cut off. With `answerer` the body must carry its
    seal (`Sealing`)."""
    token = deadlines.arm(conn, timeout)
    sealing = Sealing(key, answerer)
    try:
        headers = {**progress_headers(key, time.time()), **sealing.headers()}
        conn.request("GET", PROGRESS_PATH, headers=headers)
        response = conn.getresponse()
        body = response.read(max_body + 1)
        if response.status != 200:  # a refusal says why (a clock too far off, a wrong key)
            raise PollFailed(f"HTTP {response.status} {body[:200]!r}")
        if len(body) > max_body:
            raise PollFailed(f"body larger than {max_body} bytes")
        if (unsealed := sealing.problem(response, body)) is not None:
            raise PollFailed(unsealed)
        return json.loads(body)
    except (OSError, http.client.HTTPException) as exc:
        raise PollFailed(f"{type(exc).__name__}: {exc}") from exc
    except ValueError as exc:
        raise PollFailed(f"not JSON: {exc}") from exc
    finally:
        deadlines.disarm(token)


def post(
    conn: http.client.HTTPConnection,
    message: PollMessage,
    timeout: float,
    deadlines: Deadlines = DEADLINES,
    key: str | None = None,
    answerer: Answerer | None = None,
) -> Any:
    """One signed ``POST <path>`` on `conn`, bounded as a whole by `timeout`; PollFailed
    unless the sidecar accepted it (202). A refused message closes the connection (what is
    left on it is not trusted). The pod's report after the message when the answer carries
    one (``"report"``: a sidecar answers a restart order once its supervisor took it), else
    None; with `answerer` (and `key`), only when the answer carries the pod's seal (else
    the pod is read in the next round)."""
    token = deadlines.arm(conn, timeout)
    sealing = Sealing(key, answerer)
    try:
        headers = {"Content-Type": "application/json", SIGNATURE_HEADER: message.signature,
                   **sealing.headers()}  # fmt: skip
        conn.request("POST", message.path, message.body, headers)
        response = conn.getresponse()
        answer = response.read(MAX_BODY)
        if response.status != 202 or not response.isclosed():
            conn.close()  # refused, or an answer past the bound: the next request on a new one
        if response.status != 202:
            raise PollFailed(f"{message.path}: refused: HTTP {response.status} {answer[:200]!r}")
        sealed = sealing.problem(response, answer) is None
    except (OSError, http.client.HTTPException) as exc:
        conn.close()  # whatever is left on it is not read: the next request opens a new one
        raise PollFailed(f"{message.path}: not sent: {type(exc).__name__}: {exc}") from exc
    finally:
        deadlines.disarm(token)
    return carried_report(answer) if sealed else None


def carried_report(answer: bytes) -> Any:
    """The ``"report"`` a message's answer carries (a JSON object), or None: an older
    sidecar's answer has none, and one that does not parse is only a missed shortcut (the
    pod is read in the next round)."""
    try:
        body = json.loads(answer)
    except ValueError:
        return None
    report = body.get("report") if isinstance(body, dict) else None
    return report if isinstance(report, dict) else None


def fetch_progress(
    ip: str, port: int, timeout: float, key: str | None = None, max_body: int = MAX_BODY,
    answerer: Answerer | None = None,
) -> Any:  # fmt: skip
    """One `GET /progress` (signed with `key` where given; sealed by `answerer`, where
    given) on a connection of its own (blocking)."""
    conn = http.client.HTTPConnection(ip, port, timeout=timeout)
    try:
        return read_progress(conn, timeout, max_body, key=key, answerer=answerer)
    finally:
        conn.close()


def post_signed(ip: str, port: int, timeout: float, message: PollMessage) -> Any:
    """One signed ``POST <path>`` on a connection of its own (blocking); `post`'s answer."""
    conn = http.client.HTTPConnection(ip, port, timeout=timeout)
    try:
        return post(conn, message, timeout)
    finally:
        conn.close()


@dataclass(frozen=True)
class Exchanged:
    """What one pod answered in a round: its progress body (or why none) and the messages
    its sidecar did not take (with why)."""

    body: Any
    error: str | None = None
    refused: tuple[tuple[PollMessage, str], ...] = ()


Exchange = Callable[
    [str, int, float, Sequence[PollMessage], bool, str | None, Answerer | None], Exchanged
]
"""(ip, port, timeout, messages, read, key, answerer): post the messages, then read the pod
(signed with `key`, the job's control key, where given) unless `read` is False (its body is
then the report the last answered message carried, or None; its error None); with
`answerer`, an answer counts only with that pod's seal."""
Fetch = Callable[[str, int, float, str | None], Any]
"""(ip, port, timeout, key): the pod's progress (`fetch_progress`)."""
Send = Callable[[str, int, float, PollMessage], Any]
"""Posts one message: the report its answer carries, or None (`post`)."""


def exchange(
    send: Callable[[PollMessage], Any],
    get: Callable[[], Any],
    messages: Sequence[PollMessage],
    read: bool,
) -> Exchanged:
    """Every message (a refused one does not stop the others, nor the read), then the read;
    without the read, the pod's report as the last message's answer carried it (a restart
    order's answer shows the order taken: no later round is needed to read it back)."""
    refused: list[tuple[PollMessage, str]] = []
    carried: Any = None
    for message in messages:
        try:
            carried = send(message) or carried
        except PollFailed as exc:
            refused.append((message, str(exc)))
        except Exception as exc:  # one message's failure must not stop the others
            refused.append((message, f"{message.path}: {type(exc).__name__}: {exc}"))
    if not read:
        return Exchanged(carried if isinstance(carried, dict) else None, None, tuple(refused))
    try:
        return Exchanged(get(), None, tuple(refused))
    except PollFailed as exc:
        return Exchanged(None, str(exc), tuple(refused))


def separately(fetch: Fetch, send: Send) -> Exchange:
    """An exchange made of a `send` per message and a `fetch` (each its own connection)."""

    def exchange_separately(
        ip: str, port: int, timeout: float, messages: Sequence[PollMessage], read: bool = True,
        key: str | None = None, answerer: Answerer | None = None,
    ) -> Exchanged:  # fmt: skip
        """(A test's or a bench's halves: their answers are not checked for a seal.)"""
        return exchange(
            lambda m: send(ip, port, timeout, m), lambda: fetch(ip, port, timeout, key),
            messages, read,
        )  # fmt: skip

    return exchange_separately


def kept_connections_limit() -> int:
    """How many idle connections the poller may keep: half the file descriptors this
    process may open (the API server's connections, the watches and the logs need the
    rest), at least 64."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 65536
    return max(64, soft // 2)


class SidecarConnections:
    """An HTTP/1.1 connection kept per sidecar address across rounds, and the exchange over
    it (`exchange`, an `Exchange`). A connection that answered everything is kept; one that
    failed, or was refused, is closed; one idle past IDLE_REUSE_SECONDS, or found closed by
    the sidecar, is replaced. At most `limit` are kept (`kept_connections_limit`)."""

    def __init__(self, limit: int | None = None, deadlines: Deadlines = DEADLINES) -> None:
        self.limit = kept_connections_limit() if limit is None else limit
        self.deadlines = deadlines
        self._idle: dict[tuple[str, int], tuple[http.client.HTTPConnection, float]] = {}
        self._lock = threading.Lock()
        self.opened = 0
        """Connections made for an exchange so far (for the bench and the tests; one that
        http.client opens again by itself after a refusal closed it is not counted)."""

    def exchange(
        self, ip: str, port: int, timeout: float, messages: Sequence[PollMessage],
        read: bool = True, key: str | None = None, answerer: Answerer | None = None,
    ) -> Exchanged:  # fmt: skip
        address = (ip, port)
        conn, reused = self._take(address, timeout)
        holder = [conn]

        def once(request: Callable[[http.client.HTTPConnection], Any]) -> Any:
            nonlocal reused
            first_on_kept, reused = reused, False  # only the first request can meet its close
            try:
                return request(holder[0])
            except PollFailed as exc:
                if not (first_on_kept and isinstance(exc.__cause__, STALE)):
                    raise
            holder[0].close()  # the sidecar had closed the kept one: again, on a new one
            holder[0] = self._open(address, timeout)
            return request(holder[0])

        answered = exchange(
            lambda m: once(lambda c: post(c, m, timeout, self.deadlines, key, answerer)),
            lambda: once(
                lambda c: read_progress(c, timeout, MAX_BODY, self.deadlines, key, answerer)
            ),
            messages,
            read,
        )
        self._give_back(address, holder[0], answered)
        return answered

    def _take(
        self, address: tuple[str, int], timeout: float
    ) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            kept = self._idle.pop(address, None)
        if kept is not None:
            conn, since = kept
            if time.monotonic() - since < IDLE_REUSE_SECONDS and _open_and_quiet(conn):
                if conn.timeout != timeout and conn.sock is not None:
                    conn.sock.settimeout(timeout)
                conn.timeout = timeout
                return conn, True
            conn.close()
        return self._open(address, timeout), False

    def _open(self, address: tuple[str, int], timeout: float) -> http.client.HTTPConnection:
        self.opened += 1
        return http.client.HTTPConnection(*address, timeout=timeout)

    def _give_back(
        self, address: tuple[str, int], conn: http.client.HTTPConnection, answered: Exchanged
    ) -> None:
        usable = answered.error is None and not answered.refused and conn.sock is not None
        if usable:
            with self._lock:
                if len(self._idle) < self.limit:
                    self._idle[address] = (conn, time.monotonic())
                    return
        conn.close()

    def keep_only(self, addresses: Collection[tuple[str, int]]) -> None:
        """Close the kept connections to other addresses, and those idle too long to use."""
        now = time.monotonic()
        with self._lock:
            gone = [a for a, (_, since) in self._idle.items()
                    if a not in addresses or now - since >= IDLE_REUSE_SECONDS]  # fmt: skip
            closing = [self._idle.pop(a)[0] for a in gone]
        for conn in closing:
            conn.close()

    def close(self) -> None:
        with self._lock:
            closing = [conn for conn, _ in self._idle.values()]
            self._idle.clear()
        for conn in closing:
            conn.close()


def _open_and_quiet(conn: http.client.HTTPConnection) -> bool:
    """Whether a kept connection is still open with nothing unread on it: readable now means
    the sidecar closed it (end of file) or sent bytes nobody asked for; either way it is
    not used. One poll(2) without waiting (a socket with a timeout would wait in recv)."""
    sock = conn.sock
    if sock is None:
        return False
    try:
        watch = select.poll()
        watch.register(sock, select.POLLIN)
        return not watch.poll(0)
    except (OSError, ValueError):
        return False


def exchange_http(
    ip: str, port: int, timeout: float, messages: Sequence[PollMessage], read: bool = True,
    key: str | None = None, answerer: Answerer | None = None,
) -> Exchanged:  # fmt: skip
    """The pod's messages, then `GET /progress` (signed with `key` where given), on one new
    connection, closed after (none kept)."""
    return SidecarConnections(limit=0).exchange(ip, port, timeout, messages, read, key,
                                                answerer)  # fmt: skip
