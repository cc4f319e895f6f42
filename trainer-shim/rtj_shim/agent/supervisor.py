"""``rtj-shim supervise -- CMD ...``: the trainer's command as a child that can be stopped
and started again inside the same pod when the operator orders it (in-place restart,
issue 15). Orders and reports travel through the pod's control directory (`rtj_shim.wire.control`);
between its looks at the order (every ``POLL_SECONDS``) it waits on the directory's doorbell
(`rtj_shim.agent.doorbell`), which the sidecar rings once it has written an order: an order is
carried out as soon as it arrives, not up to a poll period later.

- Generation 0 starts at once, with the pod's environment as it is.
- ``stop`` (generation g): SIGTERM to the command's process group and every descendant,
  SIGKILL after ``stop_grace`` seconds (short: a world that lost a rank or hung cannot make
  a consistent emergency save; the pod's own termination keeps the full ``grace``), or
  after the order's ``save_seconds`` (a healthy world stopped to grow back: its trainers
  save at their next step boundary and exit), then wait until *no* descendant is left. The
  supervisor is the children's subreaper (``PR_SET_CHILD_SUBREAPER``), so torchrun's
  workers, which run in sessions of their own, are its descendants even after torchrun is
  gone: "stopped" is reported only once the old world of this pod is provably gone.
- ``run`` (generation g, attempt a, step s): only once stopped for g. The command starts
  again with ``RTJ_ATTEMPT=a`` (its checkpoints claim the run as attempt a, so a zombie of
  an older attempt can never publish), ``RTJ_RESTART_GENERATION=g`` and ``RTJ_RESUME_FILE``
  pointing at a resume file naming step s (verified deeply by the restoring trainer; with
  no step, at no file: the trainer resolves the newest verified step itself). With
  ``fast_step`` the file names it too (and ``fast_lineage``, the history it is pinned in):
  the trainer resumes from its fast tier when every rank verifies that step there, in
  that lineage.
- ``stopped`` reports the fast-tier steps every rank directory of the pod holds
  (``fast_steps``, from ``RTJ_FAST_TIER_DIR``), read once the old world is gone and nothing
  writes them any more: the operator pins the newest step every pod holds.
- The command exits 0: training is over, the supervisor exits 0. It fails: the supervisor
  reports ``exited`` with the code and waits up to ``order_deadline`` seconds for an order;
  without one it exits with the command's code, and the pod fails as it would without a
  supervisor (the operator's whole-world path).
- SIGTERM to the supervisor (the pod is deleted): passed on; it exits with the command's code.
- A *replacement* pod (``RTJ_INDEX_FAILURES`` > 0: the Job controller's count of earlier
  failures of this pod's index, ``batch.kubernetes.io/job-index-failure-count``, through the
  downward API) starts *held*: generation 0, ``stopped``, the command not started. The
  operator replaced a broken pod while the others restart in place, and only its ``run``
  order, after the barrier, starts it with the rest. Held past ``order_deadline`` with no
  order at all, it exits 1 (the index fails; the operator re-creates the world); once an
  order reached it, the operator knows it is there, and it waits (a pod whose rank a spare
  took is an idle spare itself, held by the current generation's stop order).
- A *warm spare* (``RTJ_SPARE=1``) starts held too, and waits for as long as it takes: its
  first ``run`` order names the rank it takes (``rank``) and, when rank 0 moved, the new
  rendezvous host (``master_addr``). They replace the pod's own ``RANK``, ``NODE_RANK``,
  ``PET_NODE_RANK`` and ``MASTER_ADDR``, ``PET_MASTER_ADDR`` for this and every later
  generation (a pod keeps the rank it was given until an order names another), and the
  report says which rank the pod runs as. Any ``run`` order may name a ``world_size`` (an
  elastic shrink or grow-back, with the ranks renumbered): it replaces ``WORLD_SIZE``,
  ``NNODES`` and ``PET_NNODES`` the same way. ``finish`` ends an idle pod with 0 once the
  world's trainers finished (its Job completes, and with it the JobSet).
- Generation g > 0 writes checkpoints as attempt ``a.g`` (``RTJ_ATTEMPT``): a rank of an
  earlier generation still running on a lost node (a zombie) is older than ``a.g`` and may
  not publish (`rtj_shim.checkpoint.protocol.check_ownership`).

- With ``preload`` (``--preload torch,...``) every start goes through a warm interpreter
  (`rtj_shim.agent.preload`, kept by `rtj_shim.agent.standby`) whose modules were imported ahead of
  the order: the pod's fork server, which imports once and forks each generation's trainer (the
  trainer is reparented to us, its subreaper, and reaped here like a child we started);
  if the server cannot fork, a standby per generation, the next one started once a
  generation's trainer has written its progress record (its own imports are done) or has
  run ``STANDBY_AFTER_SECONDS``, at once while the command is not running. A command that
  is not a Python interpreter's starts cold. The report's ``preloaded`` says which it was,
  and ``standby`` whether the warm interpreter is ``importing`` or ``ready``.

`next_action` is the pure decision; `Supervisor` is the I/O around it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from rtj_shim.agent import trainers_files
from rtj_shim.agent.doorbell import Doorbell
from rtj_shim.agent.standby import StandbyKeeper, Trainer
from rtj_shim.agent.warm import exit_code
from rtj_shim.checkpoint.lineage import Held
from rtj_shim.fast import fast_tier
from rtj_shim.progress import ENV_DIR
from rtj_shim.wire.control import (
    ORDER_FILE,
    STATE_FILE,
    Order,
    OrderError,
    read_json,
    write_json,
    writer_attempt,
)
from rtj_shim.wire.control import parse_order as _parse_order
from rtj_shim.wire.misaligned_resume import MisalignedRanks
from rtj_shim.wire.progress_record import FILE_PREFIX, FILE_SUFFIX
from rtj_shim.wire.rejected_step import RejectedStep
from rtj_shim.wire.resume_file import ResumeFile
from rtj_shim.wire.supervisor_report import SupervisorReport, SupervisorReportError
from rtj_shim.wire.supervisor_report import SupervisorState as State
from rtj_shim.wire.suspect_verdict import SuspectVerdict

PR_SET_CHILD_SUBREAPER = 36
ENV_INDEX_FAILURES = "RTJ_INDEX_FAILURES"
ENV_SPARE = "RTJ_SPARE"
RANK_ENV = ("RANK", "NODE_RANK", "PET_NODE_RANK")
MASTER_ENV = ("MASTER_ADDR", "PET_MASTER_ADDR")
WORLD_ENV = ("WORLD_SIZE", "NNODES", "PET_NNODES")
POLL_SECONDS = 0.1
# a running generation's standby waits for the trainer's progress record, or this long, before
# it imports: it would take CPU from the trainer's own start
STANDBY_AFTER_SECONDS = 10.0


@dataclass(frozen=True)
class Supervised:
    """What the supervisor knows of its command."""

    generation: int
    state: State
    attempt: int | None = None
    exit_code: int | None = None
    fast_steps: tuple[
        int, ...
    ] = ()  # reported with State.STOPPED (rtj_shim.fast.fast_tier.holdings)
    fast_held: tuple[Held, ...] = ()  # the same with their lineages (rtj_shim.fast.fast_tier.held)
    rejected: RejectedStep | None = None  # the pinned step the command's restore refused
    suspect: SuspectVerdict | None = None  # the trainers' verdict on a suspect state
    misaligned: MisalignedRanks | None = None  # the data alignment check's finding


def next_action(current: Supervised, order: Order | None) -> str:
    """``wait``, ``stop``, ``start`` or ``finish`` for the last order read. The barrier
    between stop and run is the operator's (it orders ``run`` only once every pod reported
    ``stopped``); a ``run`` that finds this pod not yet stopped for it stops it first. Only a
    pod whose command is not running (held, idle) finishes on order."""
    if order is None or order.generation < current.generation:
        return "wait"
    if current.state == State.FINISHED:
        return "wait"
    if order.action == "finish":
        return "finish" if current.state == State.STOPPED else "wait"
    stopped_for_it = current.state == State.STOPPED and current.generation == order.generation
    if order.action == "stop":
        return "wait" if stopped_for_it or order.generation == current.generation else "stop"
    if stopped_for_it:
        return "start"
    return "stop" if order.generation > current.generation else "wait"


def carried_out(state: Mapping[str, object], order: Order) -> bool:
    """Whether a supervisor's report (`STATE_FILE`'s body) shows nothing left to do for
    `order` (the progress sidecar's wait for the supervisor to take it)."""
    try:
        report = SupervisorReport.parse(state)
    except SupervisorReportError:
        return False
    current = Supervised(report.generation, report.state, report.attempt)
    return next_action(current, order) == "wait"


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


class Supervisor:
    def __init__(
        self,
        argv: Sequence[str],
        control_dir: Path,
        *,
        grace: float = 10.0,
        stop_grace: float = 3.0,
        order_deadline: float = 60.0,
        env: Mapping[str, str] | None = None,
        preload_modules: Sequence[str] = (),
        preload_fork: bool = True,
    ) -> None:
        if not argv:
            raise OrderError("supervise: expected the trainer's command after --")
        self.argv = list(argv)
        self.dir = control_dir
        self.grace = grace
        self.stop_grace = stop_grace
        self.order_deadline = order_deadline
        self.env = dict(os.environ if env is None else env)
        attempt = self.env.get("RTJ_ATTEMPT", "")
        self.current = Supervised(0, State.STOPPED, int(attempt) if attempt.isdigit() else None)
        self.child: Trainer | None = None
        self._terminated = False
        self._exited_at: float | None = None
        failures = self.env.get(ENV_INDEX_FAILURES, "")
        self.spare = self.env.get(ENV_SPARE) == "1"
        self.held = self.spare or (failures.isdigit() and int(failures) > 0)
        self.assigned: dict[str, str] = {}  # the rank and rendezvous host orders gave it
        self.addressed = self.spare  # an order reached it: the operator knows it is held
        self.standbys = StandbyKeeper(
            self.argv, preload_modules, self.env, self._say, fork=preload_fork,
            sweep=lambda: self._kill_all(0.0),
        )  # fmt: skip
        self.preloaded = False  # the running generation started from a standby
        self.doorbell: Doorbell | None = None  # made in the control directory when it runs
        self._started_at = 0.0

    # --- the loop ------------------------------------------------------------------------
    def run(self) -> int:
        """Supervise until the command finishes or is given up on; the exit code."""
        try:
            return self._supervise()
        finally:
            self.standbys.drop()
            if self.doorbell is not None:
                self.doorbell.close()

    def _supervise(self) -> int:
        self.dir.mkdir(parents=True, exist_ok=True)
        doorbell = self.doorbell = Doorbell(self.dir)
        if not _become_subreaper():  # a forked trainer would be reparented to init, not us
            self.standbys.no_fork("this process cannot be a child subreaper")
        signal.signal(signal.SIGTERM, self._on_sigterm)
        if self.held:
            self._exited_at = time.monotonic()  # the order deadline counts from now
            self._set(self.current)
            count = self.env.get(ENV_INDEX_FAILURES)
            self._say(
                f"a warm spare ({ENV_SPARE}=1): held until a run order gives it a rank"
                if self.spare
                else f"a replacement pod ({ENV_INDEX_FAILURES}={count}): held until ordered"
            )
        else:
            self._start(self.env, self.current.attempt)
        while True:
            if self._terminated:
                return self._stop_for_good()
            self._reap_orphans()
            self._reap_child()
            if self.standbys.keep(self._standby_wanted()):
                self._set(self.current)  # report it importing, ready or given up on
            if self.current.state == State.FINISHED:
                return 0
            order = self._order()
            self.addressed = self.addressed or order is not None
            action = next_action(self.current, order)
            if action == "finish":
                self._set(replace(self.current, state=State.FINISHED, exit_code=0))
                self._say("finished on order: the world's trainers are done")
                return 0
            if action == "stop" and order is not None:
                self._stop(order.generation, order.save_seconds)
                continue  # a run order waits for no poll period to start what it stopped
            if action == "start" and order is not None:
                self._start(self._env_for(order), order.attempt)
            elif self.current.state == State.EXITED and self._given_up():
                return self.current.exit_code or 1
            elif self.held and not self.addressed and self.child is None and self._given_up():
                return 1
            doorbell.wait(POLL_SECONDS)

    def _order(self) -> Order | None:
        body = read_json(self.dir / ORDER_FILE)
        if body is None:
            return None
        try:
            return _parse_order(_encode(body))
        except OrderError as exc:
            self._say(f"ignoring {ORDER_FILE}: {exc}")
            return None

    def _given_up(self) -> bool:
        exited = self._exited_at or time.monotonic()
        if time.monotonic() - exited < self.order_deadline:
            return False
        self._say(f"no restart order within {self.order_deadline:.0f} s of the command's "
                  f"exit ({self.current.exit_code}): exiting with its code")  # fmt: skip
        return True

    # --- transitions -----------------------------------------------------------------------
    def _start(self, env: Mapping[str, str], attempt: int | None) -> None:
        generation = self.current.generation
        child: Trainer | None = self.standbys.take(env)
        self.preloaded = child is not None
        if child is None:
            child = subprocess.Popen(
                self.argv, env=dict(env), stdin=subprocess.DEVNULL, start_new_session=True
            )  # stdin: nothing, as a standby's (a container's has none unless it asks)
        self.child, self._started_at = child, time.monotonic()
        self._set(replace(self.current, state=State.RUNNING, attempt=attempt, exit_code=None,
                          rejected=None, suspect=None))  # fmt: skip
        how = self.standbys.source if self.preloaded else "cold"
        self._say(f"generation {generation}: started {self.argv[0]} {how} (pid {child.pid})")

    # --- the warm standby (rtj_shim.agent.standby) -----------------------------------------------
    def _standby_wanted(self) -> bool:
        """The next generation's standby starts at once while nothing runs; in a running
        generation once its trainer wrote its progress record (its own imports done), or
        ``STANDBY_AFTER_SECONDS`` into it."""
        if self.current.state in (State.FINISHED, State.STOPPING):
            return False
        early = time.monotonic() - self._started_at < STANDBY_AFTER_SECONDS
        return self.current.state != State.RUNNING or not early or self._progress_recorded()

    def _progress_recorded(self) -> bool:
        directory = self.env.get(ENV_DIR)
        return directory is not None and any(Path(directory).glob(f"{FILE_PREFIX}*{FILE_SUFFIX}"))

    def _env_for(self, order: Order) -> dict[str, str]:
        resume = self.dir / f"resume-{order.generation}.json"
        if order.step is not None or order.fast_step is not None:
            pin = ResumeFile(
                step=order.step,
                pins_step=order.step is not None,  # without it, the fallback is resolved
                source=f"in-place restart, generation {order.generation}",
                fast_step=order.fast_step,
                fast_lineage=order.fast_lineage,  # restored only from copies of it
            )
            write_json(resume, pin.encode())
        else:  # nothing pinned: no resume file, so the restored trainer resolves the newest
            resume.unlink(missing_ok=True)
        if order.attempt is None:  # parse_order refuses a run order without one
            raise OrderError("order.attempt: a run order names its attempt")
        if order.rank is not None:
            self.assigned.update(dict.fromkeys(RANK_ENV, str(order.rank)))
        if order.master_addr is not None:
            self.assigned.update(dict.fromkeys(MASTER_ENV, order.master_addr))
        if order.world_size is not None:
            self.assigned.update(dict.fromkeys(WORLD_ENV, str(order.world_size)))
        if order.fast_every_steps is not None:  # fastTier.everySteps: auto
            self.assigned[fast_tier.ENV_EVERY_STEPS] = str(order.fast_every_steps)
        return {**self.env, **self.assigned,
                "RTJ_ATTEMPT": writer_attempt(order.attempt, order.generation),
                "RTJ_RESTART_GENERATION": str(order.generation),
                "RTJ_RESUME_FILE": str(resume)}  # fmt: skip

    def _resume(self, generation: int) -> Path:
        return trainers_files.resume_file(self.dir, self.env, generation)

    def _note_misaligned(self) -> None:
        """Report the data alignment check's finding once the running trainers made one."""
        if self.current.state != State.RUNNING or self.current.misaligned is not None:
            return
        found = trainers_files.misaligned(self._resume(self.current.generation))
        if found is not None:
            self._set(replace(self.current, misaligned=found))
            self._say(f"generation {self.current.generation}: {found.describe()}")

    def _reap_child(self) -> None:
        if self.child is None or self.current.state != State.RUNNING:
            return
        code = self.child.poll()
        if code is None:
            self._note_misaligned()
            return
        code = 128 - code if code < 0 else code  # killed by a signal: as a shell reports it
        self._reap_orphans()
        self._exited_at = time.monotonic()
        state = State.FINISHED if code == 0 else State.EXITED
        generation = self.current.generation
        resume = self._resume(generation)
        self._set(replace(self.current, state=state, exit_code=code,
                          rejected=trainers_files.rejected(resume),
                          suspect=trainers_files.suspect(resume)))  # fmt: skip
        self._say(f"generation {self.current.generation}: the command exited with {code}")

    def _stop(self, generation: int, save_seconds: int | None = None) -> None:
        self._set(replace(self.current, state=State.STOPPING))
        self._kill_all(self.stop_grace if save_seconds is None else save_seconds)
        code = self.child.returncode if self.child is not None else None
        self._forget_progress()
        fast_dir = self.env.get(fast_tier.ENV_DIR)
        held = tuple(fast_tier.held(Path(fast_dir))) if fast_dir else ()
        self._set(Supervised(generation, State.STOPPED, self.current.attempt,
                             128 - code if code is not None and code < 0 else code,
                             tuple(h.step for h in held), held))  # fmt: skip
        self._say(f"generation {generation}: every process of the old one is gone")

    def _forget_progress(self) -> None:
        """Remove the stopped generation's rank progress records: a dead rank's record would
        read as a rank stuck in its section until the new generation writes its own."""
        directory = self.env.get(ENV_DIR)
        if not directory:
            return
        for record in Path(directory).glob(f"{FILE_PREFIX}*{FILE_SUFFIX}"):
            record.unlink(missing_ok=True)

    def _kill_all(self, grace: float) -> None:
        """SIGTERM the group and every descendant, SIGKILL what is left after ``grace``,
        then reap until no descendant remains (but the warm standby, which never ran)."""
        if self.child is not None and self.child.poll() is None:  # a reaped pid may be reused
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.child.pid, signal.SIGTERM)
        for pid in self._descendants():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while self._descendants() and time.monotonic() < deadline:
            self._reap_orphans()
            time.sleep(POLL_SECONDS)
        while left := self._descendants():
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            self._reap_orphans()
            time.sleep(POLL_SECONDS / 2)
        if self.child is not None:
            self.child.wait()
        self._reap_orphans()

    def _descendants(self) -> list[int]:
        """Every live process below us but the standby (which has none of its own)."""
        standby = self.standbys.proc
        return [pid for pid in descendants(os.getpid()) if standby is None or pid != standby.pid]

    def _reap_orphans(self) -> None:
        """Collect exited descendants reparented to us (we are their subreaper)."""
        ours = [p for p in (self.child, self.standbys.proc) if p]
        with contextlib.suppress(ChildProcessError):
            while True:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    return
                for proc in ours:
                    if pid == proc.pid and proc.returncode is None:
                        proc.returncode = exit_code(status)  # reaped here, not by Popen

    def _on_sigterm(self, signum: int, frame: object) -> None:
        self._terminated = True

    def _stop_for_good(self) -> int:
        """The pod is being deleted: pass SIGTERM on, give the command its grace (the warm
        interpreter is ended after: its end must not delay the trainer's SIGTERM)."""
        self._kill_all(self.grace)
        self.standbys.drop()
        code = self.child.returncode if self.child is not None else None
        self._set(replace(self.current, state=State.STOPPED))
        return 128 + signal.SIGTERM if code is None else (128 - code if code < 0 else code)

    # --- reporting ------------------------------------------------------------------------
    def _set(self, state: Supervised) -> None:
        self.current = state
        running = self.child is not None and state.state is State.RUNNING
        report = SupervisorReport(
            state.generation, state.state, state.attempt, state.exit_code,
            fast_steps=state.fast_steps, fast_held=frozenset(state.fast_held),
            rejected=state.rejected, suspect=state.suspect, misaligned=state.misaligned,
            spare=self.spare,
            rank=int(self.assigned["RANK"]) if "RANK" in self.assigned else None,
            pid=self.child.pid if running and self.child is not None else None,
            preloaded=self.preloaded, standby=self.standbys.report(),
            updated_wall_time=round(time.time(), 6),
        )  # fmt: skip
        write_json(self.dir / STATE_FILE, report.encode())

    def _say(self, line: str) -> None:
        sys.stderr.write(f"rtj-shim supervise: {line}\n")
        sys.stderr.flush()


def _encode(body: dict[str, object]) -> bytes:
    return json.dumps(body).encode()


def _become_subreaper() -> bool:
    """Orphaned descendants (torchrun's workers once torchrun is gone, a trainer the fork
    server forked) are reparented to us, not to init, so none can escape a stop. Whether it
    worked: Linux only; elsewhere the process tree as seen is all that is stopped."""
    if sys.platform != "linux":
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False
