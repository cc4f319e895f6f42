"""An endpoint that goes down and comes back, or whose open connections go dead: a
loopback TCP forwarder in front of a server (an S3 store, an API server)."""

from __future__ import annotations

import contextlib
import socket
import threading


class TcpProxy:
    """A loopback TCP forwarder in front of a server: ``down()`` closes the listening port
    and every open connection (the endpoint is unreachable: connection refused), ``up()``
    listens on the same port again. ``stall()`` leaves the open connections open but
    carrying nothing more, either way (a peer or a path gone dead without a FIN, as behind
    a load balancer that dropped its state); new connections work. The server behind it
    keeps its data."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.port = 0
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._stalled: set[socket.socket] = set()
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def up(self) -> TcpProxy:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        sock.listen(64)
        self.port = sock.getsockname()[1]
        self._listener = sock
        threading.Thread(target=self._accept, args=(sock,), daemon=True, name="proxy").start()
        return self

    def down(self) -> None:
        sock, self._listener = self._listener, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        with self._lock:
            conns, self._conns = self._conns, set()
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()

    def stall(self) -> int:
        """The connections open now carry no more data; returns how many there were."""
        with self._lock:
            self._stalled |= self._conns
            return len(self._conns) // 2

    def _accept(self, sock: socket.socket) -> None:
        while True:
            try:
                client, _ = sock.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not sock:  # went down meanwhile
                    client.close()
                    server.close()
                    return
                self._conns |= {client, server}
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if src not in self._stalled:  # a stalled connection swallows what it gets
                    dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            with self._lock:
                self._conns -= {src, dst}
                self._stalled -= {src, dst}
