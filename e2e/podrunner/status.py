"""The pod status a kubelet writes, from what the runner's processes did. Pure.

``PodRun`` records each container's state; ``render_status`` turns it into the status
object (phase, conditions, pod IPs, init and container statuses) for a pod whose
``restartPolicy`` is ``Never`` or ``OnFailure`` (any other is run as ``Never``). The rules
are the kubelet's (Kubernetes v1.35, read in kubernetes/kubernetes):

- the phase is ``getPhase`` of ``pkg/kubelet/kubelet_pods.go``: a failed regular init
  container fails the pod; a native sidecar (an init container with ``restartPolicy:
  Always``) counts as running while it runs, and once it has terminated (or waits in
  back-off after a run) it is ignored, so the phase of a pod whose containers all ended is
  decided by the main containers alone: Succeeded when every one exited 0, else Failed
  under ``Never`` and Running under ``OnFailure`` (the failed ones are restarted in the
  pod). A main container waiting to be restarted after a run counts as stopped, not
  waiting, so the pod stays Running through its back-off;
- ``started``/``ready`` are ``UpdatePodStatus`` of ``pkg/kubelet/prober/prober_manager.go``:
  a regular init container is ready once it exited 0; a sidecar is started while it runs
  (the runner runs no startupProbe, as if it passed at once) and ready while started (no
  readinessProbe is run either: a sidecar that has one is reported ready once started, as
  are main containers with one, rather than never ready, which would hold the pod's Ready
  condition False for ever);
- the conditions are ``pkg/kubelet/status/generate.go``: ``Initialized`` when every regular
  init container exited 0 and every sidecar has started (or once a main container has
  started, or the pod Succeeded); ``ContainersReady``/``Ready`` when the sidecars and the
  main containers are all ready;
- a terminal phase waits for every container to stop: while one still runs (the sidecars a
  failed init container leaves, before they are stopped), the status keeps the phase it
  reported last, with the new container states (``mergePodStatus`` of
  ``pkg/kubelet/status/status_manager.go``, "Delay transitioning a pod to a terminal status
  unless the pod is actually terminal", since v1.27, kubernetes/kubernetes#115331);
- ``podIP``/``podIPs`` are the pod's own address (``convertStatusToAPIStatus``), absent
  until the pod has one; ``hostIP``/``hostIPs`` are the node's, loopback.

``termination`` builds a terminated state the way the kubelet does: reason
``Completed``/``Error``/``OOMKilled``, ``128+signal`` for a signal, and the message from the
termination-log file or, with ``FallbackToLogsOnError``, from the log's tail. A restarted
container (a sidecar, or under ``OnFailure`` a main one) keeps its previous termination in
``lastState`` and counts it in ``restartCount``.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]
LOOPBACK = "127.0.0.1"
TERMINAL = ("Succeeded", "Failed")
MESSAGE_LIMIT = 4096
LOG_TAIL_LINES = 80
LOG_TAIL_BYTES = 2048


@dataclass
class ContainerRun:
    name: str
    init: bool
    sidecar: bool = False
    state: Obj = field(default_factory=lambda: {"waiting": {"reason": "PodInitializing"}})
    last_state: Obj = field(default_factory=dict)
    restart_count: int = 0
    container_id: str = ""

    @property
    def terminated(self) -> Obj | None:
        out = self.state.get("terminated")
        return out if isinstance(out, dict) else None

    @property
    def running(self) -> bool:
        return "running" in self.state

    @property
    def succeeded(self) -> bool:
        term = self.terminated
        return term is not None and term["exitCode"] == 0

    @property
    def has_run(self) -> bool:
        """Running, terminated, or waiting to be restarted after a run."""
        return self.running or self.terminated is not None or bool(self.last_state)


@dataclass
class PodRun:
    """What happened to one pod's containers so far."""

    name: str
    uid: str
    started_at: str
    containers: list[ContainerRun]
    config_error: str | None = None
    pod_ips: list[str] = field(default_factory=list)
    restart_policy: str = "Never"  # "OnFailure": failed main containers restart in the pod
    terminal: bool = False  # the pod is being deleted: nothing restarts (podIsTerminal)

    @classmethod
    def of(cls, pod: Obj, now: str, pod_ips: Sequence[str] = ()) -> PodRun:
        spec = pod.get("spec") or {}
        runs = [
            ContainerRun(c["name"], True, sidecar=c.get("restartPolicy") == "Always")
            for c in spec.get("initContainers") or []
        ]
        runs += [ContainerRun(c["name"], False) for c in spec.get("containers") or []]
        policy = "OnFailure" if spec.get("restartPolicy") == "OnFailure" else "Never"
        meta = pod["metadata"]
        return cls(meta["name"], meta["uid"], now, runs, None, [*pod_ips], policy)

    def get(self, name: str) -> ContainerRun:
        return next(c for c in self.containers if c.name == name)

    def start(self, name: str, now: str, container_id: str = "") -> None:
        """Running; a container that ran before is a restart (``restartCount`` + 1)."""
        c = self.get(name)
        c.container_id = container_id
        if c.terminated is not None:
            c.last_state = c.state
        if c.last_state:
            c.restart_count += 1
        c.state = {"running": {"startedAt": now}}

    def finish(self, name: str, terminated: Obj) -> None:
        self.get(name).state = {"terminated": terminated}

    def back_off(self, name: str, message: str) -> None:
        """A sidecar (or an ``OnFailure`` main container that failed) waits to be
        restarted: its termination becomes ``lastState`` and it waits with reason
        ``CrashLoopBackOff``."""
        c = self.get(name)
        if c.terminated is not None:
            c.last_state = c.state
        c.state = {"waiting": {"reason": "CrashLoopBackOff", "message": message}}

    @property
    def inits(self) -> list[ContainerRun]:
        return [c for c in self.containers if c.init]

    @property
    def mains(self) -> list[ContainerRun]:
        return [c for c in self.containers if not c.init]


def exit_code(returncode: int) -> int:
    """Popen's negative signal numbers as the container runtime reports them (128 + n)."""
    return 128 - returncode if returncode < 0 else returncode


def tail(log: bytes, lines: int = LOG_TAIL_LINES, limit: int = LOG_TAIL_BYTES) -> str:
    text = b"\n".join(log.rstrip(b"\n").split(b"\n")[-lines:])[-limit:]
    return text.decode("utf-8", errors="replace")


def termination(
    *,
    returncode: int,
    started_at: str,
    finished_at: str,
    message_file: bytes,
    log: bytes,
    policy: str,
    container_id: str,
    oom: bool = False,
) -> Obj:
    code = exit_code(returncode)
    reason = "OOMKilled" if oom else ("Completed" if code == 0 else "Error")
    message = message_file[:MESSAGE_LIMIT].decode("utf-8", errors="replace")
    if not message.strip() and policy == "FallbackToLogsOnError" and code != 0:
        message = tail(log)
    out: Obj = {
        "exitCode": code,
        "reason": reason,
        "startedAt": started_at,
        "finishedAt": finished_at,
        "containerID": container_id,
    }
    if returncode < 0:
        out["signal"] = -returncode
    if message:
        out["message"] = message
    return out


def signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return str(-returncode)


def _condition(type_: str, ok: bool, now: str, reason: str | None = None) -> Obj:
    out: Obj = {"type": type_, "status": "True" if ok else "False", "lastTransitionTime": now}
    if reason and not ok:
        out["reason"] = reason
    return out


def _ready(c: ContainerRun) -> bool:
    """prober_manager.go UpdatePodStatus, with no probe ever run (see the module doc)."""
    if c.init and not c.sidecar:
        return c.succeeded
    return c.running


def _status_of(c: ContainerRun, image: str) -> Obj:
    term = c.terminated or {}
    container_id = term.get("containerID") or (c.container_id if c.running else "")
    out: Obj = {
        "name": c.name,
        "image": image,
        "imageID": "",
        "state": c.state,
        "ready": _ready(c),
        "started": c.running,
        "restartCount": c.restart_count,
        **({"containerID": container_id} if container_id else {}),
    }
    if c.last_state:
        out["lastState"] = c.last_state
    return out


def any_main_started(run: PodRun) -> bool:
    """``HasAnyRegularContainerStarted``: the pod has been initialized before."""
    return any(c.running or c.terminated is not None for c in run.mains)


def phase(run: PodRun) -> str:
    """The kubelet's ``getPhase`` (pkg/kubelet/kubelet_pods.go) for a ``restartPolicy:
    Never`` or ``OnFailure`` pod whose containers all have a status."""
    pending_init = failed_init = running = waiting = stopped = succeeded = 0
    for c in run.inits:
        if c.sidecar:
            if c.running:
                running += 1
            elif c.terminated is None and not c.last_state:  # never ran
                pending_init += 1
                waiting += 1
        elif c.terminated is not None:
            failed_init += not c.succeeded
        else:
            pending_init += 1
    for c in run.mains:
        if c.running:
            running += 1
        elif c.terminated is not None:
            stopped += 1
            succeeded += c.succeeded
        elif c.last_state:  # waiting to be restarted after a run
            stopped += 1
        else:
            waiting += 1
    if failed_init:
        return "Failed"
    if (pending_init and not any_main_started(run)) or waiting:
        return "Pending"
    if running:
        return "Running"
    if stopped:
        if stopped == succeeded:
            return "Succeeded"
        restarts = run.restart_policy == "OnFailure" and not run.terminal
        return "Running" if restarts else "Failed"
    return "Pending"


def initialized(run: PodRun, current: str) -> bool:
    """``GeneratePodInitializedCondition`` (pkg/kubelet/status/generate.go)."""
    if current == "Succeeded" or any_main_started(run):
        return True
    return all(c.running if c.sidecar else c.succeeded for c in run.inits)


def render_status(run: PodRun, pod: Obj, now: str, previous: str = "Pending") -> Obj:
    """The whole status object the runner patches (conditions merge by type server-side);
    ``previous`` is the phase of the status patched before (kept while a terminal phase
    waits for a container still running)."""
    spec = pod.get("spec") or {}
    images = {c["name"]: c.get("image", "") for key in ("initContainers", "containers")
              for c in spec.get(key) or []}  # fmt: skip
    current = phase(run)
    if current in TERMINAL and any(c.running for c in run.containers):
        current = previous  # couldHaveRunningContainers: not terminal yet
    sidecars = [c for c in run.inits if c.sidecar]
    ready = current == "Running" and all(_ready(c) for c in [*sidecars, *run.mains])
    not_ready = "PodCompleted" if current in TERMINAL else "ContainersNotReady"
    status: Obj = {
        "phase": current,
        "hostIP": LOOPBACK,
        "hostIPs": [{"ip": LOOPBACK}],
        "startTime": run.started_at,
        "conditions": [
            _condition("PodReadyToStartContainers", True, now),
            _condition("Initialized", initialized(run, current), now, "ContainersNotInitialized"),
            _condition("Ready", ready, now, not_ready),
            _condition("ContainersReady", ready, now, not_ready),
        ],
        "containerStatuses": [_status_of(c, images.get(c.name, "")) for c in run.mains],
    }
    if run.pod_ips:
        status["podIP"] = run.pod_ips[0]
        status["podIPs"] = [{"ip": ip} for ip in run.pod_ips]
    if run.inits:
        status["initContainerStatuses"] = [_status_of(c, images.get(c.name, "")) for c in run.inits]
    if run.config_error:
        for s in status["containerStatuses"]:
            s["state"] = {
                "waiting": {"reason": "CreateContainerConfigError", "message": run.config_error}
            }
    return status
