"""The supervisor's warm interpreters (``rtj-shim supervise --preload``): a fork server per
pod (`rtj_shim.agent.warm.ForkServer`), which imports once and forks every generation's
trainer, and, when it cannot be used, a `rtj_shim.agent.warm.Standby` per generation, started
ahead of it and handed its environment; given up on for good once that fails too.

The supervisor says *when* a warm interpreter is wanted (its generation's state); the
keeper owns the process: starting it, noticing that it is ready or that it ended, taking a
trainer from it, dropping it. A fork server that ends or refuses to fork (a preloaded
module initialized CUDA) leaves the next generations to per-generation standbys, with one
line saying so; a standby that fails makes every later generation start cold, with one
line: a warm interpreter that failed once would fail again.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from rtj_shim.agent import preload
from rtj_shim.agent.warm import ForkServer, Standby

READINESS = {None: "importing", True: "ready", False: "failed"}
"""The report's word for a warm interpreter's readiness (`Standby.ready`)."""


class Trainer(Protocol):
    """What the supervisor uses of its trainer's process (a ``Popen`` or a
    `rtj_shim.agent.warm.ForkedTrainer`)."""

    @property
    def pid(self) -> int: ...

    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self) -> int: ...


class StandbyKeeper:
    """The warm interpreter for ``argv``, importing ``modules`` first: a fork server, or one
    standby at a time."""

    def __init__(
        self,
        argv: Sequence[str],
        modules: Sequence[str],
        env: Mapping[str, str],
        say: Callable[[str], None],
        *,
        fork: bool = True,
        sweep: Callable[[], None] = lambda: None,
    ) -> None:
        self.modules = tuple(modules)
        self.env = dict(env)
        self._say = say
        self._sweep = sweep  # ends every process below the supervisor (a stray trainer)
        self.command = preload.split_command(argv) if self.modules else None
        self.forking = fork  # the fork server first; per-generation standbys once it failed
        self.standby: Standby | ForkServer | None = None
        if self.modules and self.command is None:
            say(f"--preload: {argv[0]} is not a Python interpreter; every generation starts cold")

    @property
    def source(self) -> str:
        """Where the next trainer comes from, in words."""
        return "from the pod's fork server" if self.forking else "from its warm standby"

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        """The warm interpreter's process while it is not a trainer (the fork server always)."""
        return self.standby.proc if self.standby is not None else None

    def report(self) -> str | None:
        """``importing``, ``ready``, or None when no warm interpreter waits."""
        return None if self.standby is None else READINESS[self.standby.ready]

    def take(self, env: Mapping[str, str]) -> Trainer | None:
        """The command started warm with ``env`` (forked from the server, or in the standby:
        waiting for its imports if they are still running; started now if none waits), or
        None: start it cold."""
        if self.command is None:
            return None
        if self.forking:
            trainer = self._fork(env)
            if trainer is not None or self.command is None:
                return trainer
        try:
            standby = self.standby or Standby(self.command, self.modules, self.env)
        except OSError as exc:
            self._give_up(f"no warm standby ({exc}): starting cold")
            return None
        assert isinstance(standby, Standby)
        self.standby = None
        child = standby.hand_over(env)
        if child is None:
            standby.drop()
            self._give_up(f"the warm standby ended ({standby.proc.returncode}) before it was "
                          "ready: starting cold, and the later generations too")  # fmt: skip
        return child

    def _fork(self, env: Mapping[str, str]) -> Trainer | None:
        assert self.command is not None
        try:
            server = self.standby or ForkServer(self.command, self.modules, self.env)
        except OSError as exc:  # the interpreter cannot be started: nor can a cold start
            self._give_up(f"no fork server ({exc}): starting cold")
            return None
        assert isinstance(server, ForkServer)
        self.standby = server
        trainer = server.fork(env)
        if trainer is None and server.ready is not True:  # its imports failed: a standby's
            server.drop()  # would too
            self._give_up(f"the fork server ended ({server.proc.returncode}) before it was "
                          "ready: starting cold, and the later generations too")  # fmt: skip
        elif trainer is None:
            # the server may have forked the trainer before it failed to say its pid: that
            # trainer is then a process below the supervisor it does not know, which must not
            # train beside the standby's (nothing else runs below it at a start)
            self._fall_back(server, "could not fork the trainer")
            self._sweep()
        return trainer

    def no_fork(self, why: str) -> None:
        """Use a standby per generation from now on (before any fork server started)."""
        if self.forking and self.command is not None:
            self.forking = False
            self._say(f"no fork server: {why}; each generation starts from a standby of its own")

    def keep(self, wanted: bool) -> bool:
        """Check the warm interpreter, or start one when ``wanted`` and none waits. Whether
        the report changed (one started, turned ready, or was given up on)."""
        if self.command is None:
            return False
        if self.standby is not None:
            was = self.standby.ready
            if self.standby.alive() and self.standby.check() is not False:
                return self.standby.ready != was
            if isinstance(self.standby, ForkServer) and self.standby.ready:
                self._fall_back(self.standby, "ended")
                return True
            what = "fork server" if self.forking else "warm standby"
            self.standby.drop()  # its pipes closed, the process reaped
            self._give_up(f"the {what} ended ({self.standby.proc.returncode}) before it "
                          "was used: later generations start cold")  # fmt: skip
            return True
        if not wanted:
            return False
        try:
            self.standby = (ForkServer if self.forking else Standby)(
                self.command, self.modules, self.env
            )
        except OSError as exc:  # the interpreter cannot be started: nor can a cold start
            self._give_up(f"no warm standby ({exc}): later generations start cold")
        return True

    def drop(self) -> None:
        """End the warm interpreter, if any (a stop spares it; the pod's end does not)."""
        if self.standby is not None:
            self.standby.drop()
            self.standby = None

    def _fall_back(self, server: ForkServer, why: str) -> None:
        server.drop()
        self.standby, self.forking = None, False
        self._say(f"the fork server {why} ({server.proc.returncode}): each later generation "
                  "starts from a standby of its own")  # fmt: skip

    def _give_up(self, line: str) -> None:
        self.standby, self.command = None, None
        self._say(line)
