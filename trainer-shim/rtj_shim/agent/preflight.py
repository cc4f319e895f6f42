"""``rtj-shim preflight``: the platform's check that a new world may train, before any state
is loaded (the ``rtj-preflight`` init container; the verdict's type and rule are
`rtj_shim.wire.preflight_verdict`).

1. **The collective test** (a new attempt's whole world of at least `MIN_WORLD_TO_JUDGE`
   pods, below which no link can be put on one pod; not in a replacement pod or a spare,
   which join a world already past it): every pod joins a coordinator that rank 0 runs on
   ``MASTER_ADDR:MASTER_PORT`` (the trainer's rendezvous, free until the trainer starts),
   learns its ring successor, sends it ``--bytes`` while receiving as many from its
   predecessor, and reports both rates. The coordinator blames a rank only when it is slower
   than the world's median by ``--factor`` both ways (`slow_ranks`) and the transfer took at
   least ``--min-slow-seconds``, and answers every rank. Every message carries the job key's
   signature when the pod has it (``RTJ_CONTROL_KEY``): no other pod can join or answer.
   A world that does not gather within ``--timeout`` (a pod not yet started, a peer gone)
   proves nothing against this pod: it passes, with a note.
2. **The node check**: the platform's command (``--node-check -- dcgmi diag -r 1``), run
   without a shell; a command this image does not have is skipped with a note (a CPU node,
   an image without DCGM), a non-zero exit or a timeout fails the pod.

Exit 0 with a passing verdict, 1 with a failing one (its node is then quarantined by the
operator), 2 on a usage error; the verdict is also written to ``--termination-log``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rtj_shim.errors import UsageError
from rtj_shim.wire import control
from rtj_shim.wire.preflight_verdict import (
    MIN_WORLD_TO_JUDGE,
    LinkRate,
    PreflightCheck,
    PreflightVerdict,
    medians,
    slow_ranks,
)

MAX_LINE = 64 * 1024
GRACE_S = 2.0
"""How long past the deadline a pod waits for the coordinator's word (it answers then)."""
CHUNK = 1 << 20


@dataclass(frozen=True)
class PreflightConfig:
    rank: int
    world: int
    coordinator: tuple[str, int]
    advertise: str
    """The address peers reach this pod's data listener at (its pod IP)."""
    payload_bytes: int = 16 << 20
    factor: float = 4.0
    min_slow_seconds: float = 0.25
    timeout_s: float = 120.0
    collective: bool = True
    node_command: tuple[str, ...] = ()
    key: str | None = None
    throttle_bytes_per_second: float | None = None
    """Tests only: cap this pod's sending rate (a slow NIC)."""


@dataclass
class _Rates:
    send_s: float | None = None
    recv_s: float | None = None
    errors: list[str] = field(default_factory=list)


class _Lines:
    """JSON lines over a socket, each signed with the job's key when there is one."""

    def __init__(self, sock: socket.socket, key: str | None) -> None:
        self.sock, self.key = sock, key
        self.reader = sock.makefile("rb")

    def send(self, body: dict[str, object]) -> None:
        raw = json.dumps(body, sort_keys=True).encode()
        sig = control.sign(self.key, raw) if self.key else ""
        self.sock.sendall(json.dumps({"body": body, "sig": sig}).encode() + b"\n")

    def receive(self) -> dict[str, object]:
        line = self.reader.readline(MAX_LINE + 1)
        if not line or len(line) > MAX_LINE:
            raise ConnectionError("connection closed or message too long")
        wrapper = json.loads(line)
        body = wrapper.get("body") if isinstance(wrapper, dict) else None
        if not isinstance(body, dict):
            raise ConnectionError("not a preflight message")
        raw = json.dumps(body, sort_keys=True).encode()
        if self.key and not control.verify(self.key, raw, str(wrapper.get("sig") or "")):
            raise ConnectionError("a message not signed with the job's key")
        return body


def run(config: PreflightConfig) -> PreflightVerdict:
    notes: list[str] = []
    ring = config.collective and config.world >= MIN_WORLD_TO_JUDGE
    collective = _collective(config, notes) if ring else None
    if not config.collective:
        notes.append("collective test skipped: this pod joins a world already past it")
    elif not ring:
        notes.append(f"collective test skipped: a world under {MIN_WORLD_TO_JUDGE} pods "
                     "cannot put a slow link on one pod")  # fmt: skip
    node_failure, node_summary = _node_check(config.node_command, config.timeout_s, notes)
    if node_failure is not None:
        return PreflightVerdict(False, PreflightCheck.NODE, node_failure, config.world,
                                node_check=node_summary, notes=tuple(notes))  # fmt: skip
    if collective is not None and not collective.passed:
        return PreflightVerdict(**{**collective.__dict__, "node_check": node_summary,
                                   "notes": tuple(notes)})  # fmt: skip
    base = collective or PreflightVerdict(True, world=config.world)
    return PreflightVerdict(**{**base.__dict__, "passed": True, "node_check": node_summary,
                               "notes": tuple(notes)})  # fmt: skip


def _node_check(
    command: Sequence[str], timeout_s: float, notes: list[str]
) -> tuple[str | None, str | None]:
    """(the failure, a summary) of the platform's node-local command."""
    if not command:
        return None, None
    if shutil.which(command[0]) is None:
        notes.append(f"node check skipped: {command[0]} is not in this image")
        return None, f"skipped ({command[0]} not found)"
    started = time.monotonic()
    try:
        done = subprocess.run(list(command), capture_output=True, text=True,
                              timeout=timeout_s, check=False)  # fmt: skip
    except subprocess.TimeoutExpired:
        return f"{' '.join(command)} did not finish within {timeout_s:g} s", "timed out"
    took = time.monotonic() - started
    summary = f"exit {done.returncode} in {took:.1f} s"
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip()[-600:]
        return f"{' '.join(command)} exited {done.returncode}: {tail}", summary
    return None, summary


def _collective(config: PreflightConfig, notes: list[str]) -> PreflightVerdict | None:
    deadline = time.monotonic() + config.timeout_s
    try:
        server = _Coordinator(config, deadline) if config.rank == 0 else None
    except OSError as exc:  # the port taken: nothing proven against anyone
        notes.append(f"collective test not run: cannot listen on port {config.coordinator[1]}: "
                     f"{exc}")  # fmt: skip
        return None
    if server is not None:
        server.start()
    try:
        return _participate(config, deadline, notes)
    finally:
        if server is not None:
            server.close()


def _participate(
    config: PreflightConfig, deadline: float, notes: list[str]
) -> PreflightVerdict | None:
    listener = socket.create_server(("", 0))
    listener.settimeout(max(0.1, deadline - time.monotonic()))
    port = listener.getsockname()[1]
    try:
        lines = _Lines(_connect(config.coordinator, deadline), config.key)
        lines.sock.settimeout(max(0.1, deadline - time.monotonic()) + GRACE_S)  # its answer
        lines.send({"type": "join", "rank": config.rank, "host": config.advertise, "port": port})
        ring = lines.receive()
        if ring.get("type") != "ring":
            notes.append(f"collective test not run: {ring.get('reason') or ring.get('type')}")
            return None
        successor = (str(ring["host"]), int(str(ring["port"])))
        rates = _exchange(config, listener, successor, deadline)
        if rates.errors or rates.send_s is None or rates.recv_s is None:
            notes.append("collective test incomplete: " + "; ".join(rates.errors)[:300])
            return None
        lines.send({"type": "rates", "rank": config.rank,
                    "send_s": rates.send_s, "recv_s": rates.recv_s})  # fmt: skip
        verdict = lines.receive()
    except (OSError, ConnectionError, ValueError, KeyError) as exc:
        notes.append(f"collective test not completed: {type(exc).__name__}: {exc}"[:300])
        return None
    finally:
        listener.close()
    return _verdict_for(config, rates, verdict)


def _verdict_for(
    config: PreflightConfig, rates: _Rates, verdict: dict[str, object]
) -> PreflightVerdict:
    assert rates.send_s is not None and rates.recv_s is not None
    slow = verdict.get("slow") if isinstance(verdict.get("slow"), dict) else {}
    assert isinstance(slow, dict)
    reason = slow.get(str(config.rank))
    send, recv = (_float(verdict.get(k)) for k in ("median_send", "median_recv"))
    return PreflightVerdict(
        passed=reason is None,
        check=None if reason is None else PreflightCheck.COLLECTIVE,
        reason=str(reason or ""),
        world=config.world,
        send_bytes_per_second=config.payload_bytes / max(rates.send_s, 1e-9),
        recv_bytes_per_second=config.payload_bytes / max(rates.recv_s, 1e-9),
        median_send_bytes_per_second=send,
        median_recv_bytes_per_second=recv,
    )


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _connect(address: tuple[str, int], deadline: float) -> socket.socket:
    """The coordinator, retried until the deadline (rank 0's pod may start later)."""
    while True:
        try:
            sock = socket.create_connection(address, timeout=2.0)
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            return sock
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _exchange(
    config: PreflightConfig, listener: socket.socket, successor: tuple[str, int], deadline: float
) -> _Rates:
    """Send the payload to the successor while receiving one from the predecessor."""
    rates = _Rates()
    receiver = threading.Thread(target=_receive, args=(config, listener, rates), daemon=True)
    receiver.start()
    try:
        _send(config, successor, rates, deadline)
    except OSError as exc:
        rates.errors.append(f"sending to {successor[0]}:{successor[1]}: {exc}")
    receiver.join(max(0.1, deadline - time.monotonic()))
    if receiver.is_alive():
        rates.errors.append("the predecessor's payload did not arrive in time")
    return rates


def _send(
    config: PreflightConfig, successor: tuple[str, int], rates: _Rates, deadline: float
) -> None:
    with _connect(successor, deadline) as sock:
        lines = _Lines(sock, config.key)
        lines.send({"type": "hello", "rank": config.rank})
        chunk = b"\0" * min(CHUNK, config.payload_bytes)
        started, sent = time.monotonic(), 0
        while sent < config.payload_bytes:
            piece = chunk[: config.payload_bytes - sent]
            sock.sendall(piece)
            sent += len(piece)
            _pace(config.throttle_bytes_per_second, sent, started)
        if sock.recv(1) != b"\1":
            raise OSError("the successor did not acknowledge the payload")
        rates.send_s = time.monotonic() - started


def _pace(rate: float | None, done: int, started: float) -> None:
    """Tests only: hold a transfer to `rate` bytes per second (a slow NIC, both ways)."""
    if rate:
        ahead = done / rate - (time.monotonic() - started)
        if ahead > 0:
            time.sleep(ahead)


def _receive(config: PreflightConfig, listener: socket.socket, rates: _Rates) -> None:
    try:
        conn, _ = listener.accept()
        with conn:
            lines = _Lines(conn, config.key)
            hello = lines.receive()
            if hello.get("type") != "hello":
                raise ConnectionError("the predecessor did not say hello")
            first: float | None = None
            got = 0
            while got < config.payload_bytes:
                data = lines.reader.read1(min(CHUNK, config.payload_bytes - got))
                if not data:
                    raise ConnectionError(f"the predecessor sent {got} of {config.payload_bytes}")
                first = first if first is not None else time.monotonic()
                got += len(data)
                _pace(config.throttle_bytes_per_second, got, first)
            conn.sendall(b"\1")
            rates.recv_s = time.monotonic() - (first or time.monotonic())
    except (OSError, ConnectionError, ValueError) as exc:
        rates.errors.append(f"receiving: {exc}")


class _Coordinator:
    """Rank 0's side: gather the world, hand out the ring, judge the rates."""

    def __init__(self, config: PreflightConfig, deadline: float) -> None:
        self.config, self.deadline = config, deadline
        host, port = "", config.coordinator[1]
        self.server = socket.create_server((host, port), reuse_port=False)
        self.server.settimeout(0.2)
        self.joined: dict[int, tuple[_Lines, str, int]] = {}
        self.thread = threading.Thread(target=self._serve, name="rtj-preflight", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.thread.join(max(0.1, self.deadline - time.monotonic() + 1.0))
        self.server.close()
        for lines, _, _ in self.joined.values():
            lines.sock.close()

    def _serve(self) -> None:
        while len(self.joined) < self.config.world and time.monotonic() < self.deadline:
            try:
                sock, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._join(sock)
        missing = sorted(set(range(self.config.world)) - set(self.joined))
        if missing:
            self._tell_all({"type": "abort", "reason": f"ranks {missing} did not join in time"})
            return
        world = self.config.world
        for rank, (lines, _, _) in self.joined.items():
            _, host, port = self.joined[(rank + 1) % world]
            lines.send({"type": "ring", "host": host, "port": port})
        self._judge()

    def _join(self, sock: socket.socket) -> None:
        sock.settimeout(max(0.1, self.deadline - time.monotonic()))
        lines = _Lines(sock, self.config.key)
        try:
            body = lines.receive()
            rank = body.get("rank")
            ok = body.get("type") == "join" and isinstance(rank, int) and not isinstance(rank, bool)
            if not ok or not 0 <= int(str(rank)) < self.config.world or rank in self.joined:
                raise ConnectionError(f"not a join this world expects: {body!r:.100}")
            self.joined[int(str(rank))] = (lines, str(body["host"]), int(str(body["port"])))
        except (OSError, ConnectionError, ValueError, KeyError):
            sock.close()

    def _judge(self) -> None:
        rates: list[LinkRate] = []
        size = self.config.payload_bytes
        for rank, (lines, _, _) in self.joined.items():
            try:
                body = lines.receive()
                send_s, recv_s = float(str(body["send_s"])), float(str(body["recv_s"]))
            except (OSError, ConnectionError, ValueError, KeyError):
                continue
            if body.get("type") == "rates":
                rates.append(LinkRate(rank, size / max(send_s, 1e-9), size / max(recv_s, 1e-9)))
        slow = slow_ranks(rates, self.config.factor) if len(rates) == self.config.world else {}
        slowest = self.config.min_slow_seconds * 1.0
        slow = {r: why for r, why in slow.items() if _took(rates, r, size) >= slowest}
        send, recv = medians(rates)
        note = None if len(rates) >= MIN_WORLD_TO_JUDGE else "too few ranks to blame one link"
        self._tell_all({"type": "verdict", "slow": {str(r): w for r, w in slow.items()},
                        "median_send": send, "median_recv": recv, "note": note})  # fmt: skip

    def _tell_all(self, body: dict[str, object]) -> None:
        for lines, _, _ in self.joined.values():
            try:
                lines.send(body)
            except OSError:
                continue


def _took(rates: Sequence[LinkRate], rank: int, size: int) -> float:
    """The slower of a rank's two transfers, in seconds."""
    rate = next(r for r in rates if r.rank == rank)
    return size / max(min(rate.send, rate.recv), 1e-9)


# --- the command ---------------------------------------------------------------------------

ENV_RANK = "NODE_RANK"
ENV_WORLD = "WORLD_SIZE"
ENV_MASTER_ADDR = "MASTER_ADDR"
ENV_MASTER_PORT = "MASTER_PORT"
ENV_POD_IP = "RTJ_POD_IP"
ENV_CONTROL_KEY = "RTJ_CONTROL_KEY"
ENV_INDEX_FAILURES = "RTJ_INDEX_FAILURES"
ENV_SPARE = "RTJ_SPARE"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("preflight", help="the platform's check before a world trains")
    p.add_argument("--rank", type=int, help=f"this pod's rank (default: ${ENV_RANK})")
    p.add_argument("--world", type=int, help=f"the pods of the world (default: ${ENV_WORLD})")
    p.add_argument(
        "--coordinator", help=f"HOST:PORT (default: ${ENV_MASTER_ADDR}:${ENV_MASTER_PORT})"
    )
    p.add_argument("--advertise", help=f"this pod's address (default: ${ENV_POD_IP})")
    p.add_argument("--bytes", type=int, default=16 << 20, help="payload per link (16 MiB)")
    p.add_argument("--factor", type=float, default=4.0,
                   help="fail a rank this many times below the median both ways")  # fmt: skip
    p.add_argument("--min-slow-seconds", type=float, default=0.25,
                   help="a transfer quicker than this is never judged slow")  # fmt: skip
    p.add_argument("--timeout", type=float, default=120.0, help="seconds for the whole check")
    p.add_argument("--no-collective", action="store_true", help="the node check only")
    p.add_argument("--termination-log", type=Path, help="also write the verdict here")
    p.add_argument("--throttle-bytes-per-second", type=float, help=argparse.SUPPRESS)
    p.add_argument("node_command", nargs=argparse.REMAINDER,
                   help="-- COMMAND...: the platform's node-local check")  # fmt: skip


def config_from(args: argparse.Namespace, env: Mapping[str, str]) -> PreflightConfig:
    """The check's settings: arguments first, then the pod's environment; a missing or bad
    one is a UsageError naming it."""
    rank = args.rank if args.rank is not None else _env_int(env, ENV_RANK)
    world = args.world if args.world is not None else _env_int(env, ENV_WORLD)
    coordinator = (
        args.coordinator or f"{env.get(ENV_MASTER_ADDR, '')}:{env.get(ENV_MASTER_PORT, '')}"
    )
    host, _, port = coordinator.rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(
            f"--coordinator: expected HOST:PORT (or ${ENV_MASTER_ADDR} and "
            f"${ENV_MASTER_PORT}), got {coordinator!r}"
        )
    if not 0 <= rank < world:
        raise UsageError(f"--rank: expected 0 <= rank < world ({world}), got {rank}")
    joins_late = _env_int(env, ENV_INDEX_FAILURES, 0) > 0 or env.get(ENV_SPARE) == "1"
    command = tuple(c for c in args.node_command if c != "--")[:64]
    return PreflightConfig(
        rank=rank, world=world, coordinator=(host, int(port)),
        advertise=args.advertise or env.get(ENV_POD_IP) or _own_address(),
        payload_bytes=max(1, args.bytes), factor=args.factor,
        min_slow_seconds=args.min_slow_seconds, timeout_s=args.timeout,
        collective=not (args.no_collective or joins_late), node_command=command,
        key=env.get(ENV_CONTROL_KEY) or None,
        throttle_bytes_per_second=args.throttle_bytes_per_second,
    )  # fmt: skip


def _own_address() -> str:
    return socket.gethostbyname(socket.gethostname())


def _env_int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = env.get(name, "")
    if not raw and default is not None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise UsageError(f"${name}: expected an integer, got {raw!r}") from None


def main(args: argparse.Namespace) -> int:
    verdict = run(config_from(args, os.environ))
    raw = verdict.encode_bytes()
    if args.termination_log is not None:
        try:
            args.termination_log.write_bytes(raw)
        except OSError as exc:
            sys.stderr.write(
                f"rtj-shim preflight: note: cannot write {args.termination_log}: {exc}\n"
            )
    sys.stdout.write(raw.decode() + "\n")
    return 0 if verdict.passed else 1
