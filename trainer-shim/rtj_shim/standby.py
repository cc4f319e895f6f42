"""The supervisor's warm standby (``rtj-shim supervise --preload``): at most one
`rtj_shim.preload.Standby` per pod, started ahead of the next generation, handed the
generation's environment when it starts, and given up on for good once one fails.

The supervisor says *when* a standby is wanted (its generation's state); the keeper owns
the process: starting it, noticing that it is ready or that it ended, handing it over,
dropping it. A failure of any kind (the interpreter cannot start, an import fails, the
process ends before it is used) makes every later generation start cold, with one line
saying so: a standby that failed once would fail again.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping, Sequence

from rtj_shim import preload

READINESS = {None: "importing", True: "ready", False: "failed"}
"""The report's word for a standby's `preload.Standby.ready`."""


class StandbyKeeper:
    """One warm standby at a time for ``argv``, importing ``modules`` first."""

    def __init__(
        self,
        argv: Sequence[str],
        modules: Sequence[str],
        env: Mapping[str, str],
        say: Callable[[str], None],
    ) -> None:
        self.modules = tuple(modules)
        self.env = dict(env)
        self._say = say
        self.command = preload.split_command(argv) if self.modules else None
        self.standby: preload.Standby | None = None
        if self.modules and self.command is None:
            say(f"--preload: {argv[0]} is not a Python interpreter; every generation starts cold")

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        """The waiting standby's process (not yet the command's), if any."""
        return self.standby.proc if self.standby is not None else None

    def report(self) -> str | None:
        """``importing``, ``ready``, or None when no standby waits."""
        return None if self.standby is None else READINESS[self.standby.ready]

    def take(self, env: Mapping[str, str]) -> subprocess.Popen[bytes] | None:
        """The command started in the standby with ``env`` (waiting for its imports if it is
        still importing; one is started now if none waits), or None: start it cold."""
        if self.command is None:
            return None
        try:
            standby = self.standby or preload.Standby(self.command, self.modules, self.env)
        except OSError as exc:
            self._give_up(f"no warm standby ({exc}): starting cold")
            return None
        self.standby = None
        child = standby.hand_over(env)
        if child is None:
            standby.drop()
            self._give_up(f"the warm standby ended ({standby.proc.returncode}) before it was "
                          "ready: starting cold, and the later generations too")  # fmt: skip
        return child

    def keep(self, wanted: bool) -> bool:
        """Check the waiting standby, or start one when ``wanted`` and none waits. Whether
        the report changed (one started, turned ready, or was given up on)."""
        if self.command is None:
            return False
        if self.standby is not None:
            was = self.standby.ready
            if self.standby.alive() and self.standby.check() is not False:
                return self.standby.ready != was
            self.standby.drop()  # its pipes closed, the process reaped
            self._give_up(f"the warm standby ended ({self.standby.proc.returncode}) before it "
                          "was used: later generations start cold")  # fmt: skip
            return True
        if not wanted:
            return False
        try:
            self.standby = preload.Standby(self.command, self.modules, self.env)
        except OSError as exc:  # the interpreter cannot be started: nor can a cold start
            self._give_up(f"no warm standby ({exc}): later generations start cold")
        return True

    def drop(self) -> None:
        """End the waiting standby, if any (a stop spares it; the pod's end does not)."""
        if self.standby is not None:
            self.standby.drop()
            self.standby = None

    def _give_up(self, line: str) -> None:
        self.standby, self.command = None, None
        self._say(line)
