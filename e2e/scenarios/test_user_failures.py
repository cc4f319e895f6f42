"""Drills: failures of the user's own code. A traceback fails the job at once (no GPUs
burned on a deterministic bug, no node blamed); an OOM is the first failure even when every
other rank then times out, and spends `userErrorRestarts`, never `maxRestarts`."""

from __future__ import annotations

from typing import Any

import pytest
from scenario_support import (
    NCCL_TIMEOUT,
    WAIT,
    by_rank,
    condition_true,
    failed_record,
    start_job,
    taints,
    terminate_ranks,
    wait_phase,
    wait_running,
)

from e2e.cluster import faults
from e2e.operator_proc import events_of, jobsets_of, rtj_status, wait_for
from rtj_operator.api import keys
from rtj_operator.kube import Kube

pytestmark = [pytest.mark.cluster, pytest.mark.operator, pytest.mark.local_only]

JOB = "llm"
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/workspace/train.py", line 88, in <module>\n'
    '    lr = cfg["optimizer"]["lr"]\n'
    "KeyError: 'lr'"
)


def _no_quarantine(kube: Kube, status: dict[str, Any], nodes: set[str]) -> None:
    assert not status.get("quarantinedNodes")
    for node in nodes:
        assert not any(t["key"] == keys.DEFAULT_TAINT_KEY for t in taints(kube, node)), node


def test_a_python_traceback_fails_the_job_at_once_and_says_why(
    rtj_api: Kube, hkube: Any, rtj_ns: Any, run_operator: Any, timeline: Any
) -> None:
    ns = rtj_ns.name
    op = run_operator()
    tl = timeline(JOB)
    pods = by_rank(start_job(rtj_api, ns, JOB, "file:///mnt/ckpt/llm", replicas=2))
    faults.terminate_container(hkube, ns, pods[0]["metadata"]["name"], exit_code=1,
                               message=TRACEBACK)  # fmt: skip

    status = wait_phase(rtj_api, ns, JOB, "Failed")
    (record,) = status["attempts"]
    assert record["failureClass"] == "UserError" and record["failureCategory"] == "user"
    assert record["firstFailed"]["rank"] == 0 and record["firstFailed"]["exitCode"] == 1
    assert status["attempt"] == 1 and status["restarts"] == {
        "infrastructure": 0, "user": 0, "preemption": 0, "checkpoint": 0, "preflight": 0,
        "silentDataCorruption": 0,
    }  # fmt: skip
    failed = condition_true(status, "Failed")
    assert failed is not None and failed["reason"] == "UserErrorBudgetExhausted"
    assert "user-error restarts spent (0 of 0)" in failed["message"]
    _no_quarantine(rtj_api, status, {p["spec"]["nodeName"] for p in pods.values()})

    def why() -> dict[str, Any] | None:
        return next((e for e in events_of(rtj_api, ns, JOB)
                     if e["reason"] == "UserErrorBudgetExhausted"), None)  # fmt: skip

    event = wait_for("the Event that says why", why, WAIT)
    assert event["type"] == "Warning"
    assert "UserError" in event["message"] and "KeyError: 'lr'" in event["message"]
    assert "RestartScheduled" not in [e["reason"] for e in events_of(rtj_api, ns, JOB)]
    assert tl.names("JobSet", 2) == set(), "no second attempt"
    # a failed job holds nothing: its JobSet (and so its Workload's quota) is gone
    wait_for("the failed job's JobSet deleted", lambda: not jobsets_of(rtj_api, ns, JOB), WAIT)
    assert op.metric("rtj_failures_total", namespace=ns, name=JOB, **{"class": "UserError"}) == 1
    assert op.metric("rtj_restarts_total", namespace=ns, name=JOB,
                     **{"class": "UserError", "scope": "world"}) == 0  # fmt: skip


def test_oom_then_collective_timeouts_is_out_of_memory_and_spends_user_error_restarts(
    rtj_api: Kube, hkube: Any, rtj_ns: Any, run_operator: Any
) -> None:
    ns = rtj_ns.name
    op = run_operator()
    policy = {"maxRestarts": 5, "userErrorRestarts": 1,
              "backoff": {"initialSeconds": 1, "maxSeconds": 5}}  # fmt: skip
    pods = by_rank(start_job(rtj_api, ns, JOB, "file:///mnt/ckpt/llm", replicas=3,
                             failurePolicy=policy))  # fmt: skip
    nodes = {p["spec"]["nodeName"] for p in pods.values()}

    def oom(attempt_pods: dict[int, dict[str, Any]], rank: int) -> None:
        faults.terminate_container(hkube, ns, attempt_pods[rank]["metadata"]["name"],
                                   exit_code=137, reason="OOMKilled")  # fmt: skip
        others = [p for r, p in attempt_pods.items() if r != rank]
        terminate_ranks(hkube, ns, others, lambda r: NCCL_TIMEOUT.format(rank=r))

    oom(pods, 1)
    record = failed_record(rtj_api, ns, JOB, 1)
    assert record["failureClass"] == "OutOfMemory", record
    assert record["firstFailed"]["rank"] == 1 and record["firstFailed"]["exitCode"] == 137
    assert any("OOMKilled" in line for line in record["evidence"])

    second = by_rank(wait_running(rtj_api, ns, JOB, 2, 3))  # userErrorRestarts: 1
    status = rtj_status(rtj_api, ns, JOB)
    assert status["restarts"]["user"] == 1 and status["restarts"]["infrastructure"] == 0
    nodes |= {p["spec"]["nodeName"] for p in second.values()}

    oom(second, 0)
    status = wait_phase(rtj_api, ns, JOB, "Failed")
    assert [r["failureClass"] for r in status["attempts"]] == ["OutOfMemory", "OutOfMemory"]
    assert status["attempts"][1]["firstFailed"]["rank"] == 0
    failed = condition_true(status, "Failed")
    assert failed is not None and failed["reason"] == "UserErrorBudgetExhausted"
    assert "user-error restarts spent (1 of 1)" in failed["message"]
    assert status["restarts"]["infrastructure"] == 0, "maxRestarts untouched"
    _no_quarantine(rtj_api, status, nodes)
    cls = {"namespace": ns, "name": JOB, "class": "OutOfMemory"}
    # The operator counts a decision's metrics the moment its status patch returns: the
    # status can be read an instant before that (it once lagged behind the JobSet deletes).
    wait_for("the second failure counted", lambda: op.metric("rtj_failures_total", **cls) == 2, 10)
    assert op.metric("rtj_restarts_total", **cls, scope="world") == 1
    assert op.metric("rtj_restart_budget_remaining", namespace=ns, name=JOB) == 5
