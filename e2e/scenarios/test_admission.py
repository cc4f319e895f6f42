"""Drills: getting in. The whole group is admitted by Kueue or none of it; malformed specs
are refused by the API server with field messages (as `kubectl apply` shows them); a job
whose queue does not exist says so in a condition instead of waiting silently."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from scenario_kueue import workload_condition, workload_of
from scenario_support import (
    WAIT,
    condition,
    wait_events,
    wait_running,
)

from e2e.cluster.build import kubectl
from e2e.cluster.kube import KUEUE_GROUP, KUEUE_VERSION
from e2e.operator_proc import events_of, jobsets_of, pods_of, rtj_body, rtj_status, wait_for
from rtj_operator.kube import Kube
from rtj_operator.kube_errors import Conflict

pytestmark = [pytest.mark.cluster, pytest.mark.operator]

JOB = "llm"
URI = "file:///mnt/ckpt/llm"


@pytest.mark.local_only
@pytest.mark.gpu_quota(16)
def test_a_gang_bigger_than_the_quota_creates_no_pod_until_all_of_it_fits(
    rtj_api: Kube, hkube: Any, rtj_ns: Any, run_operator: Any, timeline: Any
) -> None:
    ns = rtj_ns.name
    run_operator()
    tl = timeline(JOB)
    rtj_api.create_rtj(ns, rtj_body(JOB, ns, URI, replicas=4))  # 4 workers x 8 GPUs; quota 16

    def refused() -> dict[str, Any] | None:
        cond = workload_condition(workload_of(hkube, ns, f"{JOB}-a1"), "QuotaReserved")
        return cond if cond and cond["status"] == "False" and "insufficient" in cond["message"] \
            else None  # fmt: skip

    why = wait_for("Kueue to refuse the gang for lack of quota", refused, WAIT)
    assert "nvidia.com/gpu" in why["message"], why
    (js,) = jobsets_of(rtj_api, ns, JOB)
    assert js["spec"]["suspend"] is True
    assert pods_of(rtj_api, ns, JOB) == [] and tl.events("Pod") == [], "not a single pod"
    status = rtj_status(rtj_api, ns, JOB)
    assert status["phase"] == "Pending" and status["attempt"] == 1
    admitted = condition(status, "Admitted")
    assert admitted is not None and admitted["status"] == "False"
    assert admitted["reason"] == "AwaitingAdmission"

    rtj_ns.set_gpu_quota(32)
    pods = wait_running(rtj_api, ns, JOB, 1, 4)

    # admitted as a whole: one unsuspension, then all four pods, none before it
    unsuspended = next(s for s in tl.events("JobSet", "MODIFIED")
                       if s.obj["spec"].get("suspend") is False)  # fmt: skip
    created = tl.events("Pod", "ADDED")
    assert {s.name for s in created} == {p["metadata"]["name"] for p in pods}
    assert all(s.rv > unsuspended.rv for s in created)
    # one admission for the whole group (etcd order, not arrival times: those vary with load)
    later = [s for s in tl.events("JobSet", "MODIFIED") if s.rv > unsuspended.rv]
    assert not any(s.obj["spec"].get("suspend") for s in later), "admitted once, never suspended"
    workload = workload_of(hkube, ns, f"{JOB}-a1")
    assert workload is not None
    (assignment,) = workload["status"]["admission"]["podSetAssignments"]
    assert assignment["count"] == 4
    assert condition(rtj_status(rtj_api, ns, JOB), "Admitted")["status"] == "True"  # type: ignore[index]
    wait_events(rtj_api, ns, JOB, "AttemptAdmitted")


@pytest.mark.local_only
def test_a_job_whose_queue_does_not_exist_says_so_in_a_condition(
    rtj_api: Kube, hkube: Any, rtj_ns: Any, run_operator: Any
) -> None:
    ns = rtj_ns.name
    run_operator()
    rtj_api.create_rtj(ns, rtj_body(JOB, ns, URI, replicas=2, queueName="team-typo"))

    def reported() -> dict[str, Any] | None:
        cond = condition(rtj_status(rtj_api, ns, JOB), "Admitted")
        return cond if cond and cond["reason"] == "LocalQueueNotFound" else None

    cond = wait_for("the missing queue in a condition", reported, WAIT)
    assert cond["status"] == "False"
    assert f"LocalQueue team-typo does not exist in namespace {ns}" in cond["message"]
    # the Event goes out after the status patch that set the condition: wait for it too
    # (a flake: read at once, it was not there yet)
    event = wait_for("the LocalQueueNotFound Event", lambda: next(
        (e for e in events_of(rtj_api, ns, JOB) if e["reason"] == "LocalQueueNotFound"), None
    ), WAIT)  # fmt: skip
    assert event["type"] == "Warning" and "team-typo" in event["message"]
    assert pods_of(rtj_api, ns, JOB) == []
    assert rtj_status(rtj_api, ns, JOB)["phase"] == "Pending"

    # the platform team creates the queue: Kueue admits the group and it runs
    hkube.kueue_create(
        "localqueues",
        {"apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}", "kind": "LocalQueue",
         "metadata": {"name": "team-typo", "namespace": ns},
         "spec": {"clusterQueue": rtj_ns.cluster_queue}},
        namespace=ns,
    )  # fmt: skip
    wait_running(rtj_api, ns, JOB, 1, 2)
    admitted = condition(rtj_status(rtj_api, ns, JOB), "Admitted")
    assert admitted is not None and admitted["status"] == "True"


@pytest.mark.parametrize(
    ("name", "change", "messages"),
    [
        ("bad-uri", {"checkpoint": {"uri": "gs://bucket/x"}},
         ["spec.checkpoint.uri", "checkpoint.uri must start with s3:// or file://"]),
        ("bad-backoff", {"failurePolicy": {"backoff": {"initialSeconds": 60, "maxSeconds": 10}}},
         ["spec.failurePolicy.backoff", "backoff.initialSeconds must be <= backoff.maxSeconds"]),
        ("no-containers", {"template": {"spec": {"containers": []}}},
         ["spec.template", "template.spec.containers must list at least one container"]),
        ("zero-replicas", {"replicas": 0},
         ["spec.replicas", "should be greater than or equal to 1"]),
        ("typo", {"failurePolicy": {"maxRestart": 3}},
         ['unknown field "spec.failurePolicy.maxRestart"']),
        ("no-replicas", {"replicas": None}, ["spec.replicas", "Required value"]),
        ("a" * 40, {},
         ["metadata.name must be a DNS-1035 label of at most 36 characters"]),
    ],
    ids=["bad-uri", "bad-backoff", "no-containers", "zero-replicas", "unknown-field",
         "no-replicas", "long-name"],
)  # fmt: skip
def test_kubectl_apply_of_a_malformed_spec_is_refused_with_its_field_message(
    rtj_api: Kube, rtj_cluster: Any, rtj_ns: Any, tmp_path: Path,
    name: str, change: dict[str, Any], messages: list[str],
) -> None:  # fmt: skip
    body = rtj_body(name, rtj_ns.name, "s3://bucket/prefix")
    for key, value in change.items():
        if value is None:
            body["spec"].pop(key)
        else:
            body["spec"][key] = value
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump(body), encoding="utf-8")

    out = kubectl(rtj_cluster.kubeconfig, "apply", "-f", str(manifest))

    assert out.returncode != 0, out.stdout
    for message in messages:
        assert message in out.stderr, out.stderr
    assert rtj_api.list_rtjs(rtj_ns.name) == [], "nothing was stored"


@pytest.mark.local_only
def test_a_jobset_a_webhook_refuses_is_a_condition_naming_why_then_fixed(
    rtj_api: Kube, rtj_ns: Any, run_operator: Any
) -> None:
    """What the RTJ's own schema cannot know (a typo in the pod template is refused at
    create now: tests/integration/operator/test_crd_template_schema.py) but an admission
    webhook refuses: Kueue's JobSet webhook allows one topology request per pod set
    (pkg/controller/jobframework/tas_validation.go, v0.17.0). The refusal is a
    JobSetRejected condition and one Event, not a retry loop, and the fixed spec is tried
    again."""
    ns = rtj_ns.name
    run_operator()
    body = rtj_body(JOB, ns, URI)
    body["spec"]["template"]["metadata"] = {"annotations": {
        "kueue.x-k8s.io/podset-required-topology": "kubernetes.io/hostname",
        "kueue.x-k8s.io/podset-preferred-topology": "kubernetes.io/hostname",
    }}  # fmt: skip
    rtj_api.create_rtj(ns, body)

    def rejected() -> dict[str, Any] | None:
        cond = condition(rtj_status(rtj_api, ns, JOB), "Admitted")
        return cond if cond and cond.get("reason") == "JobSetRejected" else None

    cond = wait_for("the JobSetRejected condition", rejected, WAIT)
    assert "topology" in cond["message"], cond
    assert jobsets_of(rtj_api, ns, JOB) == []
    reasons = wait_events(rtj_api, ns, JOB, "JobSetRejected")
    assert reasons.count("JobSetRejected") == 1, reasons

    fixed = rtj_api.get_rtj(ns, JOB)
    del fixed["spec"]["template"]["metadata"]["annotations"][
        "kueue.x-k8s.io/podset-preferred-topology"
    ]
    del fixed["spec"]["template"]["metadata"]["annotations"][
        "kueue.x-k8s.io/podset-required-topology"
    ]
    path = f"/apis/training.resilient.dev/v1alpha1/namespaces/{ns}/resilienttrainingjobs/{JOB}"
    fixed["spec"]["suspend"] = True  # the template changes only while suspended (CEL)
    rtj_api.request("replace rtj", "PUT", path, fixed)
    for _ in range(10):  # the operator writes status meanwhile: read, change, retry
        resumed = rtj_api.get_rtj(ns, JOB)
        resumed["spec"]["suspend"] = False
        try:
            rtj_api.request("resume rtj", "PUT", path, resumed)
            break
        except Conflict:
            continue
    wait_running(rtj_api, ns, JOB, 1, 2)
