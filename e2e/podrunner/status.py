"""The pod status a kubelet writes, from what the runner's processes did. Pure.

``PodRun`` records each container's state; ``render_status`` turns it into the status
object (phase, conditions, init and container statuses) with ``restartPolicy: Never``
semantics: a failed init container fails the pod, and the pod ends Succeeded only when every
container exited 0. ``termination`` builds a terminated state the way the kubelet does:
reason ``Completed``/``Error``/``OOMKilled``, ``128+signal`` for a signal, and the message
from the termination-log file or, with ``FallbackToLogsOnError``, from the log's tail.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]
LOOPBACK = "127.0.0.1"
MESSAGE_LIMIT = 4096
LOG_TAIL_LINES = 80
LOG_TAIL_BYTES = 2048


@dataclass
class ContainerRun:
    name: str
    init: bool
    state: Obj = field(default_factory=lambda: {"waiting": {"reason": "PodInitializing"}})

    @property
    def terminated(self) -> Obj | None:
        out = self.state.get("terminated")
        return out if isinstance(out, dict) else None

    @property
    def running(self) -> bool:
        return "running" in self.state


@dataclass
class PodRun:
    """What happened to one pod's containers so far."""

    name: str
    uid: str
    started_at: str
    containers: list[ContainerRun]
    config_error: str | None = None

    @classmethod
    def of(cls, pod: Obj, now: str) -> PodRun:
        spec = pod.get("spec") or {}
        runs = [ContainerRun(c["name"], True) for c in spec.get("initContainers") or []]
        runs += [ContainerRun(c["name"], False) for c in spec.get("containers") or []]
        return cls(pod["metadata"]["name"], pod["metadata"]["uid"], now, runs)

    def get(self, name: str) -> ContainerRun:
        return next(c for c in self.containers if c.name == name)

    def start(self, name: str, now: str) -> None:
        self.get(name).state = {"running": {"startedAt": now}}

    def finish(self, name: str, terminated: Obj) -> None:
        self.get(name).state = {"terminated": terminated}


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


def _status_of(c: ContainerRun, image: str) -> Obj:
    term = c.terminated
    return {
        "name": c.name,
        "image": image,
        "imageID": "",
        "state": c.state,
        "ready": c.running and not c.init,
        "started": c.running,
        "restartCount": 0,
        **({"containerID": term["containerID"]} if term else {}),
    }


def phase(run: PodRun) -> str:
    inits = [c for c in run.containers if c.init]
    mains = [c for c in run.containers if not c.init]
    if any(c.terminated and c.terminated["exitCode"] != 0 for c in inits):
        return "Failed"
    if all(c.terminated for c in mains):
        return "Succeeded" if all(c.terminated["exitCode"] == 0 for c in mains) else "Failed"  # type: ignore[index]
    if any(c.running or c.terminated for c in mains):
        return "Running"
    return "Pending"


def render_status(run: PodRun, pod: Obj, now: str) -> Obj:
    """The whole status object the runner patches (conditions merge by type server-side)."""
    spec = pod.get("spec") or {}
    images = {c["name"]: c.get("image", "") for key in ("initContainers", "containers")
              for c in spec.get(key) or []}  # fmt: skip
    inits = [c for c in run.containers if c.init]
    mains = [c for c in run.containers if not c.init]
    current = phase(run)
    initialized = all(c.terminated and c.terminated["exitCode"] == 0 for c in inits)
    ready = current == "Running" and all(c.running for c in mains)
    not_ready = "PodCompleted" if current in ("Succeeded", "Failed") else "ContainersNotReady"
    status: Obj = {
        "phase": current,
        "hostIP": LOOPBACK,
        "hostIPs": [{"ip": LOOPBACK}],
        "podIP": LOOPBACK,
        "podIPs": [{"ip": LOOPBACK}],
        "startTime": run.started_at,
        "conditions": [
            _condition("PodReadyToStartContainers", True, now),
            _condition("Initialized", initialized, now, "ContainersNotInitialized"),
            _condition("Ready", ready, now, not_ready),
            _condition("ContainersReady", ready, now, not_ready),
        ],
        "containerStatuses": [_status_of(c, images.get(c.name, "")) for c in mains],
    }
    if inits:
        status["initContainerStatuses"] = [_status_of(c, images.get(c.name, "")) for c in inits]
    if run.config_error:
        for s in status["containerStatuses"]:
            s["state"] = {
                "waiting": {"reason": "CreateContainerConfigError", "message": run.config_error}
            }
    return status
