"""Objects a newer CRD wrote: an older operator still runs the job, and keeps what it
does not know in status (issue 19, versioning)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError
from rtj_test_support import NOW, job_body
from rtj_world import jobset, pod, rtj_raw, snapshot

from rtj_operator import reconcile as rc
from rtj_operator.api import ResilientTrainingJob
from rtj_operator.reconcile.detect import UNEXPLAINED_SETTLE as SETTLED


def newer_body() -> dict[str, Any]:
    body = job_body(failurePolicy={"backoff": {"initialSeconds": 1}})
    body["spec"]["warmSpares"] = 2  # a field a newer CRD added
    body["spec"]["checkpoint"]["tiers"] = {"memory": {"everySteps": 50}}
    body["spec"]["failurePolicy"]["backoff"]["jitter"] = 0.1
    body["metadata"]["annotations"] = {"example.com/x": "y"}
    return body


def test_fields_a_newer_crd_added_are_set_aside_not_refused() -> None:
    body = newer_body()
    job = ResilientTrainingJob.from_object(body)
    assert job.spec.replicas == 4 and job.spec.checkpoint.uri == "s3://ckpt/team-a/llm"
    assert sorted(ResilientTrainingJob.unknown_fields(body)) == [
        "spec.checkpoint.tiers",
        "spec.failurePolicy.backoff.jitter",
        "spec.warmSpares",
    ]
    assert body["spec"]["warmSpares"] == 2, "the input is not modified"
    with pytest.raises(ValidationError, match="warmSpares"):
        ResilientTrainingJob.model_validate({**body, "status": {}})  # strict in Python


def test_status_fields_a_newer_operator_wrote_survive_this_ones_patches() -> None:
    status = {"phase": "Running", "attempt": 1,
              "attempts": [{"attempt": 1, "jobSet": "llm-a1"}],
              "warmSpares": {"ready": 2}}  # fmt: skip
    raw = rtj_raw(status, replicas=2)
    # ended past the settle window of an unexplained failure (reconcile.detect)
    failed = pod(1, 0, exit_code=1, message="NCCL watchdog timeout", finished=NOW - SETTLED)
    plan = rc.plan(snapshot(raw, jobsets=[jobset(1)], pods=[failed, pod(1, 1)]))
    patch = plan.status_patch
    assert patch is not None and patch.status["phase"] == "Restarting"
    assert "warmSpares" not in patch.patch, "not nulled by an operator that does not know it"
    assert patch.status["warmSpares"] == {"ready": 2}
