"""The supervisor's handles on its warm interpreters (`rtj_shim.agent.preload` runs inside them):
a `ForkServer`, started once per pod and asked for each generation's trainer, which it
forks (`ForkedTrainer`, the supervisor's child once reparented to it), and a `Standby`,
started ahead of one generation and handed its environment, after which the process is the
trainer. Both import the modules first and say so with one byte on a pipe of their own; the
environment crosses their stdin as one JSON line.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import time
from collections.abc import Mapping, Sequence

from rtj_shim.agent.preload import READY, PythonCommand

READY_WAIT_SECONDS = 300.0  # a warm interpreter still importing after this is taken for hung
FORK_WAIT_SECONDS = 30.0  # a fork server that has not said a forked trainer's pid by then


class WarmInterpreter:
    """``python [FLAGS] -m rtj_shim.agent.preload --modules M --ready-fd N [--fork] -- TARGET``."""

    FORK = False

    def __init__(self, command: PythonCommand, modules: Sequence[str], env: Mapping[str, str]):
        self._reply, reply = os.pipe()
        argv = [command.interpreter, *command.flags, "-m", "rtj_shim.agent.preload", "--modules",
                ",".join(modules), "--ready-fd", str(reply), *(["--fork"] if self.FORK else []),
                "--", *command.target]  # fmt: skip
        self.ready: bool | None = None  # None: importing; False: it ended before it was ready
        self._buffer = b""
        try:
            self.proc: subprocess.Popen[bytes] = subprocess.Popen(
                argv, env=dict(env), stdin=subprocess.PIPE, start_new_session=True,
                pass_fds=(reply,),
            )  # fmt: skip
        finally:
            os.close(reply)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.returncode is None and self.proc.poll() is None

    def check(self, timeout: float = 0.0) -> bool | None:
        """Whether its modules are imported, waiting up to ``timeout`` seconds: True, False
        (it ended first), None (still importing)."""
        if self.ready is None:
            word = self._read(1, timeout)
            if word is not None:
                self.ready = word == READY
        return self.ready

    def _send(self, env: Mapping[str, str], *, last: bool) -> bool:
        """The generation's environment, once the imports are done (``last``: and no more
        orders: stdin closed). False when it failed or is gone."""
        stdin = self.proc.stdin
        if stdin is None or self.check(READY_WAIT_SECONDS) is not True or not self.alive():
            return False
        try:
            stdin.write(json.dumps({"env": dict(env)}).encode() + b"\n")
            stdin.close() if last else stdin.flush()
        except (BrokenPipeError, OSError):
            return False
        return True

    def _close_reply(self) -> None:
        if self._reply >= 0:
            os.close(self._reply)
            self._reply = -1

    def drop(self) -> None:
        """End it (its stdin closed: it exits by itself; killed if not)."""
        self._close_reply()
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired, ChildProcessError):
            self.proc.wait(2)
        if self.alive():
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired, ChildProcessError):
            self.proc.wait(5)

    def _read(self, size: int, timeout: float) -> bytes | None:
        """``size`` bytes from its pipe within ``timeout`` (None: not yet; b"": it closed)."""
        deadline = time.monotonic() + timeout
        while len(self._buffer) < size:
            if self._reply < 0:
                return b""
            left = max(0.0, deadline - time.monotonic())
            readable, _, _ = select.select([self._reply], [], [], left)
            if not readable:
                return None
            chunk = os.read(self._reply, 64)
            if not chunk:
                return b""
            self._buffer += chunk
        out, self._buffer = self._buffer[:size], self._buffer[size:]
        return out


class Standby(WarmInterpreter):
    """One generation's process, started ahead of it, then handed its environment."""

    def hand_over(self, env: Mapping[str, str]) -> subprocess.Popen[bytes] | None:
        """Give the standby the command's environment once its imports are done: the process
        is the command from now on. None when the standby failed or is gone (the caller
        starts the command cold)."""
        if not self._send(env, last=True):
            return None
        self._close_reply()  # it said it is ready; nothing more comes on the pipe
        return self.proc


class ForkServer(WarmInterpreter):
    """The pod's fork server: started once, then asked for each generation's trainer."""

    FORK = True

    def fork(self, env: Mapping[str, str]) -> ForkedTrainer | None:
        """A trainer forked with ``env`` (waiting for the imports if still importing), or
        None: the server refused or is gone (the caller gives it up)."""
        if not self._send(env, last=False):
            return None
        line = b""
        while not line.endswith(b"\n"):
            char = self._read(1, FORK_WAIT_SECONDS)
            if not char:
                return None
            line += char
        try:
            pid = int(line)
        except ValueError:
            return None
        return ForkedTrainer(pid) if pid > 0 else None


class ForkedTrainer:
    """A trainer the fork server forked, now the supervisor's child (reparented to it, the
    subreaper): what the supervisor uses of a ``Popen``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None  # as Popen's: negative for a signal

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:  # reaped by the supervisor's orphan reaping (which sets
            if not _exists(self.pid):  # returncode), or not our child: gone, code unknown
                self.returncode = 1
            return self.returncode
        if pid:
            self.returncode = exit_code(status)
        return self.returncode

    def wait(self) -> int:
        while (code := self.poll()) is None:
            time.sleep(0.02)
        return code


def exit_code(status: int) -> int:
    """A wait status as ``Popen.returncode`` has it (negative: the signal)."""
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
