"""Drill: the operator itself crashes (SIGKILL: no cleanup, no lease release) in the middle
of a restart, once between deleting the old JobSet and creating the new one, once right
after creating it. Restarted, it converges: exactly one JobSet for the current attempt, one
attempt record per real attempt, the restart counted once, the backoff still honoured."""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any

import pytest
from scenario_support import (
    NCCL_TIMEOUT,
    WAIT,
    Seen,
    by_rank,
    start_job,
    wait_running,
)

from e2e.cluster import faults
from e2e.operator_proc import jobsets_of, pods_of, rtj_status, wait_for
from rtj_operator.api import keys
from rtj_operator.kube import Kube

pytestmark = [pytest.mark.cluster, pytest.mark.operator, pytest.mark.local_only]

JOB = "llm"


def _time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def test_an_operator_killed_twice_mid_restart_converges_to_one_jobset_and_one_record_each(
    rtj_api: Kube, hkube: Any, rtj_ns: Any, run_operator: Any, timeline: Any
) -> None:
    ns = rtj_ns.name
    op = run_operator()
    tl = timeline(JOB)
    backoff = {"backoff": {"initialSeconds": 6, "maxSeconds": 6}}
    pods = by_rank(start_job(rtj_api, ns, JOB, "file:///mnt/ckpt/llm", failurePolicy=backoff))
    faults.terminate_container(hkube, ns, pods[0]["metadata"]["name"], exit_code=1,
                               message=NCCL_TIMEOUT.format(rank=0))  # fmt: skip

    # crash 1: the failure is recorded and the old world deleted; the next not yet created
    def old_world_gone() -> dict[str, Any] | None:
        status = rtj_status(rtj_api, ns, JOB)
        if status.get("phase") != "Restarting" or not status.get("nextAttemptAt"):
            return None
        return None if jobsets_of(rtj_api, ns, JOB) or pods_of(rtj_api, ns, JOB) else status

    status = wait_for("the old world gone, the backoff running", old_world_gone, WAIT)
    op.kill()
    assert tl.names("JobSet", 2) == set(), "killed before attempt 2 existed"
    not_before = _time(status["nextAttemptAt"])

    # crash 2: right after the restarted operator creates attempt 2's JobSet
    killed = threading.Event()

    def kill_on_create(seen: Seen) -> None:
        is_a2 = seen.kind == "JobSet" and seen.type == "ADDED" and seen.name == f"{JOB}-a2"
        if is_a2 and not killed.is_set():
            op.kill()
            killed.set()

    tl.on_event(kill_on_create)
    op.start()
    wait_for("the operator killed right after creating attempt 2's JobSet", killed.is_set, WAIT)
    first = tl.first("JobSet", "ADDED", f"{JOB}-a2")
    assert first is not None
    uid = first.obj["metadata"]["uid"]
    created = _time(first.obj["metadata"]["creationTimestamp"])
    assert created >= not_before.replace(microsecond=0), "the backoff survived the crash"

    op.start()
    wait_running(rtj_api, ns, JOB, 2, 2)
    status = rtj_status(rtj_api, ns, JOB)
    assert status["attempt"] == 2 and status["phase"] == "Running"
    assert [(r["attempt"], r["jobSet"]) for r in status["attempts"]] == [
        (1, f"{JOB}-a1"), (2, f"{JOB}-a2"),
    ], "one record per real attempt"  # fmt: skip
    assert status["attempts"][0]["failureClass"] == "NetworkFault"
    assert status["restarts"]["infrastructure"] == 1, "the restart is counted once"
    (js,) = jobsets_of(rtj_api, ns, JOB)
    assert js["metadata"]["name"] == f"{JOB}-a2" and js["metadata"]["uid"] == uid, "adopted"
    assert len([s for s in tl.events("JobSet", "ADDED") if s.name == f"{JOB}-a2"]) == 1
    assert tl.first("JobSet", "DELETED", f"{JOB}-a2") is None
    assert tl.names("JobSet", 3) == set()
    assert {p["metadata"]["labels"][keys.ATTEMPT_LABEL] for p in pods_of(rtj_api, ns, JOB)} == {"2"}
