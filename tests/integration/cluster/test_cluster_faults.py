"""Each fault helper produces the status the real components would, and the real
controllers react to it."""

from __future__ import annotations

import time
from typing import Any

import pytest

from e2e.cluster import faults, kwok
from e2e.cluster.kube import eventually
from e2e.cluster.testenv import TestNamespace

pytestmark = pytest.mark.cluster

SELECTOR = "jobset.sigs.k8s.io/jobset-name=train"


def _running(rtj_ns: TestNamespace, replicas: int = 2) -> list[Any]:
    rtj_ns.create_jobset(rtj_ns.jobset("train", replicas=replicas, gpus_per_pod=8))
    return rtj_ns.wait_pods_running(replicas, SELECTOR, timeout=90)


def _pod_condition(pod: Any, ctype: str) -> Any:
    return next((c for c in pod.status.conditions or [] if c.type == ctype), None)


def _node_condition(rtj_ns: TestNamespace, node: str, ctype: str) -> Any:
    n = rtj_ns.kube.core.read_node(node)
    return next((c for c in n.status.conditions or [] if c.type == ctype), None)


def _taints(rtj_ns: TestNamespace, node: str) -> set[tuple[str, str]]:
    n = rtj_ns.kube.core.read_node(node)
    return {(t.key, t.effect) for t in n.spec.taints or []}


@pytest.mark.local_only  # a real kubelet reports OOMKilled only for a real OOM kill
def test_container_exit_is_reported_like_the_kubelet(rtj_ns: TestNamespace) -> None:
    pod = _running(rtj_ns)[0]
    name = pod.metadata.name
    faults.terminate_container(
        rtj_ns.kube,
        rtj_ns.name,
        name,
        exit_code=137,
        reason="OOMKilled",
        message="torch.OutOfMemoryError: CUDA out of memory",
    )
    time.sleep(2)  # KWOK must leave it alone
    p = rtj_ns.kube.core.read_namespaced_pod(name, rtj_ns.name)
    assert p.status.phase == "Failed"
    term = p.status.container_statuses[0].state.terminated
    assert term.exit_code == 137 and term.reason == "OOMKilled"
    assert "CUDA out of memory" in term.message
    assert term.finished_at is not None and term.started_at is not None
    assert _pod_condition(p, "Ready").status == "False"
    # the real Job and JobSet controllers react: backoffLimit 0, maxRestarts 0 -> Failed
    eventually(
        "JobSet Failed after the worker failed",
        lambda: any(
            c["type"] == "Failed" and c["status"] == "True"
            for c in rtj_ns.get_jobset("train").get("status", {}).get("conditions", [])
        ),
        60,
    )


def test_worker_exit_code_and_message_reach_the_pod_status(rtj_ns: TestNamespace) -> None:
    pod = _running(rtj_ns, 1)[0]
    status = faults.terminate_container(
        rtj_ns.kube,
        rtj_ns.name,
        pod.metadata.name,
        exit_code=3,
        message="NCCL watchdog: collective operation timeout",
    )
    term = status["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 3 and term["reason"] == "Error"
    assert "NCCL watchdog" in term["message"]
    eventually(
        "pod phase Failed",
        lambda: (
            rtj_ns.kube.core.read_namespaced_pod(pod.metadata.name, rtj_ns.name).status.phase
            == "Failed"
        ),
        30,
    )


def test_container_exit_with_on_failure_restarts_in_place(rtj_ns: TestNamespace) -> None:
    rtj_ns.create_jobset(rtj_ns.jobset("train", replicas=1, restart_policy="OnFailure"))
    pod = rtj_ns.wait_pods_running(1, SELECTOR)[0]
    status = faults.terminate_container(
        rtj_ns.kube, rtj_ns.name, pod.metadata.name, exit_code=1, message="Traceback: boom"
    )
    cs = status["containerStatuses"][0]
    assert cs["restartCount"] == 1
    assert cs["lastState"]["terminated"]["exitCode"] == 1
    if faults.backend() == "local":  # a real kubelet may still be in its restart back-off
        assert "running" in cs["state"] and "terminated" not in cs["state"]
        assert status.get("phase", "Running") == "Running"


def test_eviction_adds_disruption_target(rtj_ns: TestNamespace) -> None:
    pod = _running(rtj_ns)[0]
    # a finalizer lets us see the condition the API server writes before the pod goes
    rtj_ns.kube.core.patch_namespaced_pod(
        pod.metadata.name, rtj_ns.name, {"metadata": {"finalizers": ["e2e.resilient.dev/hold"]}}
    )
    faults.evict_pod(rtj_ns.kube, rtj_ns.name, pod.metadata.name)
    p = eventually(
        "DisruptionTarget on the evicted pod",
        lambda: (
            (q := rtj_ns.kube.core.read_namespaced_pod(pod.metadata.name, rtj_ns.name))
            and _pod_condition(q, "DisruptionTarget")
            and q
        ),
        30,
    )
    cond = _pod_condition(p, "DisruptionTarget")
    assert cond.status == "True" and cond.reason == "EvictionByEvictionAPI"
    assert p.metadata.deletion_timestamp is not None
    rtj_ns.kube.core.patch_namespaced_pod(
        pod.metadata.name, rtj_ns.name, {"metadata": {"finalizers": None}}
    )
    faults.wait_pod_gone(rtj_ns.kube, rtj_ns.name, pod.metadata.name)


def test_preemption_adds_disruption_target(rtj_ns: TestNamespace) -> None:
    pod = _running(rtj_ns)[0]
    rtj_ns.kube.core.patch_namespaced_pod(
        pod.metadata.name, rtj_ns.name, {"metadata": {"finalizers": ["e2e.resilient.dev/hold"]}}
    )
    faults.preempt_pod(rtj_ns.kube, rtj_ns.name, pod.metadata.name, grace_seconds=0)
    p = rtj_ns.kube.core.read_namespaced_pod(pod.metadata.name, rtj_ns.name)
    cond = _pod_condition(p, "DisruptionTarget")
    assert cond.status == "True" and cond.reason == "PreemptionByScheduler"
    assert p.metadata.deletion_timestamp is not None
    rtj_ns.kube.core.patch_namespaced_pod(
        pod.metadata.name, rtj_ns.name, {"metadata": {"finalizers": None}}
    )
    faults.wait_pod_gone(rtj_ns.kube, rtj_ns.name, pod.metadata.name)


@pytest.mark.local_only  # a real kubelet would post Ready=True again
def test_node_not_ready_is_tainted_by_the_node_lifecycle_controller(
    rtj_ns: TestNamespace,
) -> None:
    node = _running(rtj_ns, 1)[0].spec.node_name
    faults.node_not_ready(rtj_ns.kube, node)
    eventually(
        "not-ready taints from the node lifecycle controller",
        lambda: (
            {
                ("node.kubernetes.io/not-ready", "NoSchedule"),
                ("node.kubernetes.io/not-ready", "NoExecute"),
            }
            <= _taints(rtj_ns, node)
        ),
        30,
    )
    ready = _node_condition(rtj_ns, node, "Ready")
    assert ready.status == "False" and ready.reason == "KubeletNotReady"
    time.sleep(3)  # KWOK must not turn it Ready again
    assert faults.node_ready_status(rtj_ns.kube, node) == "False"


@pytest.mark.local_only  # on kind: stop the node's container (not automated yet)
def test_node_lost_goes_unknown_when_its_lease_expires(rtj_ns: TestNamespace) -> None:
    node = _running(rtj_ns, 1)[0].spec.node_name
    faults.node_lost(rtj_ns.kube, node, wait=True, timeout=90)
    ready = _node_condition(rtj_ns, node, "Ready")
    assert ready.status == "Unknown" and ready.reason == "NodeStatusUnknown"
    eventually(
        "unreachable taint",
        lambda: ("node.kubernetes.io/unreachable", "NoExecute") in _taints(rtj_ns, node),
        30,
    )
    # the pods on it are marked not ready by the node lifecycle controller
    pod = rtj_ns.pods(SELECTOR)[0]
    eventually(
        "pod Ready=False on the lost node",
        lambda: (
            _pod_condition(
                rtj_ns.kube.core.read_namespaced_pod(pod.metadata.name, rtj_ns.name), "Ready"
            ).status
            == "False"
        ),
        30,
    )


@pytest.mark.parametrize("via", ["condition", "label"])
def test_gpu_xid_appears_on_the_node(rtj_ns: TestNamespace, via: str) -> None:
    node = _running(rtj_ns, 1)[0].spec.node_name
    faults.gpu_xid(rtj_ns.kube, node, 79, via=via)
    time.sleep(2)
    if via == "condition":
        cond = _node_condition(rtj_ns, node, faults.XID_CONDITION_TYPE)
        assert cond.status == "True" and "ErrorCode:79" in cond.message
        assert faults.node_ready_status(rtj_ns.kube, node) == "True"
    else:
        labels = rtj_ns.kube.core.read_node(node).metadata.labels
        assert labels[faults.XID_LABEL_KEY] == "79"


@pytest.mark.local_only  # a live kubelet registers its Node again
def test_deleted_node_pods_are_garbage_collected(rtj_ns: TestNamespace) -> None:
    pod = _running(rtj_ns, 1)[0]
    node = pod.spec.node_name
    rtj_ns.kube.core.patch_namespaced_pod(
        pod.metadata.name, rtj_ns.name, {"metadata": {"finalizers": ["e2e.resilient.dev/hold"]}}
    )
    faults.delete_node(rtj_ns.kube, node)
    # PodGC deletes pods bound to a node that no longer exists (after its 40 s quarantine)
    p = eventually(
        "PodGC marks the orphaned pod",
        lambda: (
            (q := rtj_ns.kube.core.read_namespaced_pod(pod.metadata.name, rtj_ns.name))
            and q.metadata.deletion_timestamp
            and q
        ),
        120,
        interval=1,
    )
    cond = _pod_condition(p, "DisruptionTarget")
    assert cond is not None and cond.reason == "DeletionByPodGC"
    rtj_ns.kube.core.patch_namespaced_pod(
        pod.metadata.name, rtj_ns.name, {"metadata": {"finalizers": None}}
    )
    assert kwok.node_name(0).startswith(kwok.NODE_PREFIX)
