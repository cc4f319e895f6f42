"""Fault injection the way the real components would show it.

Every helper writes what the component that owns that field would write, through the same
API (status subresource, Eviction API, node status), so the operator under test sees exactly
what it would see in a real cluster:

- ``terminate_container``: the kubelet's report of a container exit (exit code, reason,
  message, startedAt/finishedAt, pod phase and conditions by restartPolicy). KWOK is told to
  leave the pod alone first.
- ``node_not_ready``: the kubelet posting ``Ready=False`` (e.g. container runtime down); the
  real node lifecycle controller then taints the node.
- ``node_lost``: the kubelet stops renewing its Lease (KWOK stops managing the node); the real
  node lifecycle controller marks it ``Unknown`` and taints it unreachable.
- ``delete_node``: the machine disappears (its Node object is deleted); the real pod GC
  deletes its pods with a ``DisruptionTarget`` condition.
- ``gpu_xid``: a GPU health agent reporting an XID as a node condition (NVSentinel's
  ``SysLogsXIDError``) or a node label.
- ``evict_pod``: the Eviction API (the API server adds ``DisruptionTarget`` and deletes).
- ``preempt_pod``: kube-scheduler's preemption (``DisruptionTarget``/``PreemptionByScheduler``
  then a graceful delete).

Kueue's own preemption (nothing written on its behalf): ``e2e.cluster.kueue_preemption``.
"""

from __future__ import annotations

import datetime as dt
import os
import shlex
import time
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from . import kwok
from .kube import Kube, eventually

Obj = dict[str, Any]

XID_CONDITION_TYPE = "SysLogsXIDError"
XID_LABEL_KEY = "e2e.resilient.dev/gpu-xid"

_SIGNAL_REASONS = {137: "OOMKilled"}


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _condition(
    ctype: str,
    status: str,
    reason: str | None = None,
    message: str | None = None,
    *,
    heartbeat: bool = False,
) -> Obj:
    c: Obj = {"type": ctype, "status": status, "lastTransitionTime": _now()}
    if heartbeat:
        c["lastHeartbeatTime"] = _now()
    if reason:
        c["reason"] = reason
    if message:
        c["message"] = message
    return c


def _merge_conditions(existing: list[Obj], new: list[Obj]) -> list[Obj]:
    by_type = {c["type"]: dict(c) for c in existing}
    for c in new:
        old = by_type.get(c["type"])
        if old and old.get("status") == c["status"] and "lastTransitionTime" in old:
            c = dict(c, lastTransitionTime=old["lastTransitionTime"])
        by_type[c["type"]] = c
    return list(by_type.values())


def ignore_in_kwok(
    kube: Kube, *, pod: tuple[str, str] | None = None, node: str | None = None
) -> None:
    """Tell KWOK to leave this pod or node alone (no stage but deletion applies any more)."""
    patch = {"metadata": {"annotations": {kwok.IGNORE_ANNOTATION: kwok.IGNORE_VALUE}}}
    if pod:
        kube.core.patch_namespaced_pod(pod[1], pod[0], patch)
    if node:
        kube.core.patch_node(node, patch)


# --- pods --------------------------------------------------------------------------------


def terminate_container(
    kube: Kube,
    namespace: str,
    pod: str,
    *,
    exit_code: int,
    reason: str | None = None,
    message: str = "",
    container: str | None = None,
    signal: int | None = None,
) -> Obj:
    """Report a container exit as the kubelet would and return the new pod status.

    ``reason`` defaults to the kubelet's: ``Completed`` for 0, ``OOMKilled`` for 137 when
    asked for, else ``Error``. With ``restartPolicy: Never`` (JobSet workers) the pod phase
    becomes ``Failed``/``Succeeded`` once no container is running; with ``OnFailure``/``Always``
    and a non-zero code the kubelet restarts the container, so the exit lands in
    ``lastState`` and ``restartCount`` grows.
    """
    if backend() == "kind":
        return _exit_on_real_kubelet(kube, namespace, pod, container, exit_code, message)
    ignore_in_kwok(kube, pod=(namespace, pod))
    p = kube.core.read_namespaced_pod(pod, namespace)
    raw = kube.api.sanitize_for_serialization(p)
    spec, status = raw["spec"], raw.get("status", {})
    name = container or spec["containers"][0]["name"]
    reason = reason or ("Completed" if exit_code == 0 else "Error")
    now = _now()
    statuses: list[Obj] = [dict(s) for s in status.get("containerStatuses", [])]
    if not any(s["name"] == name for s in statuses):
        statuses.append(
            {
                "name": name,
                "image": next(c["image"] for c in spec["containers"] if c["name"] == name),
                "restartCount": 0,
                "ready": False,
                "state": {"waiting": {"reason": "ContainerCreating"}},
            }
        )
    restart_policy = spec.get("restartPolicy", "Always")
    restarts = restart_policy == "Always" or (restart_policy == "OnFailure" and exit_code != 0)
    for s in statuses:
        if s["name"] != name:
            continue
        started = (s.get("state", {}).get("running") or {}).get("startedAt") or now
        terminated: Obj = {
            "exitCode": exit_code,
            "reason": reason,
            "startedAt": started,
            "finishedAt": now,
            "containerID": f"containerd://kwok-{pod}-{name}-{s.get('restartCount', 0)}",
        }
        if message:
            terminated["message"] = message
        if signal is not None:
            terminated["signal"] = signal
        # null the other keys: the API server merges container states by key (strategic merge)
        if restarts:
            s["lastState"] = {"terminated": terminated, "running": None, "waiting": None}
            s["restartCount"] = int(s.get("restartCount", 0)) + 1
            s["state"] = {"running": {"startedAt": now}, "terminated": None, "waiting": None}
            s["ready"] = True
            s["started"] = True
        else:
            s["state"] = {"terminated": terminated, "running": None, "waiting": None}
            s["ready"] = False
            s["started"] = False
    new_status: Obj = {"containerStatuses": statuses}
    if not restarts:
        running = [s for s in statuses if (s.get("state") or {}).get("running")]
        conds = [
            _condition("Ready", "False", "PodCompleted" if exit_code == 0 else "PodFailed"),
            _condition(
                "ContainersReady", "False", "PodCompleted" if exit_code == 0 else "PodFailed"
            ),
        ]
        if not running:
            codes = [
                s["state"]["terminated"]["exitCode"]
                for s in statuses
                if (s.get("state") or {}).get("terminated")
            ]
            new_status["phase"] = "Succeeded" if all(c == 0 for c in codes) else "Failed"
        else:
            conds = [
                _condition(
                    "Ready",
                    "False",
                    "ContainersNotReady",
                    f"containers with unready status: [{name}]",
                ),
                _condition(
                    "ContainersReady",
                    "False",
                    "ContainersNotReady",
                    f"containers with unready status: [{name}]",
                ),
            ]
        new_status["conditions"] = _merge_conditions(status.get("conditions", []), conds)
    out = kube.core.patch_namespaced_pod_status(pod, namespace, {"status": new_status})
    return kube.api.sanitize_for_serialization(out.status)  # type: ignore[no-any-return]


def backend() -> str:
    """``local`` (KWOK nodes: helpers write what the kubelet would) or ``kind`` (real
    kubelets: helpers make the real thing happen where they can)."""
    return os.environ.get("RTJ_E2E_BACKEND", "local")


def _exit_on_real_kubelet(
    kube: Kube, namespace: str, pod: str, container: str | None, exit_code: int, message: str
) -> Obj:
    """On a real kubelet: ask the worker (testenv.WORKER_COMMAND) to exit with ``exit_code``
    after writing ``message`` to its termination log; return the status the kubelet reports."""
    from kubernetes.stream import stream

    p = kube.core.read_namespaced_pod(pod, namespace)
    name = container or p.spec.containers[0].name
    before = {s.name: s.restart_count for s in p.status.container_statuses or []}
    script = (
        f"printf %s {shlex.quote(message)} > /dev/termination-log; "
        f"echo {int(exit_code)} > /tmp/rtj-exit-code; kill -USR1 1"
    )
    stream(
        kube.core.connect_get_namespaced_pod_exec,
        pod,
        namespace,
        container=name,
        command=["sh", "-c", script],
        stderr=True,
        stdout=True,
        stdin=False,
        tty=False,
    )

    def reported() -> Obj | None:
        q = kube.core.read_namespaced_pod(pod, namespace)
        for cs in q.status.container_statuses or []:
            if cs.name == name and (
                (cs.state and cs.state.terminated) or cs.restart_count > before.get(name, 0)
            ):
                return kube.api.sanitize_for_serialization(q.status)  # type: ignore[no-any-return]
        return None

    return eventually(f"kubelet reports {pod}/{name} exited", reported, 60)


def evict_pod(kube: Kube, namespace: str, pod: str, *, grace_seconds: int | None = None) -> None:
    """Evict through the Eviction API (what ``kubectl drain`` and the descheduler do)."""
    body = client.V1Eviction(
        metadata=client.V1ObjectMeta(name=pod, namespace=namespace),
        delete_options=client.V1DeleteOptions(grace_period_seconds=grace_seconds)
        if grace_seconds is not None
        else None,
    )
    kube.core.create_namespaced_pod_eviction(pod, namespace, body)


def preempt_pod(
    kube: Kube,
    namespace: str,
    pod: str,
    *,
    preemptor: str = "high-priority/preemptor",
    grace_seconds: int = 30,
) -> None:
    """What kube-scheduler's DefaultPreemption does to a victim: add the DisruptionTarget
    condition (reason PreemptionByScheduler), then delete the pod gracefully."""
    p = kube.core.read_namespaced_pod(pod, namespace)
    status = kube.api.sanitize_for_serialization(p.status) or {}
    cond = _condition(
        "DisruptionTarget",
        "True",
        "PreemptionByScheduler",
        f"{p.spec.scheduler_name or 'default-scheduler'}: preempting to "
        f"accommodate a higher priority pod ({preemptor})",
    )
    kube.core.patch_namespaced_pod_status(
        pod,
        namespace,
        {"status": {"conditions": _merge_conditions(status.get("conditions", []), [cond])}},
    )
    kube.core.delete_namespaced_pod(pod, namespace, grace_period_seconds=grace_seconds)


# --- nodes -------------------------------------------------------------------------------


def node_not_ready(
    kube: Kube,
    node: str,
    *,
    reason: str = "KubeletNotReady",
    message: str = "container runtime is down",
) -> None:
    """The kubelet posts Ready=False (it keeps renewing its Lease, as a live kubelet does)."""
    ignore_in_kwok(kube, node=node)
    n = kube.core.read_node(node)
    status = kube.api.sanitize_for_serialization(n.status) or {}
    conds = _merge_conditions(
        status.get("conditions", []),
        [_condition("Ready", "False", reason, message, heartbeat=True)],
    )
    kube.core.patch_node_status(node, {"status": {"conditions": conds}})


def node_lost(kube: Kube, node: str, *, wait: bool = True, timeout: float = 90.0) -> None:
    """The kubelet dies: nothing renews the node's Lease any more (KWOK stops managing it).
    The node lifecycle controller then sets every condition to Unknown (NodeStatusUnknown)
    and adds the unreachable taints; with ``wait`` this returns once Ready is Unknown."""
    kube.core.patch_node(
        node,
        {
            "metadata": {
                "labels": {kwok.MANAGED_LABEL: "lost"},
                "annotations": {kwok.IGNORE_ANNOTATION: kwok.IGNORE_VALUE},
            }
        },
    )
    if wait:
        eventually(
            f"node {node} Ready=Unknown after its lease expired",
            lambda: node_ready_status(kube, node) == "Unknown",
            timeout,
            interval=0.5,
        )


def delete_node(kube: Kube, node: str) -> None:
    """The machine is gone and its Node object deleted (cloud node lifecycle / an admin)."""
    kube.core.delete_node(node)


def gpu_xid(
    kube: Kube,
    node: str,
    xid: int,
    *,
    via: str = "condition",
    condition_type: str = XID_CONDITION_TYPE,
    label_key: str = XID_LABEL_KEY,
    pci: str = "0000:3b:00",
) -> None:
    """A GPU health agent reports an XID on ``node``: as a node condition (NVSentinel's
    syslog monitor, the default) or as a node label whose value lists the code."""
    if via == "label":
        kube.core.patch_node(node, {"metadata": {"labels": {label_key: str(xid)}}})
        return
    if via != "condition":
        raise ValueError("via must be 'condition' or 'label'")
    ignore_in_kwok(kube, node=node)  # KWOK's heartbeat must not drop the agent's condition
    n = kube.core.read_node(node)
    status = kube.api.sanitize_for_serialization(n.status) or {}
    message = (
        f"ErrorCode:{xid} PCI:{pci} Message:NVRM: Xid (PCI:{pci}): {xid}, "
        f"pid=4242, name=python, GPU has fallen off the bus."
    )
    cond = _condition(
        condition_type, "True", f"{condition_type}IsNotHealthy", message, heartbeat=True
    )
    kube.core.patch_node_status(
        node, {"status": {"conditions": _merge_conditions(status.get("conditions", []), [cond])}}
    )


def node_ready_status(kube: Kube, node: str) -> str | None:
    try:
        n = kube.core.read_node(node)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return next((c.status for c in n.status.conditions or [] if c.type == "Ready"), None)


def wait_pod_gone(kube: Kube, namespace: str, pod: str, timeout: float = 60.0) -> None:
    def gone() -> bool:
        try:
            kube.core.read_namespaced_pod(pod, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return True
            raise
        return False

    eventually(f"pod {namespace}/{pod} deleted", gone, timeout)


def sleep_until(deadline: float) -> None:
    time.sleep(max(0.0, deadline - time.monotonic()))
