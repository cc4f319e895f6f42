"""Kueue in the drills: a JobSet's Workload and its conditions, a WorkloadPriorityClass for
an urgent workload, preemption within the test's ClusterQueue.

Imported by the scenario tests by this name (pytest puts this folder on ``sys.path``; like the
unit tests' support modules, it has a name no other module uses).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from kubernetes.client.exceptions import ApiException

from e2e.cluster.kube import KUEUE_GROUP, KUEUE_VERSION
from e2e.cluster.kube import Kube as HarnessKube

Obj = dict[str, Any]


def workload_of(kube: HarnessKube, namespace: str, jobset: str) -> Obj | None:
    for wl in kube.kueue_list("workloads", namespace):
        owners = wl["metadata"].get("ownerReferences") or []
        if any(o.get("kind") == "JobSet" and o.get("name") == jobset for o in owners):
            return wl
    return None


def workload_condition(wl: Obj | None, type_: str) -> Obj | None:
    if wl is None:
        return None
    return next((c for c in (wl.get("status") or {}).get("conditions") or []
                 if c.get("type") == type_), None)  # fmt: skip


@contextlib.contextmanager
def priority_class(kube: HarnessKube, name: str, value: int) -> Iterator[str]:
    """A cluster-wide Kueue WorkloadPriorityClass, removed afterwards."""
    kube.kueue_create(
        "workloadpriorityclasses",
        {"apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}", "kind": "WorkloadPriorityClass",
         "metadata": {"name": name}, "value": value,
         "description": "a drill's urgent workload"},
    )  # fmt: skip
    try:
        yield name
    finally:
        with contextlib.suppress(ApiException):
            kube.custom.delete_cluster_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, "workloadpriorityclasses", name
            )


def enable_preemption(kube: HarnessKube, cluster_queue: str) -> None:
    """``withinClusterQueue: LowerPriority`` on the test's ClusterQueue."""
    kube.custom.patch_cluster_custom_object(
        KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", cluster_queue,
        {"spec": {"preemption": {"withinClusterQueue": "LowerPriority"}}},
    )  # fmt: skip
