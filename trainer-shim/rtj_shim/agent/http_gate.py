"""The progress sidecar's front door (issue 42: slow clients must not keep the operator out).

One thread reads every connection's request, its head and its body, before any handler
thread is given to it (`Gate`); only a whole request is handed on (``dispatch``).

- **A deadline over the whole request**, not per read: a request must arrive whole within
  ``deadline`` seconds of its first byte (a new connection's: of its accept). A client that
  drips a byte a second is closed at the deadline, whatever its pace.
- **No thread while a request arrives**: a waiting connection costs a socket and its
  buffer (at most ``max_head + max_body`` bytes), never a handler slot. A kept connection
  (HTTP/1.1 keep-alive, handed back after its answer) waits ``idle`` seconds for its next
  request's first byte the same way.
- **Bounded, and fair between peers**: at most ``max_waiting`` connections wait; one more
  closes the oldest of the peer (address) that has the most waiting (`victim`). Slow
  connections from one pod, or a few, can only push each other out, never the operator's
  one connection per pod.

Why this rather than a reserved lane for signed requests: whether a request is signed is
known only once its head has arrived, and the arriving is what a slow client stretches. A
thread per arriving connection is the slot such a client holds; with none held until a
request is whole, the signature is checked at once (``dispatch``'s handler) and a refused
request costs a handler milliseconds.

`framing` and `victim` are pure; the rest is the selector loop.
"""

from __future__ import annotations

import contextlib
import io
import re
import selectors
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

_HEAD_END = re.compile(rb"\r?\n\r?\n")
RECV_BYTES = 65536


class Need(Enum):
    """What the bytes read from a connection so far hold."""

    MORE = "more"
    """Not a whole request yet."""
    WHOLE = "whole"
    """A whole request: its head, and its body where the body is within the bound."""
    TOO_LARGE = "too large"
    """A head longer than the bound: refused (431)."""


@dataclass(frozen=True)
class Framing:
    need: Need
    size: int = 0
    """With WHOLE: how many of the bytes are the request (the rest is the next one's)."""


def content_length(head: bytes) -> int:
    """The request's ``Content-Length`` (its first, as `http.server` reads it); 0 without
    one, or with one that is not a number (the handler refuses such a body)."""
    for line in head.split(b"\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep and name.strip().lower() == b"content-length":
            value = value.strip()
            return int(value) if value.isdigit() else 0
    return 0


def framing(data: bytes, max_head: int, max_body: int) -> Framing:
    """Whether `data` (a connection's bytes so far) starts with a whole request. A body
    declared longer than `max_body` is not waited for: every endpoint refuses it (413) from
    its head alone, and closes the connection."""
    end = _HEAD_END.search(data, 0, max_head + 4)
    if end is None:
        return Framing(Need.TOO_LARGE if len(data) > max_head else Need.MORE)
    length = content_length(data[: end.start()])
    size = end.end() + (length if length <= max_body else 0)
    return Framing(Need.WHOLE, size) if len(data) >= size else Framing(Need.MORE)


def victim(peers: Sequence[str]) -> int:
    """Which waiting connection to close for a new one, given each one's peer address
    (oldest first): the oldest of the peer with the most waiting."""
    counts = Counter(peers)
    most = max(counts.values())
    return next(i for i, peer in enumerate(peers) if counts[peer] == most)


@dataclass(frozen=True)
class Arrived:
    """A connection whose request has arrived whole: its socket (blocking again) and every
    byte read from it so far, the request first."""

    sock: socket.socket
    address: Any
    data: bytes


class SocketWriter(io.BufferedIOBase):
    """A handler's ``wfile``: every write sent whole (``sendall``), unbuffered."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self._sock = sock

    def writable(self) -> bool:
        return True

    def write(self, data: ReadableBuffer, /) -> int:
        with memoryview(data) as view:
            self._sock.sendall(view)
            return view.nbytes


def refuse(sock: socket.socket, status: int, reason: str) -> None:
    """Answer `status` without a body, if the socket takes it at once, and close."""
    head = f"HTTP/1.1 {status} {reason}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    with contextlib.suppress(OSError):
        sock.setblocking(False)
        sock.send(head.encode())
    sock.close()


@dataclass
class _Waiting:
    sock: socket.socket
    address: Any
    peer: str
    data: bytearray
    deadline: float
    begun: bool


class Gate:
    """The selector loop (its own daemon thread, from construction to `close`)."""

    def __init__(
        self,
        dispatch: Callable[[Arrived], None],
        *,
        deadline: float,
        idle: float,
        max_waiting: int,
        max_head: int,
        max_body: int,
    ) -> None:
        self._dispatch = dispatch
        self.deadline, self.idle = deadline, idle
        self.max_waiting, self.max_head, self.max_body = max_waiting, max_head, max_body
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        for end in (self._wake_r, self._wake_w):
            end.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._waiting: dict[socket.socket, _Waiting] = {}  # oldest first
        self._incoming: list[tuple[socket.socket, Any, bytes, bool]] = []
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="rtj-progress-gate", daemon=True)
        self._thread.start()

    def admit(
        self, sock: socket.socket, address: Any, data: bytes = b"", kept: bool = False
    ) -> None:
        """Wait for a request on `sock` (any thread): a new connection, or with `kept` one
        handed back after an answer, `data` the bytes already read past that request."""
        with self._lock:
            closed = self._closed
            if not closed:
                self._incoming.append((sock, address, data, kept))
        if closed:
            sock.close()
            return
        with contextlib.suppress(OSError):  # a full pipe: the loop is awake already
            self._wake_w.send(b"\0")

    def close(self) -> None:
        """Stop the loop and close every waiting connection."""
        with self._lock:
            self._closed = True
            incoming, self._incoming = self._incoming, []
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")
        self._thread.join(timeout=10)
        for sock, *_ in incoming:
            sock.close()
        for waiting in list(self._waiting.values()):
            self._drop(waiting)
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    def _run(self) -> None:
        while True:
            with self._lock:
                if self._closed:
                    return
                incoming, self._incoming = self._incoming, []
            for sock, address, data, kept in incoming:
                self._add(sock, address, data, kept)
            soonest = min((w.deadline for w in self._waiting.values()), default=None)
            wait = None if soonest is None else max(soonest - time.monotonic(), 0.0)
            for key, _ in self._selector.select(wait):
                if key.data is None:
                    with contextlib.suppress(OSError):
                        self._wake_r.recv(RECV_BYTES)
                elif key.data.sock in self._waiting:
                    self._read(key.data)
            now = time.monotonic()
            for waiting in [w for w in self._waiting.values() if w.deadline <= now]:
                self._drop(waiting)  # not whole within its deadline (or idle too long)

    def _add(self, sock: socket.socket, address: Any, data: bytes, kept: bool) -> None:
        if len(self._waiting) >= self.max_waiting:
            oldest_first = list(self._waiting.values())
            self._drop(oldest_first[victim([w.peer for w in oldest_first])])
        begun = not kept or bool(data)
        deadline = time.monotonic() + (self.deadline if begun else self.idle)
        peer = str(address[0]) if isinstance(address, tuple) and address else str(address)
        waiting = _Waiting(sock, address, peer, bytearray(data), deadline, begun)
        try:
            sock.setblocking(False)
            self._selector.register(sock, selectors.EVENT_READ, waiting)
        except (OSError, ValueError):
            sock.close()
            return
        self._waiting[sock] = waiting
        if data:
            self._settle(waiting)  # the next request may have come whole with the last

    def _read(self, waiting: _Waiting) -> None:
        try:
            chunk = waiting.sock.recv(RECV_BYTES)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(waiting)  # the client went
            return
        if not waiting.begun:  # a kept connection's next request: its deadline from now
            waiting.begun, waiting.deadline = True, time.monotonic() + self.deadline
        waiting.data += chunk
        self._settle(waiting)

    def _settle(self, waiting: _Waiting) -> None:
        found = framing(bytes(waiting.data), self.max_head, self.max_body)
        if found.need is Need.MORE:
            return
        self._release(waiting)
        if found.need is Need.TOO_LARGE:
            refuse(waiting.sock, 431, "Request Header Fields Too Large")
            return
        try:
            waiting.sock.setblocking(True)
            self._dispatch(Arrived(waiting.sock, waiting.address, bytes(waiting.data)))
        except Exception:  # one connection's failure must not end the loop
            waiting.sock.close()

    def _release(self, waiting: _Waiting) -> None:
        self._waiting.pop(waiting.sock, None)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._selector.unregister(waiting.sock)

    def _drop(self, waiting: _Waiting) -> None:
        self._release(waiting)
        waiting.sock.close()
