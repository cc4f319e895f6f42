"""The operator against a real kube-apiserver, controller-manager, scheduler, KWOK nodes,
JobSet and Kueue (the e2e.cluster harness), with a real S3 API server for checkpoints: the
CRD's defaults, one attempt's JobSet from creation to Running, and leader election.

The fault drills (GPU fault, lost node, user error, OOM, preemption, budget, corrupt or
unreachable checkpoints, bad input, operator crashes) live in e2e/scenarios.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import faults
from e2e.operator_proc import (
    events_of,
    harness_broken,
    jobsets_of,
    publish_steps,
    rtj_body,
    rtj_status,
    running_pods,
    wait_for,
)
from rtj_operator.api import keys
from rtj_operator.kube import Kube

pytestmark = [pytest.mark.cluster, pytest.mark.operator]


def _probe(operator: Any, path: str) -> tuple[int, str]:
    """What the kubelet's probe would get from the operator's health port."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{operator.health_port}{path}") as r:
            return r.status, r.read().decode().strip()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode().strip()


def _create(kube: Kube, body: dict[str, Any]) -> None:
    kube.create_rtj(body["metadata"]["namespace"], body)


# --- the CRD --------------------------------------------------------------------------------


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
        "attempt 1's pods to run",
        lambda: running_pods(kube, ns, name, 1, replicas),
        90,
        impossible=lambda: harness_broken(kube),
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
    # the events follow the status they report (intent first): the Running event may land
    # a moment after phase Running (CI, stop 25)
    wanted = {"AttemptStarted", "AttemptAdmitted", "AttemptRunning"}
    wait_for(
        "the attempt's events",
        lambda: wanted <= {e["reason"] for e in events_of(rtj_api, ns, "llm")},
        15,
    )
    meta = rtj_api.get_rtj(ns, "llm")["metadata"]
    assert not meta.get("finalizers"), "no finalizer: deleting a job never waits for the operator"
    assert not any(k.startswith("kopf.") for k in (meta.get("annotations") or {}))
    wait_for("job metrics", lambda: op.metric("rtj_jobs", phase="Running") == 1, 10)
    assert op.metric("rtj_checkpoint_last_verified_step", namespace=ns, name="llm") == 200
    assert op.metric("rtj_checkpoint_planned_interval_seconds", namespace=ns, name="llm") == 600


# --- replicas ------------------------------------------------------------------------------------


def test_two_replicas_one_leads_and_the_standby_takes_over(
    rtj_api: Kube, rtj_cluster: Any, rtj_ns: Any, run_operator: Any
) -> None:
    ns = rtj_ns.name
    leader = run_operator()
    standby = run_operator(wait_leading=False)
    time.sleep(2)
    assert "leading as" not in standby.log()
    assert _probe(standby, "/readyz") == (200, "ok: standby: waiting for the leader-election Lease")
    assert _probe(standby, "/healthz")[0] == 200
    pods = _start_running(rtj_api, ns, "llm", "file:///mnt/ckpt/llm")
    assert _probe(leader, "/readyz") == (200, "ok: leading; caches synced")
    leader.kill()
    wait_for("the standby to lead", lambda: "leading as" in standby.log(), 30)
    wait_for("the new leader ready", lambda: "leading" in _probe(standby, "/readyz")[1], 30)
    faults.terminate_container(rtj_cluster.kube, ns, pods[1]["metadata"]["name"], exit_code=1,
                               message="NCCL error: remote process exited")  # fmt: skip
    wait_for("attempt 2's pods to run", lambda: running_pods(rtj_api, ns, "llm", 2, 2), 90)
    assert rtj_status(rtj_api, ns, "llm")["restarts"]["infrastructure"] == 1
