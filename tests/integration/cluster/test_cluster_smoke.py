"""Smoke tests of the local cluster: real API server, JobSet, Kueue, scheduler, KWOK nodes."""

from __future__ import annotations

import time

import pytest

from e2e.cluster import kwok
from e2e.cluster.kube import eventually
from e2e.cluster.testenv import ClusterHandle, TestNamespace

pytestmark = pytest.mark.cluster


def _conditions(obj: dict) -> dict[str, dict]:
    return {c["type"]: c for c in obj.get("status", {}).get("conditions", [])}


def test_api_server_serves_jobset_and_kueue(rtj_cluster: ClusterHandle) -> None:
    kube = rtj_cluster.kube
    from kubernetes import client

    groups = {
        g.name: [v.version for v in g.versions]
        for g in client.ApisApi(kube.api).get_api_versions().groups
    }
    assert "v1alpha2" in groups["jobset.x-k8s.io"]
    assert {"v1beta1", "v1beta2"} <= set(groups["kueue.x-k8s.io"])
    version = client.VersionApi(kube.api).get_code()
    assert version.git_version.startswith("v1.35."), version.git_version
    nodes = kube.core.list_node(label_selector=kwok.GPU_PRODUCT_LABEL).items
    assert len(nodes) == rtj_cluster.nodes
    for n in nodes:
        assert n.status.allocatable[kwok.GPU_RESOURCE] == str(rtj_cluster.gpus_per_node)
        assert n.metadata.labels[kwok.ZONE_LABEL].startswith("e2e-zone-")
        assert n.metadata.labels[kwok.RACK_LABEL].startswith("rack-")
    assert len({n.metadata.labels[kwok.RACK_LABEL] for n in nodes}) > 1


def test_kueue_conversion_webhook_serves_v1beta1(rtj_ns: TestNamespace) -> None:
    cq = rtj_ns.kube.kueue_get("clusterqueues", rtj_ns.cluster_queue, version="v1beta1")
    assert cq["apiVersion"] == "kueue.x-k8s.io/v1beta1"
    assert cq["spec"]["resourceGroups"][0]["flavors"][0]["name"] == "gpu-h100"


def test_jobset_webhook_defaults_the_spec(rtj_ns: TestNamespace) -> None:
    js = rtj_ns.create_jobset(rtj_ns.jobset("defaults", replicas=1, queue=None))
    # JobSet's mutating webhook fills in the success policy and the startup policy
    assert js["spec"]["successPolicy"]["operator"] == "All"
    assert js["spec"]["startupPolicy"]["startupPolicyOrder"] == "AnyOrder"
    # ... and the pod template's restart policy stays ours
    tmpl = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert tmpl["restartPolicy"] == "Never"


@pytest.mark.gpu_quota(0)
def test_queued_jobset_stays_suspended_until_kueue_admits_it(rtj_ns: TestNamespace) -> None:
    created = rtj_ns.create_jobset(rtj_ns.jobset("gang", replicas=2, gpus_per_pod=8))
    assert created["spec"]["suspend"] is True  # Kueue's webhook suspended it on create
    wl = eventually("a Workload for the JobSet", lambda: rtj_ns.workloads(), 30)[0]
    time.sleep(2)
    assert rtj_ns.get_jobset("gang")["spec"]["suspend"] is True
    assert rtj_ns.pods() == []
    assert (
        _conditions(rtj_ns.kube.kueue_get("workloads", wl["metadata"]["name"], rtj_ns.name))
        .get("QuotaReserved", {})
        .get("status")
        != "True"
    )

    rtj_ns.set_gpu_quota(16)
    eventually(
        "JobSet unsuspended by Kueue",
        lambda: rtj_ns.get_jobset("gang")["spec"].get("suspend") is False,
        30,
    )
    pods = rtj_ns.wait_pods_running(2, "jobset.sigs.k8s.io/jobset-name=gang", timeout=60)
    nodes = {p.spec.node_name for p in pods}
    gpu_nodes = {
        n.metadata.name
        for n in rtj_ns.kube.core.list_node(label_selector=kwok.GPU_PRODUCT_LABEL).items
    }
    assert len(nodes) == 2 and nodes <= gpu_nodes
    for p in pods:
        # the flavor's node labels were injected by Kueue on admission
        assert p.spec.node_selector[kwok.GPU_PRODUCT_LABEL] == kwok.GPU_PRODUCT
    wl = rtj_ns.kube.kueue_get("workloads", wl["metadata"]["name"], rtj_ns.name)
    assert _conditions(wl)["Admitted"]["status"] == "True"
    eventually(
        "Workload PodsReady (waitForPodsReady)",
        lambda: (
            _conditions(rtj_ns.kube.kueue_get("workloads", wl["metadata"]["name"], rtj_ns.name))
            .get("PodsReady", {})
            .get("status")
            == "True"
        ),
        30,
    )


@pytest.mark.gpu_quota(8)
def test_quota_too_small_for_the_group_admits_none_of_it(rtj_ns: TestNamespace) -> None:
    rtj_ns.create_jobset(rtj_ns.jobset("toobig", replicas=2, gpus_per_pod=8))
    wl = eventually("a Workload for the JobSet", lambda: rtj_ns.workloads(), 30)[0]
    name = wl["metadata"]["name"]
    pending = eventually(
        "Kueue reports the workload pending for quota",
        lambda: (
            (
                c := _conditions(rtj_ns.kube.kueue_get("workloads", name, rtj_ns.name)).get(
                    "QuotaReserved"
                )
            )
            and c["status"] == "False"
            and c
        ),
        30,
    )
    assert "insufficient" in pending["message"].lower() or "quota" in pending["message"].lower()
    time.sleep(3)
    assert rtj_ns.get_jobset("toobig")["spec"]["suspend"] is True
    assert rtj_ns.pods() == []
    # JobSet may create its Jobs, but only suspended ones
    assert all(j.spec.suspend for j in rtj_ns.kube.batch.list_namespaced_job(rtj_ns.name).items)
