"""One pod's lifecycle: its address, its processes, and its status reports.

A ``PodWorker`` thread does for one pod what the kubelet's sync loop does (Kubernetes
v1.35, kubernetes/kubernetes ``pkg/kubelet/kuberuntime/kuberuntime_manager.go``
``computePodActions``/``SyncPod`` and ``kuberuntime_container.go``
``computeInitContainerActions``), polling its processes instead of a PLEG:

- the pod gets its own IP (``podip``) before anything runs, as a sandbox would;
- init containers start in spec order. A regular one runs to completion before the next
  starts; a failure (``restartPolicy: Never``) fails the pod. A native sidecar (an init
  container with ``restartPolicy: Always``) is started in its turn and the sequence moves
  on as soon as it runs: a ``startupProbe`` is not run (the sidecar counts as started
  once its process runs, as if the probe passed at once), nor is a readiness or liveness
  probe. Until it has run, the sequence waits for it (a sidecar that cannot start holds the
  pod Pending, retried with back-off, as the kubelet does);
- the main containers start together once the init sequence is done;
- a sidecar that exits while the pod runs is restarted (``restartCount`` + 1): at once the
  first time, then after a back-off that doubles from ``BACKOFF_FIRST`` to ``BACKOFF_MAX``
  (the kubelet's is 10 s doubling to 5 min; shortened here, tests and demos wait on it),
  waiting meanwhile with reason ``CrashLoopBackOff`` and the exit in ``lastState``;
- under ``restartPolicy: OnFailure`` a main container that exits non-zero is restarted in
  the pod the same way (what is left of its process group killed first, as a runtime ends
  a container's cgroup); one that exits 0 is done. ``Never`` (and any other policy) never
  restarts a main container;
- once every main container has terminated, the sidecars are stopped (SIGTERM, SIGKILL
  after the pod's grace period), in reverse spec order, and never restarted again: a
  sidecar never keeps a finished pod Running, and its exit code does not decide the phase
  (``status.phase``);
- a deleted pod's main containers (and a regular init container) get SIGTERM first; the
  sidecars get theirs once those have exited, in reverse order, within the same grace
  period (``killContainersWithSyncResult`` with the ordering of
  ``kuberuntime_termination_order.go``); SIGKILL takes what is left at its end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubernetes.client.exceptions import ApiException

# a container's processes are its tree (torchrun's workers run in sessions of their own),
# found as the supervisor finds them
from rtj_shim.agent.supervisor import descendants

from .podip import NoPodIP
from .spec import LocalProcess, PodNotRunnable, plan_pod, slowed
from .status import ContainerRun, PodRun, render_status, signal_name, termination

if TYPE_CHECKING:
    from .runner import PodRunner

Obj = dict[str, Any]
POLL_SECONDS = 0.05
BACKOFF_FIRST = 1.0
BACKOFF_MAX = 10.0
BACKOFF_RESET = 60.0  # a sidecar that ran this long before exiting starts over at once
MAX_GRACE_SECONDS = 30.0
DEFAULT_GRACE_SECONDS = 30.0


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class PodWorker(threading.Thread):
    """One pod: its init containers and sidecars, then its containers; reported as a kubelet
    would (see the module doc)."""

    def __init__(self, runner: PodRunner, pod: Obj) -> None:
        super().__init__(daemon=True, name=f"pod-{pod['metadata']['name']}")
        self.runner = runner
        self.pod = pod
        meta = pod["metadata"]
        self.key = (meta["namespace"], meta["name"])
        self.uid = meta["uid"]
        self.node = pod["spec"]["nodeName"]
        self.run_state = PodRun.of(pod, now())
        self.stopping = threading.Event()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}  # the latest process of each
        self.live: dict[str, subprocess.Popen[bytes]] = {}  # those not reaped yet
        self.plans: dict[str, LocalProcess] = {}
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.dirs = runner.dirs_for(pod)
        self._restart_at: dict[str, float] = {}
        self._backoff: dict[str, float] = {}
        self._started_mono: dict[str, float] = {}  # when each container last started
        self._ran: set[str] = set()  # the containers that have started once
        self._mains_started = False
        self._changed = False
        self._phase = "Pending"  # the phase of the status patched last

    # --- lifecycle ---------------------------------------------------------------------------
    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # a runner bug must not look like a training failure
            self.runner.say(f"{self._who()}: runner error: {type(exc).__name__}: {exc}")
        finally:
            with self.lock:
                idle = not any(p.poll() is None for p in self.live.values())
            if idle:  # else stop() releases it once they are gone
                self.runner.pod_ips.release(self.uid)
            self.done.set()

    def _run(self) -> None:
        try:
            self.run_state.pod_ips = [self.runner.pod_ips.claim(self.uid)]
            plan_ = plan_pod(
                self.pod,
                self.dirs,
                self.runner.sources(self.key[0]),
                workdir=self.runner.workdir,
                base_env=self.runner.base_env,
                pod_ips=self.run_state.pod_ips,
            )
        except (PodNotRunnable, NoPodIP, KeyError, ApiException) as exc:
            self.run_state.config_error = str(exc)
            self.runner.say(f"{self._who()}: cannot run: {exc}")
            self._report()
            return
        for d in plan_.directories:
            d.mkdir(parents=True, exist_ok=True)
        for path, data in plan_.files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        rate = self.runner.slow_link(str((self.pod.get("spec") or {}).get("nodeName")))
        self.plans = {p.container: p if rate is None else slowed(p, rate) for p in plan_.processes}
        self.runner.say(f"{self._who()}: pod IP {self.run_state.pod_ips[0]}")
        self._report()
        while self._step():
            self._flush()
            time.sleep(POLL_SECONDS)
        self._flush()

    def _flush(self) -> None:
        if self._changed:
            self._changed = False
            self._report()

    def _step(self) -> bool:
        """One pass of the sync loop; False once the pod is done (or stopped and idle)."""
        self._reap()
        if self.stopping.is_set():
            with self.lock:
                return bool(self.live)
        inits = [p for p in self.plans.values() if p.init]
        mains = [p for p in self.plans.values() if not p.init]
        if self._pod_ending():  # every main container ended, or an init container failed
            self._flush()  # restartPolicy Never: the pod is done
            self._stop_sidecars()
            return False
        self._init_actions(inits)
        if not self._mains_started and self._init_sequence_done(inits):
            self._mains_started = True
            for p in mains:
                self._start(p)
        elif self._mains_started:
            for p in mains:  # OnFailure: the failed ones, once their back-off is over
                c = self._state(p)
                waiting = not c.running and c.terminated is None and c.last_state
                if waiting and time.monotonic() >= self._restart_at.get(p.container, 0):
                    self._start(p)
        return True

    def _init_actions(self, inits: list[LocalProcess]) -> None:
        """computeInitContainerActions: start the next init container (after a sidecar, once
        that sidecar has run); restart the sidecars that exited when their back-off is over.
        After initialization, only the sidecars are looked after."""
        for p in inits:
            c = self._state(p)
            if p.sidecar:
                if not c.running and time.monotonic() >= self._restart_at.get(p.container, 0):
                    self._start(p)
                if p.container not in self._ran and not self._mains_started:
                    return  # the sequence moves on once this sidecar has started
            elif not self._mains_started:
                if c.succeeded:
                    continue
                if not c.running and c.terminated is None:
                    self._start(p)
                return

    def _init_sequence_done(self, inits: list[LocalProcess]) -> bool:
        """Every regular init container exited 0 and every sidecar has started; the last
        init container, if a sidecar, runs now (computeInitContainerActions)."""
        last = inits[-1] if inits else None
        if last is not None and last.sidecar and not self._state(last).running:
            return False
        return all(
            p.container in self._ran if p.sidecar else self._state(p).succeeded for p in inits
        )

    def _failed(self, plan: LocalProcess) -> bool:
        term = self._state(plan).terminated
        return term is not None and term["exitCode"] != 0

    def _state(self, plan: LocalProcess) -> ContainerRun:
        return self.run_state.get(plan.container)

    # --- processes -----------------------------------------------------------------------------
    def _start(self, plan: LocalProcess) -> subprocess.Popen[bytes] | None:
        for d in (plan.log.parent, Path(plan.env["HOME"])):
            d.mkdir(parents=True, exist_ok=True)
        plan.termination_log.write_bytes(b"")
        with self.lock:
            if self.stopping.is_set():
                return None
            with plan.log.open("ab") as log:
                try:
                    proc = subprocess.Popen(
                        plan.argv,
                        env=plan.env,
                        cwd=plan.cwd,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,  # its own process group, like a container
                    )
                except OSError as exc:
                    log.write(f"runner: cannot start {plan.argv[0]}: {exc}\n".encode())
                    self.procs.pop(plan.container, None)
                    self._exited(plan, 127, self._started_at(plan))
                    return None
            self.procs[plan.container] = proc
            self.live[plan.container] = proc
        self._started_mono[plan.container] = time.monotonic()
        self._ran.add(plan.container)
        (plan.log.parent / "pid").write_text(str(proc.pid))
        self.run_state.start(plan.container, now(), self._container_id(plan))
        self._changed = True
        kind = "sidecar" if plan.sidecar else "init container" if plan.init else "container"
        restarts = self._state(plan).restart_count
        again = f", restart {restarts}" if restarts else ""
        self.runner.say(f"{self._who()}: {kind} {plan.container} started (pid {proc.pid}{again})")
        return proc

    def _reap(self) -> None:
        """Record every exit since the last pass."""
        with self.lock:
            ended = [(n, p) for n, p in self.live.items() if p.poll() is not None]
            for name, _ in ended:
                del self.live[name]
        for name, proc in ended:
            plan = self.plans[name]
            rc = proc.returncode
            how = f"signal {signal_name(rc)}" if rc < 0 else f"code {rc}"
            self.runner.say(f"{self._who()}: {name} exited with {how}")
            self._exited(plan, rc, self._started_at(plan))

    def _started_at(self, plan: LocalProcess) -> str:
        running = self._state(plan).state.get("running") or {}
        return str(running.get("startedAt") or now())

    def _exited(self, plan: LocalProcess, rc: int, started: str) -> None:
        term = termination(
            returncode=rc,
            started_at=started,
            finished_at=now(),
            message_file=_read(plan.termination_log),
            log=_read(plan.log)[-65536:],
            policy=plan.message_policy,
            container_id=self._container_id(plan),
        )
        self.run_state.finish(plan.container, term)
        self._changed = True
        if self.stopping.is_set():
            return
        if plan.sidecar and not self._pod_ending():
            self._schedule_restart(plan)
        elif not plan.init and rc != 0 and self.run_state.restart_policy == "OnFailure":
            proc = self.procs.get(plan.container)
            if proc is not None:  # the container's leftovers, as its cgroup would be
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
            self._schedule_restart(plan)

    def _pod_ending(self) -> bool:
        mains = [p for p in self.plans.values() if not p.init]
        if self._mains_started and all(self._state(p).terminated for p in mains):
            return True
        return any(self._failed(p) for p in self.plans.values() if p.init and not p.sidecar)

    def _schedule_restart(self, plan: LocalProcess) -> None:
        """The first restart is at once, later ones back off (see the module doc)."""
        name = plan.container
        ran = time.monotonic() - self._started_mono.get(name, time.monotonic())
        delay = 0.0 if ran >= BACKOFF_RESET else self._backoff.get(name, 0.0)
        self._backoff[name] = min(max(delay * 2, BACKOFF_FIRST), BACKOFF_MAX)
        self._restart_at[name] = time.monotonic() + delay
        ns, pod = self.key
        message = (
            f"back-off {delay:g}s restarting failed container={name} pod={pod}_{ns}({self.uid})"
        )
        self.run_state.back_off(name, message)

    def _container_id(self, plan: LocalProcess) -> str:
        proc = self.procs.get(plan.container)
        return f"local://{self.node}/{proc.pid if proc else 0}"

    def _grace(self) -> float:
        spec = self.pod.get("spec") or {}
        grace = spec.get("terminationGracePeriodSeconds")
        return min(float(DEFAULT_GRACE_SECONDS if grace is None else grace), MAX_GRACE_SECONDS)

    def _stop_sidecars(self) -> None:
        """The pod is done: stop its sidecars (reverse order) and record their exits."""
        sidecars = [p for p in self.plans.values() if p.sidecar]
        with self.lock:
            procs = [self.live[p.container] for p in reversed(sidecars) if p.container in self.live]
        deadline = time.monotonic() + self._grace()
        for proc in procs:
            _terminate([proc], deadline)
        self._reap()

    def stop(self, grace: float) -> None:
        """SIGTERM the main containers (and a running regular init container), then the
        sidecars in reverse order; SIGKILL what is left after ``grace`` seconds."""
        with self.lock:
            self.stopping.set()
            self.run_state.terminal = True
            live = dict(self.live)
        order = [p.container for p in self.plans.values() if p.sidecar]
        sidecars = [live.pop(name) for name in reversed(order) if name in live]
        deadline = time.monotonic() + grace
        _terminate(list(live.values()), deadline)
        for proc in sidecars:
            _terminate([proc], deadline)
        if self.done.is_set() or not self.is_alive():
            self.runner.pod_ips.release(self.uid)
        else:  # the worker reaps the exits, reports them and releases the address
            self.done.wait(5.0)
            self.runner.pod_ips.release(self.uid)

    def report_now(self) -> None:
        """Post the pod's status now (its node is back in contact)."""
        self._report()

    def report_final(self) -> None:
        """Post the status of a deleted pod whose processes are all gone: every container
        terminated, so the phase is terminal (Failed, or Succeeded when every main container
        exited 0). The kubelet does so before the final deletion since Kubernetes 1.27
        (kubernetes/kubernetes#115331, `syncTerminatedPod`), which is what lets the Job
        controller, and the operator, see a deleted pod's processes end before its tracking
        finalizer is removed. Exits the worker has not reaped yet are recorded first (a
        sidecar still recorded as running would hold the phase)."""
        self._reap()
        self._post_status()

    def _report(self) -> None:
        if self.stopping.is_set() and self.runner.gone(self.uid):
            return
        self._post_status()

    def _post_status(self) -> None:
        if self.runner.cut_off(self.node):
            return  # out of contact: nothing reaches the API server
        status = render_status(self.run_state, self.pod, now(), self._phase)
        ns, name = self.key
        try:
            self.runner.core.patch_namespaced_pod_status(name, ns, {"status": status})
            self._phase = status["phase"]  # what the API server holds now
        except ApiException as exc:
            if exc.status != 404:
                self.runner.say(f"{self._who()}: status update failed: {exc.status} {exc.reason}")

    def _who(self) -> str:
        return f"{self.key[0]}/{self.key[1]} on {self.node}"


def _terminate(procs: list[subprocess.Popen[bytes]], deadline: float) -> None:
    """SIGTERM each process group; SIGKILL each tree still there at ``deadline``."""
    procs = [p for p in procs if p.poll() is None]
    for p in procs:
        _signal_group(p, signal.SIGTERM)
    orphans: list[int] = []
    for p in procs:
        orphans += descendants(p.pid)
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(p, signal.SIGKILL)
            p.wait()
    for pid in orphans:  # workers whose parent exited first (reparented to init)
        kill_tree(pid, signal.SIGKILL)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def kill_tree(pid: int, sig: int) -> None:
    for p in [pid, *descendants(pid)]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, sig)


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    """SIGTERM goes to the group (the entrypoint forwards it, as in a container); SIGKILL to
    the whole tree, as a container runtime's cgroup kill would."""
    if sig == signal.SIGKILL:
        kill_tree(proc.pid, sig)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
