"""The real install: `helm install` of the chart with the operator image `make images` built,
on the harness's real node (kubelet + containerd, e2e/cluster/real_node.py), in a namespace
enforcing restricted Pod Security. Both replicas run in real containers under the chart's
ServiceAccount, reach the API server at the `kubernetes` Service as any in-cluster client,
pass the kubelet's probes, and one leads; when the leader's pod is killed (SIGKILL, no
release of the Lease), the standby takes the Lease over."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from rtj_chart import CHART, helm, set_args

from e2e.cluster.real_node import LABEL, TAINT, RealNode
from e2e.operator_proc import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.local_only, pytest.mark.timeout(420)]

RELEASE = "rtj"
FULLNAME = "rtj-resilient-training-operator"


@pytest.fixture
def release(rtj_real_node: RealNode, rtj_cluster: Any, tmp_path: Path) -> Iterator[str]:
    core = rtj_cluster.kube.core
    ns = f"rtj-real-{uuid.uuid4().hex[:6]}"
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(
        name=ns,
        labels={"pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest"},
    )))  # fmt: skip
    values = {
        "image": {"pullPolicy": "Never"},  # imported into the node's containerd, no registry
        "nodeSelector": {LABEL: "true"},
        "tolerations": [{**TAINT, "operator": "Equal"}],
        "operator": {"progressPollSeconds": 0},
    }
    kubeconfig = rtj_cluster.kubeconfig
    try:
        helm("install", RELEASE, str(CHART), "--namespace", ns, "--kubeconfig", kubeconfig,
             *set_args(values, tmp_path), "--wait", "--timeout", "180s", timeout=240)  # fmt: skip
        yield ns
    finally:
        helm("uninstall", RELEASE, "--namespace", ns, "--kubeconfig", kubeconfig, "--wait",
             "--timeout", "60s", check=False, timeout=90)  # fmt: skip
        core.delete_namespace(ns)


def _holder(rtj_cluster: Any, ns: str) -> str | None:
    try:
        lease = rtj_cluster.kube.coord.read_namespaced_lease(FULLNAME, ns)
    except k8s.ApiException:
        return None
    return lease.spec.holder_identity  # type: ignore[no-any-return]


def test_the_chart_runs_our_operator_image_on_a_real_node_and_the_standby_takes_over(
    release: str, rtj_real_node: RealNode, rtj_cluster: Any
) -> None:
    core, ns = rtj_cluster.kube.core, release
    pods = core.list_namespaced_pod(ns, label_selector=f"app.kubernetes.io/instance={RELEASE}")
    assert len(pods.items) == 2
    for pod in pods.items:
        assert pod.spec.node_name == rtj_real_node.name
        status = pod.status.container_statuses[0]
        assert status.ready and status.image == rtj_real_node.refs["rtj-operator"], status
        assert status.restart_count == 0, f"{pod.metadata.name} restarted: {status}"
    names = {p.metadata.name for p in pods.items}
    try:
        leader = wait_for("a leader", lambda: _holder(rtj_cluster, ns), 60)
    except TimeoutError as exc:
        logs = {n: rtj_real_node.container_log(ns, n, "operator")[-3000:] for n in names}
        raise AssertionError(f"{exc}; the operators' logs: {logs}") from exc
    assert leader in names

    core.delete_namespaced_pod(leader, ns, grace_period_seconds=0)  # SIGKILL: no release
    standby = (names - {leader}).pop()
    # the Lease expires after leaseDurationSeconds (15) unrenewed; the standby retries every 2
    wait_for("the standby to lead", lambda: _holder(rtj_cluster, ns) == standby, 90)
