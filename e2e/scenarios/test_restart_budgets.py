"""Drills: what restarts cost. A Kueue preemption restarts the job without spending
`maxRestarts` and the job is readmitted when quota frees; infrastructure failures wait out
a growing backoff and end in Failed once `maxRestarts` is spent."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import pytest
from scenario_kueue import enable_preemption, priority_class
from scenario_support import (
    WAIT,
    by_rank,
    condition_true,
    failed_record,
    start_job,
    wait_events,
    wait_phase,
    wait_running,
)

from e2e.cluster import faults
from e2e.operator_proc import jobsets_of, pods_of, rtj_body, rtj_status, wait_for
from rtj_operator.api import keys
from rtj_operator.kube import Kube

pytestmark = [pytest.mark.cluster, pytest.mark.operator, pytest.mark.local_only]

JOB = "llm"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
NCCL_ERROR = (
    "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, "
    "unhandled system error, NCCL version 2.21.5\n"
    "ncclSystemError: System call (e.g. socket, malloc) or external library call failed"
)


def _time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


@pytest.mark.gpu_quota(16)
def test_a_kueue_preemption_is_free_and_the_job_is_readmitted_when_quota_frees(
    rtj_api: Kube, hkube: Any, rtj_ns: Any, run_operator: Any
) -> None:
    ns = rtj_ns.name
    enable_preemption(hkube, rtj_ns.cluster_queue)
    with priority_class(hkube, f"urgent-{ns}"[:63], 1000) as urgent_class:
        op = run_operator()
        policy = {"maxRestarts": 1, "backoff": {"initialSeconds": 1, "maxSeconds": 5}}
        start_job(rtj_api, ns, JOB, "file:///mnt/ckpt/llm", replicas=2, failurePolicy=policy)

        # a more urgent workload arrives in the same ClusterQueue, which the job fills
        urgent = rtj_ns.jobset("urgent", replicas=2)
        urgent["metadata"]["labels"][PRIORITY_LABEL] = urgent_class  # queued in team-a too
        rtj_ns.create_jobset(urgent)

        record = failed_record(rtj_api, ns, JOB, 1)
        assert record["failureClass"] == "Preempted", record
        assert record["failureCategory"] == "preemption"
        assert any("Preempted to accommodate" in line for line in record["evidence"]), record
        rtj_ns.wait_pods_running(2, "jobset.sigs.k8s.io/jobset-name=urgent", timeout=WAIT)

        def waiting_for_quota() -> dict[str, Any] | None:
            # the JobSet is created before the status patch that records attempt 2 (a
            # replica that crashes in between adopts it): wait for both (a flake: the
            # JobSet was seen while the status still said attempt 1)
            js = [j for j in jobsets_of(rtj_api, ns, JOB) if j["metadata"]["name"] == f"{JOB}-a2"]
            recorded = rtj_status(rtj_api, ns, JOB).get("attempt") == 2
            return js[0] if js and js[0]["spec"].get("suspend") and recorded else None

        wait_for("attempt 2 queued behind the urgent workload", waiting_for_quota, WAIT)
        status = rtj_status(rtj_api, ns, JOB)
        assert status["attempt"] == 2 and status["phase"] == "Pending"
        assert status["restarts"]["preemption"] == 1
        assert status["restarts"]["infrastructure"] == 0, "a preemption spends no maxRestarts"
        assert not [p for p in pods_of(rtj_api, ns, JOB)
                    if p["metadata"]["labels"][keys.ATTEMPT_LABEL] == "2"]  # fmt: skip
        assert op.metric("rtj_restart_budget_remaining", namespace=ns, name=JOB) == 1

        # the urgent work is done: Kueue admits attempt 2 as a whole
        hkube.custom.delete_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", ns, "jobsets", "urgent", propagation_policy="Background"
        )
        wait_running(rtj_api, ns, JOB, 2, 2)
        status = rtj_status(rtj_api, ns, JOB)
        assert status["restarts"]["infrastructure"] == 0
        reasons = wait_events(rtj_api, ns, JOB, "AttemptAdmitted", count=2)
        assert reasons.count("AttemptAdmitted") == 2
        assert op.metric("rtj_restarts_total", namespace=ns, name=JOB,
                         **{"class": "Preempted", "scope": "world"}) == 1  # fmt: skip


def test_the_third_infrastructure_failure_spends_max_restarts_after_growing_backoffs(
    rtj_api: Kube, hkube: Any, rtj_ns: Any, run_operator: Any, timeline: Any
) -> None:
    ns = rtj_ns.name
    op = run_operator()
    tl = timeline(JOB)
    initial = 2
    policy = {"maxRestarts": 2, "backoff": {"initialSeconds": initial, "maxSeconds": 30}}
    start_job(rtj_api, ns, JOB, "file:///mnt/ckpt/llm", replicas=2, failurePolicy=policy)

    gaps: list[float] = []
    for attempt in (1, 2, 3):
        pods = by_rank(wait_running(rtj_api, ns, JOB, attempt, 2))
        failed_at = time.monotonic()
        faults.terminate_container(hkube, ns, pods[0]["metadata"]["name"], exit_code=1,
                                   message=NCCL_ERROR)  # fmt: skip
        if attempt == 3:
            break
        created = wait_for(f"JobSet of attempt {attempt + 1}",
                           lambda n=attempt + 1: tl.first("JobSet", "ADDED", f"{JOB}-a{n}"),
                           WAIT)  # fmt: skip
        gaps.append(created.at - failed_at)
    backoffs = [initial, initial * 2]  # initial * 2^(restarts so far)
    for gap, backoff in zip(gaps, backoffs, strict=True):
        # never before the backoff; the upper bound only catches a wrong backoff (a busy
        # machine adds seconds of scheduling and watch latency on top)
        assert backoff <= gap < backoff + 60, (gaps, backoffs)

    status = wait_phase(rtj_api, ns, JOB, "Failed")
    assert [r["failureClass"] for r in status["attempts"]] == ["NetworkFault"] * 3
    assert status["restarts"]["infrastructure"] == 2
    failed = condition_true(status, "Failed")
    assert failed is not None and failed["reason"] == "RestartBudgetExhausted"
    assert "restart budget spent (2 of 2)" in failed["message"]
    for before, after in zip(status["attempts"], status["attempts"][1:], strict=False):
        assert _time(after["startedAt"]) >= _time(before["endedAt"])
    assert tl.names("JobSet", 4) == set()
    assert op.metric("rtj_restart_budget_remaining", namespace=ns, name=JOB) == 0
    assert op.metric("rtj_restarts_total", namespace=ns, name=JOB,
                     **{"class": "NetworkFault", "scope": "world"}) == 2  # fmt: skip


@pytest.mark.gpu_quota(16)
def test_a_priority_class_on_the_job_preempts_lower_priority_work_through_kueue(
    rtj_api: Kube, hkube: Any, rtj_ns: Any, run_operator: Any
) -> None:
    ns = rtj_ns.name
    enable_preemption(hkube, rtj_ns.cluster_queue)
    with priority_class(hkube, f"urgent-{ns}"[:63], 1000) as urgent_class:
        # lower-priority work fills the ClusterQueue first
        filler = rtj_ns.jobset("filler", replicas=2)
        rtj_ns.create_jobset(filler)
        rtj_ns.wait_pods_running(2, "jobset.sigs.k8s.io/jobset-name=filler", timeout=WAIT)
        run_operator()
        body = rtj_body(JOB, ns, "file:///mnt/ckpt/llm", replicas=2)
        body["metadata"]["labels"] = {PRIORITY_LABEL: urgent_class}  # the user's, on the RTJ
        rtj_api.create_rtj(ns, body)

        js = wait_for(
            "attempt 1's JobSet",
            lambda: next(iter(j for j in jobsets_of(rtj_api, ns, JOB)), None),
            WAIT,
        )
        assert js["metadata"]["labels"][PRIORITY_LABEL] == urgent_class
        wait_running(rtj_api, ns, JOB, 1, 2)  # admitted by preempting the filler

        def filler_preempted() -> dict[str, Any] | None:
            for wl in rtj_ns.workloads():
                if "filler" not in wl["metadata"]["name"]:
                    continue
                for c in (wl.get("status") or {}).get("conditions") or []:
                    if c["type"] == "Evicted" and c["status"] == "True":
                        return dict(c)
            return None

        evicted = wait_for("the filler's Workload evicted", filler_preempted, WAIT)
        assert evicted["reason"] == "Preempted", evicted
        workload = next(w for w in rtj_ns.workloads() if f"{JOB}-a1" in w["metadata"]["name"])
        spec = workload["spec"]  # Kueue v1beta2 (v0.17): priorityClassRef, not ...Name
        assert (spec["priorityClassRef"]["kind"], spec["priorityClassRef"]["name"]) == (
            "WorkloadPriorityClass",
            urgent_class,
        ), spec
        assert spec.get("priority") == 1000
