"""The operator against a real kube-apiserver, controller-manager, scheduler, KWOK nodes,
JobSet and Kueue (the e2e.cluster harness), with a real S3 API server for checkpoints.

Faults are injected the way the kubelet and node agents report them (e2e.cluster.faults).
"""

from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import faults
from e2e.operator_proc import (
    events_of,
    jobsets_of,
    pods_of,
    publish_steps,
    rtj_body,
    rtj_status,
    running_pods,
    wait_for,
)
from rtj_operator.api import keys
from rtj_operator.kube import Invalid, Kube

pytestmark = [pytest.mark.cluster, pytest.mark.operator]

XID_MESSAGE = (
    "RuntimeError: CUDA error: unspecified launch failure\n"
    "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus."
)


def _create(kube: Kube, body: dict[str, Any]) -> None:
    kube.create_rtj(body["metadata"]["namespace"], body)


def _taints(kube: Kube, node: str) -> list[dict[str, Any]]:
    return list((kube.get_node(node).get("spec") or {}).get("taints") or [])


# --- the CRD --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "change", "message"),
    [
        ("bad-uri", {"checkpoint": {"uri": "gs://bucket/x"}},
         "checkpoint.uri must start with s3:// or file://"),
        ("bad-backoff", {"failurePolicy": {"backoff": {"initialSeconds": 60, "maxSeconds": 10}}},
         "backoff.initialSeconds must be <= backoff.maxSeconds"),
        ("no-containers", {"template": {"spec": {"containers": []}}},
         "template.spec.containers must list at least one container"),
        ("zero-replicas", {"replicas": 0}, "spec.replicas"),
        ("a" * 40, {}, "metadata.name must be a DNS-1035 label of at most 36 characters"),
    ],
)  # fmt: skip
def test_invalid_specs_are_rejected_with_field_messages(
    rtj_api: Kube, rtj_ns: Any, name: str, change: dict[str, Any], message: str
) -> None:
    body = rtj_body(name, rtj_ns.name, "s3://bucket/prefix")
    body["spec"].update(change)
    with pytest.raises(Invalid) as err:
        _create(rtj_api, body)
    assert message in str(err.value)


def test_a_valid_spec_gets_its_defaults(rtj_api: Kube, rtj_ns: Any) -> None:
    _create(rtj_api, rtj_body("ok", rtj_ns.name, "s3://bucket/prefix"))
    spec = rtj_api.get_rtj(rtj_ns.name, "ok")["spec"]
    assert spec["nodeHealth"]["taintKey"] == keys.DEFAULT_TAINT_KEY
    assert spec["failurePolicy"]["maxRestarts"] == 5


# --- the loop ---------------------------------------------------------------------------------


def _start_running(
    kube: Kube, ns: str, name: str, uri: str, replicas: int = 2, **spec: Any
) -> list[dict[str, Any]]:
    _create(kube, rtj_body(name, ns, uri, replicas=replicas, **spec))
    pods = wait_for(
        "attempt 1's pods to run", lambda: running_pods(kube, ns, name, 1, replicas), 90
    )
    wait_for("phase Running", lambda: rtj_status(kube, ns, name).get("phase") == "Running", 30)
    return pods


def test_the_attempt_jobset_is_created_admitted_and_runs(
    rtj_api: Kube, rtj_ns: Any, run_operator: Any, s3_root: str, tmp_path: Path
) -> None:
    ns = rtj_ns.name
    publish_steps(s3_root, [100, 200], tmp_path, run_id=f"{ns}.llm")
    op = run_operator()
    _start_running(rtj_api, ns, "llm", s3_root)
    (js,) = jobsets_of(rtj_api, ns, "llm")
    assert js["metadata"]["name"] == "llm-a1"
    assert js["metadata"]["labels"][keys.KUEUE_QUEUE_LABEL] == "team-a"
    assert js["metadata"]["annotations"][keys.RESUME_STEP_ANNOTATION] == "200"
    assert js["spec"]["suspend"] is False, "Kueue admitted the whole group"
    status = rtj_status(rtj_api, ns, "llm")
    assert status["attempt"] == 1 and status["attempts"][0]["resumedFromStep"] == 200
    assert status["lastVerifiedCheckpoint"]["step"] == 200
    reasons = [e["reason"] for e in events_of(rtj_api, ns, "llm")]
    assert {"AttemptStarted", "AttemptAdmitted", "AttemptRunning"} <= set(reasons)
    meta = rtj_api.get_rtj(ns, "llm")["metadata"]
    assert not meta.get("finalizers"), "no finalizer: deleting a job never waits for the operator"
    assert not any(k.startswith("kopf.") for k in (meta.get("annotations") or {}))
    wait_for("job metrics", lambda: op.metric("rtj_jobs", phase="Running") == 1, 10)
    assert op.metric("rtj_checkpoint_last_verified_step", namespace=ns, name="llm") == 200
    assert op.metric("rtj_checkpoint_planned_interval_seconds", namespace=ns, name="llm") == 600


def test_gpu_fault_is_classified_quarantined_torn_down_and_restarted_from_the_pinned_step(
    rtj_api: Kube, rtj_cluster: Any, rtj_ns: Any, run_operator: Any, s3_root: str, tmp_path: Path
) -> None:
    ns = rtj_ns.name
    publish_steps(s3_root, [100], tmp_path, run_id=f"{ns}.llm")
    op = run_operator()
    pods = _start_running(rtj_api, ns, "llm", s3_root)
    publish_steps(s3_root, [300], tmp_path, run_id=f"{ns}.llm")  # the trainer checkpointed
    victim = next(p for p in pods if p["metadata"]["labels"][keys.JOB_COMPLETION_INDEX] == "1")
    node = victim["spec"]["nodeName"]
    faults.terminate_container(rtj_cluster.kube, ns, victim["metadata"]["name"], exit_code=1,
                               message=XID_MESSAGE)  # fmt: skip

    def classified() -> dict[str, Any] | None:
        first = (rtj_status(rtj_api, ns, "llm").get("attempts") or [{}])[0]
        return first if first.get("failureClass") else None

    record = wait_for("the classified attempt record", classified, 30)
    assert record["failureClass"] == "GPUFault"
    assert record["firstFailed"]["pod"] == victim["metadata"]["name"]
    assert record["firstFailed"]["node"] == node
    assert any("Xid" in line or "XID" in line for line in record["evidence"])
    taint = {"key": keys.DEFAULT_TAINT_KEY, "value": "llm", "effect": "NoSchedule"}
    assert taint in _taints(rtj_api, node)

    wait_for("attempt 2's pods to run", lambda: running_pods(rtj_api, ns, "llm", 2, 2), 90)
    names = [j["metadata"]["name"] for j in jobsets_of(rtj_api, ns, "llm")]
    assert names == ["llm-a2"], "the old JobSet is gone"
    assert all(
        p["metadata"]["labels"][keys.ATTEMPT_LABEL] == "2" for p in pods_of(rtj_api, ns, "llm")
    )
    (js,) = jobsets_of(rtj_api, ns, "llm")
    assert js["metadata"]["annotations"][keys.RESUME_STEP_ANNOTATION] == "300"
    assert all(p["spec"]["nodeName"] != node for p in running_pods(rtj_api, ns, "llm", 2, 2) or [])
    status = rtj_status(rtj_api, ns, "llm")
    assert status["restarts"]["infrastructure"] == 1
    assert status["attempts"][0]["recoverySeconds"] > 0
    assert status["attempts"][1]["resumedFromStep"] == 300
    assert [q["node"] for q in status["quarantinedNodes"]] == [node]
    reasons = [e["reason"] for e in events_of(rtj_api, ns, "llm")]
    assert {"NodesQuarantined", "RestartScheduled"} <= set(reasons)
    assert op.metric("rtj_restarts_total", namespace=ns, name="llm", **{"class": "GPUFault"}) == 1
    assert op.metric("rtj_failures_total", namespace=ns, name="llm", **{"class": "GPUFault"}) == 1
    assert op.metric("rtj_quarantined_nodes", namespace=ns, name="llm") == 1
    assert op.metric("rtj_detection_seconds_count", **{"class": "GPUFault"}) == 1


def test_user_errors_fail_fast_without_tainting(
    rtj_api: Kube, rtj_cluster: Any, rtj_ns: Any, run_operator: Any, tmp_path: Path
) -> None:
    ns = rtj_ns.name
    run_operator()
    pods = _start_running(rtj_api, ns, "llm", "file:///mnt/ckpt/llm")
    traceback = "Traceback (most recent call last):\nKeyError: 'lr'"
    victim = pods[0]["metadata"]["name"]
    faults.terminate_container(rtj_cluster.kube, ns, victim, exit_code=1, message=traceback)
    wait_for("phase Failed", lambda: rtj_status(rtj_api, ns, "llm").get("phase") == "Failed", 30)
    status = rtj_status(rtj_api, ns, "llm")
    assert status["attempts"][0]["failureClass"] == "UserError"
    assert not status.get("quarantinedNodes")
    for p in pods:
        assert not any(
            t["key"] == keys.DEFAULT_TAINT_KEY for t in _taints(rtj_api, p["spec"]["nodeName"])
        )


def test_an_unreadable_store_blocks_the_start_instead_of_starting_fresh(
    rtj_api: Kube, rtj_ns: Any, run_operator: Any, s3_root: str, s3_server: Any
) -> None:
    ns = rtj_ns.name
    denied = s3_server.denied
    secret = {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "ckpt-denied", "namespace": ns},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in {
            "AWS_ACCESS_KEY_ID": denied.access_key_id,
            "AWS_SECRET_ACCESS_KEY": denied.secret_access_key,
            "AWS_ENDPOINT_URL_S3": s3_server.url, "AWS_DEFAULT_REGION": "us-east-1"}.items()},
    }  # fmt: skip
    rtj_api.request("create secret", "POST", f"/api/v1/namespaces/{ns}/secrets", secret)
    run_operator()
    _create(rtj_api, rtj_body("llm", ns, s3_root, checkpoint={
        "uri": s3_root, "credentialsSecret": "ckpt-denied"}))  # fmt: skip

    def blocked() -> dict[str, Any] | None:
        conds = rtj_status(rtj_api, ns, "llm").get("conditions") or []
        return next(
            (c for c in conds if c["type"] == "CheckpointUnreadable" and c["status"] == "True"),
            None,
        )

    cond = wait_for("the CheckpointUnreadable condition", blocked, 30)
    assert "cannot be read" in cond["message"]
    time.sleep(2)
    assert jobsets_of(rtj_api, ns, "llm") == [], "no attempt started from scratch"
    assert "CheckpointStoreUnreadable" in [e["reason"] for e in events_of(rtj_api, ns, "llm")]


# --- crashes and replicas -----------------------------------------------------------------------


def test_an_operator_killed_mid_restart_converges_after_it_restarts(
    rtj_api: Kube, rtj_cluster: Any, rtj_ns: Any, run_operator: Any
) -> None:
    ns = rtj_ns.name
    op = run_operator()
    backoff = {"backoff": {"initialSeconds": 4, "maxSeconds": 4}}
    pods = _start_running(rtj_api, ns, "llm", "file:///mnt/ckpt/llm", failurePolicy=backoff)
    faults.terminate_container(rtj_cluster.kube, ns, pods[0]["metadata"]["name"], exit_code=1,
                               message="NCCL error: remote process exited")  # fmt: skip
    wait_for(
        "phase Restarting", lambda: rtj_status(rtj_api, ns, "llm").get("phase") == "Restarting", 30
    )
    op.kill()  # mid-restart: the failure is recorded, the next attempt not started

    time.sleep(5)  # the backoff expires while no operator runs
    op.start()
    wait_for("attempt 2's pods to run", lambda: running_pods(rtj_api, ns, "llm", 2, 2), 90)
    op.kill()  # and once more, right after it started attempt 2
    op.start()
    time.sleep(3)
    status = rtj_status(rtj_api, ns, "llm")
    assert status["attempt"] == 2 and status["phase"] == "Running"
    assert status["restarts"]["infrastructure"] == 1, "the restart is counted once"
    assert [j["metadata"]["name"] for j in jobsets_of(rtj_api, ns, "llm")] == ["llm-a2"]
    assert {p["metadata"]["labels"][keys.ATTEMPT_LABEL] for p in pods_of(rtj_api, ns, "llm")} == {
        "2"
    }


def test_two_replicas_one_leads_and_the_standby_takes_over(
    rtj_api: Kube, rtj_cluster: Any, rtj_ns: Any, run_operator: Any
) -> None:
    ns = rtj_ns.name
    leader = run_operator()
    standby = run_operator(wait_leading=False)
    time.sleep(2)
    assert "leading as" not in standby.log()
    pods = _start_running(rtj_api, ns, "llm", "file:///mnt/ckpt/llm")
    leader.kill()
    wait_for("the standby to lead", lambda: "leading as" in standby.log(), 30)
    faults.terminate_container(rtj_cluster.kube, ns, pods[1]["metadata"]["name"], exit_code=1,
                               message="NCCL error: remote process exited")  # fmt: skip
    wait_for("attempt 2's pods to run", lambda: running_pods(rtj_api, ns, "llm", 2, 2), 90)
    assert rtj_status(rtj_api, ns, "llm")["restarts"]["infrastructure"] == 1
