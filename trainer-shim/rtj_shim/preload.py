"""A warm standby interpreter for restarts in place (issue 15): the next generation's Python
process, started ahead of time, with its heavy modules (``torch``) already imported.

A trainer's own start is most of a restart in place: a new interpreter imports torch (3-6 s
of CPU, more when every rank of a node starts at once) before it rendezvouses and restores.
With ``rtj-shim supervise --preload torch,...`` the supervisor keeps one standby process
per pod, ``python [FLAGS] -m rtj_shim.preload --modules torch,... --ready-fd N -- TARGET...``,
which imports the modules, says so on a pipe of its own (fd N), then blocks reading one line
from its stdin. A start (the pod's first, or an ordered ``run``) waits for that word (a
standby still importing is still ahead of a cold start) and writes the line,
``{"env": {...}}``: the environment the
command would have been started with (rank, attempt, resume file). The standby replaces its
environment with it and runs the target as the interpreter would have (``SCRIPT ARGS``,
``-m MODULE ARGS`` or ``-c CODE ARGS``), as ``__main__``, in the same process: the command
with its imports done. Its pid, session and exit code are the command's.

Only a Python interpreter's command can be preloaded (``python``, ``python3``,
``python3.11`` ..., by path or not); anything else (``torchrun``, a shell) starts cold as
before, and the supervisor says so once. PyTorch's own forkserver preloading
(``set_forkserver_preload``) is the same idea for multiprocessing.

The environment travels as JSON over a pipe only the supervisor holds: no pickle, nothing
from outside the pod. A module that fails to import ends the standby with 2 and a message
before it is ready; the supervisor then starts that generation cold, and the later ones.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import re
import runpy
import select
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

PYTHON = re.compile(r"python(\d+(\.\d+)?)?")
FLAGS_WITH_VALUE = ("-W", "-X", "--check-hash-based-pycs")  # take the next word unless joined
MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
EXIT_IMPORT_FAILED = 2
READY = b"r"
READY_WAIT_SECONDS = 300.0  # a standby still importing after this is taken for hung


@dataclass(frozen=True)
class PythonCommand:
    """``python FLAGS TARGET``: the interpreter, its own options, and what it runs
    (``("script.py", args...)``, ``("-m", "module", args...)`` or ``("-c", code, args...)``)."""

    interpreter: str
    flags: tuple[str, ...]
    target: tuple[str, ...]


def split_command(argv: Sequence[str]) -> PythonCommand | None:
    """The command as a Python interpreter's, or None: not one a standby can run (not a
    Python interpreter, reads its program from stdin, or an option it cannot place)."""
    if not argv or not PYTHON.fullmatch(os.path.basename(argv[0])):
        return None
    flags: list[str] = []
    i = 1
    while i < len(argv):
        word = argv[i]
        if word in ("-m", "-c"):
            return (
                PythonCommand(argv[0], tuple(flags), tuple(argv[i:])) if i + 1 < len(argv) else None
            )
        if word in ("-", "--") or (word.startswith("--") and word not in FLAGS_WITH_VALUE):
            return None  # stdin as the program, or a long option we do not know
        if not word.startswith("-"):
            return PythonCommand(argv[0], tuple(flags), tuple(argv[i:]))
        if word.startswith(("-m", "-c")):  # -mmodule, -ccode: joined
            return PythonCommand(argv[0], tuple(flags), (word[:2], word[2:], *argv[i + 1 :]))
        flags.append(word)
        if word in FLAGS_WITH_VALUE:
            if i + 1 >= len(argv):
                return None
            flags.append(argv[i + 1])
            i += 1
        i += 1
    return None


def parse_modules(text: str) -> tuple[str, ...]:
    """``torch,rtj_shim.torch`` -> the module names; ValueError naming a bad one."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    for name in names:
        if not MODULE_NAME.fullmatch(name):
            raise ValueError(f"--preload: {name!r} is not a module name (expected a.b.c)")
    return names


class Standby:
    """The supervisor's side: one standby process, started, then handed the environment."""

    def __init__(self, command: PythonCommand, modules: Sequence[str], env: Mapping[str, str]):
        self._ready, ready = os.pipe()
        argv = [command.interpreter, *command.flags, "-m", __name__, "--modules",
                ",".join(modules), "--ready-fd", str(ready), "--", *command.target]  # fmt: skip
        self.ready: bool | None = None  # None: importing; False: it ended before it was ready
        try:
            self.proc: subprocess.Popen[bytes] = subprocess.Popen(
                argv, env=dict(env), stdin=subprocess.PIPE, start_new_session=True,
                pass_fds=(ready,),
            )  # fmt: skip
        finally:
            os.close(ready)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.returncode is None and self.proc.poll() is None

    def check(self, timeout: float = 0.0) -> bool | None:
        """Whether its modules are imported, waiting up to ``timeout`` seconds: True, False
        (it ended first), None (still importing)."""
        if self.ready is not None:
            return self.ready
        readable, _, _ = select.select([self._ready], [], [], timeout)
        if not readable:
            return None
        self.ready = os.read(self._ready, 1) == READY
        os.close(self._ready)
        self._ready = -1
        return self.ready

    def hand_over(self, env: Mapping[str, str]) -> subprocess.Popen[bytes] | None:
        """Give the standby the command's environment once its imports are done: the process
        is the command from now on. None when the standby failed or is gone (the caller
        starts the command cold)."""
        stdin = self.proc.stdin
        if stdin is None or self.check(READY_WAIT_SECONDS) is not True or not self.alive():
            return None
        try:
            stdin.write(json.dumps({"env": dict(env)}).encode() + b"\n")
            stdin.close()
        except (BrokenPipeError, OSError):
            return None
        return self.proc

    def drop(self) -> None:
        """End an unused standby (its stdin closed: it exits by itself; killed if not)."""
        if self._ready >= 0:
            os.close(self._ready)
            self._ready = -1
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        if self.alive():
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired, ChildProcessError):
            self.proc.wait(5)


def _environment(line: bytes) -> dict[str, str]:
    body = json.loads(line)
    env = body.get("env") if isinstance(body, dict) else None
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise ValueError('expected {"env": {name: value, ...}}')
    return env


def _run(target: Sequence[str]) -> None:
    """Run the target as ``python TARGET`` would, in this process, as ``__main__``."""
    if target[0] == "-m":
        sys.argv = [target[1], *target[2:]]  # run_module sets argv[0] to the file
        runpy.run_module(target[1], run_name="__main__", alter_sys=True)
    elif target[0] == "-c":
        sys.argv = ["-c", *target[2:]]
        exec(compile(target[1], "<string>", "exec"), {"__name__": "__main__"})  # noqa: S102
    else:
        script = os.path.abspath(target[0])
        sys.argv = list(target)
        sys.path[0] = os.path.dirname(script)  # as the interpreter sets it for a script
        runpy.run_path(script, run_name="__main__")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 6 or (args[0], args[2], args[4]) != ("--modules", "--ready-fd", "--"):
        sys.stderr.write("usage: python -m rtj_shim.preload --modules A,B --ready-fd N -- "
                         "TARGET...\n")  # fmt: skip
        return EXIT_IMPORT_FAILED
    modules, ready, target = parse_modules(args[1]), int(args[3]), args[5:]
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # any import error: the generation starts cold
            sys.stderr.write(f"rtj-shim preload: importing {name} failed: {exc!r}\n")
            return EXIT_IMPORT_FAILED
    os.write(ready, READY)
    os.close(ready)
    line = sys.stdin.buffer.readline()
    if not line:
        return 0  # dropped unused
    try:
        env = _environment(line)
    except ValueError as exc:
        sys.stderr.write(f"rtj-shim preload: {exc}\n")
        return EXIT_IMPORT_FAILED
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # the command's stdin: nothing, as the supervisor gives a cold one
    os.close(devnull)
    os.environ.clear()
    os.environ.update(env)
    _run(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
