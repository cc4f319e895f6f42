"""A hostile tenant's trainer for the hostile-tenant drill (issue 42), run by the pod runner
in place of a training script. Everything it does is what a tenant's own code can do:

- it serves its own pod's progress port, answering every read (signed or not) with a report
  whose step is a 400-digit integer, or with a 1 MiB body, in turn. A tenant does this with
  a ``spec.checkpoint.resolverImage`` of its own (whose ``rtj-shim`` is its code); under the
  pod runner, where every container is a process of one machine, it takes the port from
  its own pod's progress sidecar;
- it opens ``--slow-connections`` connections to each ``--target`` (another job's progress
  sidecars, ``ip:port``) and drips a request into each, one byte every 2 s, opening a new
  one whenever the sidecar closes one;
- once ``--exit-file`` exists it prints the NVIDIA container hook's words and exits 127, as
  a runtime that could not start a GPU container would report.

What it did is written to ``--status`` (JSON, rewritten every second): the reads it
answered of each kind and the slow connections open and opened in all.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

HOOK_WORDS = (
    "nvidia-container-cli: initialization error: nvml error: driver/library version "
    "mismatch: unknown"
)
HUGE_STEP = int("9" * 400)
DRIP = b"GET /progress HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"a" * 4096


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: dict[str, int] = {"huge_step": 0, "huge_body": 0, "slow_open": 0,
                                       "slow_opened": 0}  # fmt: skip

    def add(self, what: str, by: int = 1) -> int:
        with self.lock:
            self.counts[what] += by
            return self.counts[what]

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return dict(self.counts)


def _sidecar_pids(pod_ip: str, port: int) -> list[int]:
    """The pod's own progress sidecar processes (`rtj-shim progress-server` on its address)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"progress-server" in argv and pod_ip.encode() in argv and str(port).encode() in argv:
            found.append(int(proc.name))
    return found


def take_port(pod_ip: str, port: int, within: float = 60.0) -> socket.socket:
    """Listen on the pod's progress port, taking it from the pod's own sidecar."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        for pid in _sidecar_pids(pod_ip, port):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((pod_ip, port))
        except OSError:
            listener.close()
            time.sleep(0.01)
            continue
        listener.listen(64)
        return listener
    raise SystemExit(f"hostile: could not take {pod_ip}:{port}")


def _answer(conn: socket.socket, tally: Tally) -> None:
    with conn:
        conn.settimeout(5.0)
        try:
            request = b""
            while b"\r\n\r\n" not in request:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                request += chunk
        except OSError:
            return
        if tally.snapshot()["huge_step"] <= tally.snapshot()["huge_body"]:
            tally.add("huge_step")
            body = json.dumps({"schema": 1, "ranks": [
                {"rank": 0, "step": HUGE_STEP, "section": "forward", "seconds_in_section": 1.0}
            ]}).encode()  # fmt: skip
        else:
            tally.add("huge_body")
            body = b'{"ranks": [], "pad": "' + b"x" * (1 << 20) + b'"}'
        head = (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()  # fmt: skip
        with contextlib.suppress(OSError):
            conn.sendall(head + body)


def serve(listener: socket.socket, tally: Tally) -> None:
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_answer, args=(conn, tally), daemon=True).start()


def drip(target: tuple[str, int], tally: Tally) -> None:
    """One slow connection to `target` at a time, for ever: a byte every 2 s."""
    while True:
        try:
            sock = socket.create_connection(target, timeout=10)
        except OSError:
            time.sleep(0.5)
            continue
        tally.add("slow_opened")
        tally.add("slow_open")
        try:
            for byte in DRIP:
                sock.sendall(bytes([byte]))
                time.sleep(2.0)
        except OSError:
            pass
        finally:
            tally.add("slow_open", -1)
            sock.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pod-ip", required=True)
    p.add_argument("--port", type=int, required=True, help="this pod's progress port")
    p.add_argument("--target", action="append", default=[], help="ip:port of another sidecar")
    p.add_argument("--slow-connections", type=int, default=16)
    p.add_argument("--status", type=Path, required=True)
    p.add_argument("--exit-file", type=Path, required=True)
    args = p.parse_args(argv)
    tally = Tally()
    listener = take_port(args.pod_ip, args.port)
    threading.Thread(target=serve, args=(listener, tally), daemon=True).start()
    for target in args.target:
        host, _, port = target.rpartition(":")
        for _ in range(args.slow_connections):
            threading.Thread(target=drip, args=((host, int(port)), tally), daemon=True).start()
    while not args.exit_file.exists():
        tmp = args.status.with_suffix(".tmp")
        tmp.write_text(json.dumps(tally.snapshot()))
        tmp.replace(args.status)
        time.sleep(1.0)
    sys.stderr.write(HOOK_WORDS + "\n")
    sys.stderr.flush()
    return 127


if __name__ == "__main__":
    sys.exit(main())
