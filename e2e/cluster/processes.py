"""Local processes of the cluster: free loopback ports, process groups, teardown checks."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A currently free loopback TCP port, chosen by the kernel."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def free_ports(n: int) -> list[int]:
    ports: set[int] = set()
    while len(ports) < n:
        ports.add(free_port())
    return sorted(ports)


def listening_ports() -> set[int]:
    """TCP ports in LISTEN state on this machine (IPv4 and IPv6), read from /proc."""
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as fh:
            next(fh, None)
            for line in fh:
                parts = line.split()
                if len(parts) > 3 and parts[3] == "0A":  # TCP_LISTEN
                    ports.add(int(parts[1].rsplit(":", 1)[1], 16))
    return ports


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie is dead for our purposes
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return any(pid_alive(p) for p in _pids_in_group(pgid))


def _pids_in_group(pgid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().split(")")[-1].split()
            if int(fields[2]) == pgid:
                pids.append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    return pids


@dataclass
class Proc:
    """One started component: its own process group, log file and ports."""

    name: str
    pid: int
    log: str
    ports: list[int]
    argv: list[str]

    def alive(self) -> bool:
        return group_alive(self.pid) and self.ours()

    def ours(self) -> bool:
        """Whether the process group `pid` is still the one started as `argv`. PIDs are
        reused (32,768 of them here, wrapped within an hour of tests): a state file left by
        a killed session names pids that may since lead some other process group, and
        signalling that group killed a later test run (make: Terminated). A group whose
        leader is gone (or a zombie) holds only what the leader started: ours."""
        try:
            cmdline = Path(f"/proc/{self.pid}/cmdline").read_bytes()
        except OSError:
            return True
        if not cmdline or not self.argv:  # a zombie leader; a state written before argv
            return True
        return cmdline.rstrip(b"\0").split(b"\0") == [a.encode() for a in self.argv]

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "pid": self.pid,
            "log": self.log,
            "ports": self.ports,
            "argv": self.argv,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> Proc:
        return cls(
            name=str(d["name"]),
            pid=int(str(d["pid"])),
            log=str(d["log"]),
            ports=[int(p) for p in d.get("ports", [])],  # type: ignore[attr-defined]
            argv=[str(a) for a in d.get("argv", [])],  # type: ignore[attr-defined]
        )


def start(
    name: str,
    argv: list[str],
    log_dir: Path,
    ports: Iterable[int] = (),
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Proc:
    """Start ``argv`` in a new session (its own process group), output appended to a log."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{name}.log"
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    with open(log, "ab") as fh:
        fh.write(f"--- {time.strftime('%H:%M:%S')} {' '.join(argv)}\n".encode())
        fh.flush()
        popen = subprocess.Popen(
            argv,
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=full_env,
            cwd=cwd,
        )
    _CHILDREN[popen.pid] = popen
    return Proc(name=name, pid=popen.pid, log=str(log), ports=list(ports), argv=argv)


def tail(path: str | Path, n: int = 30) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


class StartupError(RuntimeError):
    pass


def wait_for(
    what: str,
    check: Callable[[], bool],
    timeout: float,
    *,
    proc: Proc | None = None,
    interval: float = 0.2,
) -> None:
    """Poll ``check`` until it is true; fail early (with the log) if ``proc`` dies."""
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while time.monotonic() < deadline:
        _reap()
        if proc is not None and not pid_alive(proc.pid):
            raise StartupError(
                f"{proc.name} exited while waiting for {what}; log {proc.log}:\n{tail(proc.log)}"
            )
        try:
            if check():
                return
        except Exception as exc:
            last_exc = exc
        time.sleep(interval)
    detail = f" (last error: {last_exc!r})" if last_exc else ""
    log = f"\nlog {proc.log}:\n{tail(proc.log)}" if proc else ""
    raise StartupError(f"timed out after {timeout:.0f}s waiting for {what}{detail}{log}")


def port_open(port: int, host: str = LOOPBACK) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def stop(procs: Iterable[Proc], timeout: float = 15.0) -> None:
    """SIGTERM each process group, then SIGKILL what is left after ``timeout``."""
    procs = [p for p in procs if p.ours()]  # a reused pid is some other process's now
    for p in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(p.alive() for p in procs):
        _reap()
        time.sleep(0.1)
    for p in procs:
        if p.alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(p.alive() for p in procs):
        _reap()
        time.sleep(0.1)


_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def _reap() -> None:
    """Collect exited children this process started so they do not linger as zombies."""
    for pid, popen in list(_CHILDREN.items()):
        if popen.poll() is not None:
            del _CHILDREN[pid]


def leftovers(procs: Iterable[Proc]) -> list[str]:
    """What teardown left behind: live processes and still-listening ports (empty when clean)."""
    procs = list(procs)
    problems = [f"{p.name} (pgid {p.pid}) still running" for p in procs if p.alive()]
    listening = listening_ports()
    problems += [
        f"port {port} of {p.name} still listening"
        for p in procs
        for port in p.ports
        if port in listening
    ]
    return problems
