"""Kueue's own preemption, nothing written on its behalf: a more urgent workload (a
``WorkloadPriorityClass`` above the victim's) arrives in the same ClusterQueue needing all its
quota, Kueue evicts the victim's Workload to admit it, and the urgent work leaves after a hold
(``kueue_preempt``; the ClusterQueue needs ``enable_kueue_preemption``).
``kueue_preemptor_leaks``: what such urgent work left behind.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

from . import kwok
from .kube import KUEUE_GROUP, KUEUE_VERSION, Kube

Obj = dict[str, Any]

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
URGENT_LABEL = "e2e.resilient.dev/urgent"
"""On the urgent workload's Job and pods (what `kueue_preemptor_leaks` looks for)."""


def enable_kueue_preemption(kube: Kube, cluster_queue: str) -> None:
    """``withinClusterQueue: LowerPriority`` on a ClusterQueue: a pending workload may evict
    workloads of a strictly lower priority in it (with one priority level, none ever is)."""
    kube.custom.patch_cluster_custom_object(
        KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", cluster_queue,
        {"spec": {"preemption": {"withinClusterQueue": "LowerPriority"}}},
    )  # fmt: skip


def cluster_queue_quota(kube: Kube, cluster_queue: str, resource: str = kwok.GPU_RESOURCE) -> int:
    """The ClusterQueue's nominal quota of ``resource`` (every flavor together)."""
    cq = kube.kueue_get("clusterqueues", cluster_queue)
    return sum(
        int(r["nominalQuota"])
        for rg in cq["spec"].get("resourceGroups") or []
        for fl in rg.get("flavors") or []
        for r in fl.get("resources") or []
        if r["name"] == resource
    )


def urgent_job(
    namespace: str,
    queue: str,
    name: str,
    priority_class: str,
    *,
    pods: int,
    gpus_per_pod: int,
    command: tuple[str, ...] = ("sleep", "3600"),
    image: str = "busybox:1.36",
) -> Obj:
    """A batch Job queued in ``queue`` at ``priority_class``: ``pods`` pods of
    ``gpus_per_pod`` GPUs each (one per node, like a training job), created suspended (Kueue
    unsuspends it once admitted)."""
    labels = {QUEUE_LABEL: queue, PRIORITY_CLASS_LABEL: priority_class, URGENT_LABEL: name}
    container = {
        "name": "work",
        "image": image,
        "command": list(command),
        "resources": {
            "requests": {kwok.GPU_RESOURCE: str(gpus_per_pod), "cpu": "1", "memory": "1Gi"},
            "limits": {kwok.GPU_RESOURCE: str(gpus_per_pod)},
        },
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "suspend": True,
            "parallelism": pods,
            "completions": pods,
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {URGENT_LABEL: name}},
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 5,
                    "containers": [container],
                },
            },
        },
    }


@dataclass(frozen=True)
class Preemption:
    """What one ``kueue_preempt`` did, as Unix times (``time.time()``)."""

    name: str
    pods: int
    gpus_per_pod: int
    priority: int
    created: float
    """The urgent Job created."""
    admitted: float | None
    """Its Workload admitted (the victim evicted to make room); None: not within the
    timeout (nothing was preempted)."""
    released: float
    """Its Job deleted (the hold over)."""
    gone: float | None
    """Its pods, Job and Workload gone (the quota free again); None: not within the
    timeout."""


def _workload_of_job(kube: Kube, namespace: str, job: str) -> Obj | None:
    for wl in kube.kueue_list("workloads", namespace):
        owners = wl["metadata"].get("ownerReferences") or []
        if any(o.get("kind") == "Job" and o.get("name") == job for o in owners):
            return wl
    return None


def _admitted(wl: Obj | None) -> bool:
    conditions = ((wl or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Admitted" and c.get("status") == "True" for c in conditions)


def kueue_preempt(
    kube: Kube,
    namespace: str,
    queue: str,
    cluster_queue: str,
    *,
    hold: float,
    name: str = "urgent",
    priority: int = 1000,
    gpus_per_pod: int = 8,
    timeout: float = 120.0,
) -> Preemption:
    """Make Kueue preempt what runs in ``cluster_queue``: a WorkloadPriorityClass ``name``
    of value ``priority`` and a Job ``name`` at that priority needing the queue's whole GPU
    quota (in pods of ``gpus_per_pod``), so Kueue can admit it only by evicting every
    lower-priority workload; ``hold`` seconds after it is admitted, the Job goes
    (foreground: its pods first), then its priority class. Blocks until then; a wait longer
    than ``timeout`` is given up (``admitted`` or ``gone`` None), not raised, and the
    objects are deleted whatever happens: ``kueue_preemptor_leaks`` finds what stayed."""
    gpus = cluster_queue_quota(kube, cluster_queue)
    pods = max(-(-gpus // gpus_per_pod), 1)
    with_class = {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
        "kind": "WorkloadPriorityClass",
        "metadata": {"name": name, "labels": {URGENT_LABEL: name}},
        "value": priority,
        "description": "urgent work (a soak's preemption)",
    }
    kube.kueue_create("workloadpriorityclasses", with_class)
    try:
        created = time.time()
        batch: Any = kube.batch  # the body is a plain dict
        batch.create_namespaced_job(
            namespace,
            urgent_job(namespace, queue, name, name, pods=pods, gpus_per_pod=gpus_per_pod),
        )
        admitted = _first_time(lambda: _admitted(_workload_of_job(kube, namespace, name)), timeout)
        if admitted is not None:
            time.sleep(max(hold - (time.time() - admitted), 0.0))
    finally:
        released = time.time()
        try:
            with _suppress_not_found():
                kube.batch.delete_namespaced_job(name, namespace, propagation_policy="Foreground")
            gone = _first_time(
                lambda: (
                    not _job_exists(kube, namespace, name)
                    and _workload_of_job(kube, namespace, name) is None
                ),
                timeout,
            )
        finally:
            with _suppress_not_found():
                kube.custom.delete_cluster_custom_object(
                    KUEUE_GROUP, KUEUE_VERSION, "workloadpriorityclasses", name
                )
    return Preemption(name, pods, gpus_per_pod, priority, created, admitted, released, gone)


def _first_time(done: Callable[[], bool], timeout: float, every: float = 0.2) -> float | None:
    """The time (``time.time()``) ``done`` was first seen true; None: not within ``timeout``
    (an API error counts as not yet)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(ApiException):
            if done():
                return time.time()
        time.sleep(every)
    return None


@contextlib.contextmanager
def _suppress_not_found() -> Iterator[None]:
    try:
        yield
    except ApiException as exc:
        if exc.status != 404:
            raise


def _job_exists(kube: Kube, namespace: str, name: str) -> bool:
    try:
        kube.batch.read_namespaced_job(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def kueue_preemptor_leaks(kube: Kube, namespace: str) -> list[str]:
    """What ``kueue_preempt`` left behind: urgent Jobs, their pods and Workloads, urgent
    WorkloadPriorityClasses."""
    api: Any = kube.api
    jobs = api.sanitize_for_serialization(
        kube.batch.list_namespaced_job(namespace, label_selector=URGENT_LABEL)
    )
    pods = api.sanitize_for_serialization(
        kube.core.list_namespaced_pod(namespace, label_selector=URGENT_LABEL)
    )
    out = [f"Job {j['metadata']['name']}" for j in jobs.get("items") or []]
    out += [f"pod {p['metadata']['name']}" for p in pods.get("items") or []]
    for wl in kube.kueue_list("workloads", namespace):
        owners = wl["metadata"].get("ownerReferences") or []
        if any(o.get("kind") == "Job" for o in owners):
            out.append(f"Workload {wl['metadata']['name']}")
    custom: Any = kube.custom
    classes = custom.list_cluster_custom_object(
        KUEUE_GROUP, KUEUE_VERSION, "workloadpriorityclasses", label_selector=URGENT_LABEL
    )
    out += [f"WorkloadPriorityClass {c['metadata']['name']}" for c in classes.get("items") or []]
    return out
