"""A warm standby interpreter for restarts in place (issue 15): the next generation's Python
process, started ahead of time, with its heavy modules (``torch``) already imported.

A trainer's own start is most of a restart in place: a new interpreter imports torch (3-6 s
of CPU, more when every rank of a node starts at once) before it rendezvouses and restores.
With ``rtj-shim supervise --preload torch,...`` the supervisor keeps one standby process
per pod, ``python [FLAGS] -m rtj_shim.agent.preload --modules torch,... --ready-fd N -- TARGET...``,
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

**Fork server** (``--fork``; what the supervisor uses first): a standby used once costs a
whole import per generation, paid by every pod while the previous generation trains (on a
node whose cores the trainers use, that CPU is theirs). A fork server imports once per pod
and stays: for each start it reads the line, forks a child that forks the trainer and exits
at once, and writes the trainer's pid as a line on fd N. The trainer, orphaned, is
reparented to the supervisor (its subreaper, ``PR_SET_CHILD_SUBREAPER``), so the supervisor
waits for it, signals its session and reaps it as if it had started it
(`rtj_shim.agent.warm.ForkedTrainer`).
The trainer starts a session of its own, reads nothing (stdin is ``/dev/null``), takes the
environment and runs the target as a standby does. Forking is safe only while the server
started no GPU context and no thread of its own: it imports and waits, nothing else (torch's
and NumPy's imports are fork-safe, as every ``DataLoader`` worker forked after them is); a
server that finds CUDA initialized (a preloaded module did it) refuses (pid ``0``) and the
supervisor falls back to a standby per generation. This is PyTorch's forkserver preloading
(``set_forkserver_preload``) with the supervisor, not multiprocessing, as the parent.

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
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

PYTHON = re.compile(r"python(\d+(\.\d+)?)?")
FLAGS_WITH_VALUE = ("-W", "-X", "--check-hash-based-pycs")  # take the next word unless joined
MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
EXIT_IMPORT_FAILED = 2
READY = b"r"


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
    fork = len(args) > 4 and args[4] == "--fork"
    if fork:
        del args[4]
    if len(args) < 6 or (args[0], args[2], args[4]) != ("--modules", "--ready-fd", "--"):
        sys.stderr.write("usage: python -m rtj_shim.agent.preload --modules A,B --ready-fd N "
                         "[--fork] -- TARGET...\n")  # fmt: skip
        return EXIT_IMPORT_FAILED
    modules, ready, target = parse_modules(args[1]), int(args[3]), args[5:]
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # any import error: the generation starts cold
            sys.stderr.write(f"rtj-shim preload: importing {name} failed: {exc!r}\n")
            return EXIT_IMPORT_FAILED
    os.write(ready, READY)
    if fork:
        if not _serve(ready):
            return 0  # the supervisor closed our stdin: the pod ends or gave us up
    else:
        os.close(ready)
        line = sys.stdin.buffer.readline()
        if not line:
            return 0  # dropped unused
        try:
            env = _environment(line)
        except ValueError as exc:
            sys.stderr.write(f"rtj-shim preload: {exc}\n")
            return EXIT_IMPORT_FAILED
        _become_command(env)
    _run(target)
    return 0


def _become_command(env: Mapping[str, str]) -> None:
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # the command's stdin: nothing, as the supervisor gives a cold one
    os.close(devnull)
    os.environ.clear()
    os.environ.update(env)


def _serve(reply: int) -> bool:
    """The fork server's loop: one trainer per line read. Returns False when stdin closes
    (the server exits), True in a forked trainer (which then runs the target)."""
    while line := sys.stdin.buffer.readline():
        try:
            env = _environment(line)
        except ValueError as exc:
            sys.stderr.write(f"rtj-shim preload: {exc}\n")
            os.write(reply, b"0\n")
            continue
        refused = fork_refusal()
        if refused is not None:
            sys.stderr.write(f"rtj-shim preload: not forking: {refused}\n")
            os.write(reply, b"0\n")
            continue
        pid = _fork_trainer()
        if pid == 0:  # the trainer
            os.close(reply)
            os.setsid()
            _become_command(env)
            return True
        os.write(reply, f"{max(pid, 0)}\n".encode())
    return False


def fork_refusal(fd_dir: str = "/proc/self/fd") -> str | None:
    """Why this process must not fork a trainer (None: it may): a CUDA context a child
    could not use (a preloaded module initialized it, through torch or otherwise: any
    NVIDIA device file open here)."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_initialized():
        return "CUDA is initialized in the fork server (a forked child cannot use it)"
    devices = gpu_devices_open(fd_dir)
    if devices:
        return (f"the fork server has {', '.join(devices)} open (a GPU context a forked "
                "child cannot use)")  # fmt: skip
    return None


def gpu_devices_open(fd_dir: str) -> list[str]:
    """The NVIDIA device files among this process's open file descriptors (``/dev/nvidia*``:
    what the CUDA driver opens for a context)."""
    found: set[str] = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(fd_dir):
            with contextlib.suppress(OSError):
                target = os.readlink(os.path.join(fd_dir, fd))
                if target.startswith("/dev/nvidia"):
                    found.add(target)
    return sorted(found)


def _fork_trainer() -> int:
    """Fork twice: 0 in the trainer; in the server, the trainer's pid once the middle
    process exited (the trainer is then the supervisor's child), or -1 if a fork failed."""
    sys.stdout.flush()  # nothing buffered is written twice
    sys.stderr.flush()
    r, w = os.pipe()
    try:
        middle = os.fork()
    except OSError:
        os.close(r)
        os.close(w)
        return -1
    if middle == 0:  # the middle process: fork the trainer, say its pid, exit
        trainer = -1
        try:
            os.close(r)
            trainer = os.fork()
            if trainer == 0:
                os.close(w)
                return 0
            os.write(w, f"{trainer}".encode())
        finally:
            if trainer != 0:
                os._exit(0)
    os.close(w)
    said = b""
    while chunk := os.read(r, 64):  # until the middle process exits
        said += chunk
    os.close(r)
    os.waitpid(middle, 0)
    try:
        return int(said)
    except ValueError:
        return -1


if __name__ == "__main__":
    sys.exit(main())
