"""The pydantic models apply the same rules the CRD's schema and CEL rules enforce."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError
from rtj_test_support import job_body

from rtj_operator.api import FailureCategory, FailureClass, ResilientTrainingJob


def _parse(body: dict[str, Any]) -> ResilientTrainingJob:
    return ResilientTrainingJob.from_object(body)


def test_defaults_fill_the_whole_spec() -> None:
    rtj = _parse(job_body())
    spec = rtj.spec
    assert spec.failure_policy.max_restarts == 5
    assert spec.failure_policy.backoff.initial_seconds == 10
    assert spec.failure_policy.user_error_restarts == 0
    assert spec.failure_policy.count_preemptions is False
    assert spec.node_health.taint_key == "training.resilient.dev/unhealthy"
    assert 79 in spec.node_health.xid_codes
    assert spec.checkpoint.retention.keep_last == 3
    assert rtj.status.attempt == 0 and rtj.status.phase.value == "Pending"
    assert rtj.run_id == "team-a.llm"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"replicas": 0}, "greater than or equal to 1"),
        ({"checkpoint": {"uri": "gs://bucket/x"}}, "must start with s3:// or file://"),
        (
            {
                "checkpoint": {"uri": "s3://b/x"},
                "failurePolicy": {"backoff": {"initialSeconds": 700}},
            },
            "initialSeconds must be <= backoff.maxSeconds",
        ),
        ({"template": {"spec": {"containers": []}}}, "at least one container"),
        ({"failurePolicy": {"maxRestarts": -1}}, "greater than or equal to 0"),
        ({"nodeHealth": {"taintEffect": "Sometimes"}}, "NoSchedule"),
    ],
)
def test_invalid_specs_are_refused_with_field_messages(
    change: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        _parse(job_body(**change))


@pytest.mark.parametrize("name", ["7up", "a" * 37, "has.dots", "UPPER"])
def test_names_that_would_break_attempt_names_are_refused(name: str) -> None:
    body = job_body()
    body["metadata"]["name"] = name
    with pytest.raises(ValidationError, match="DNS-1035"):
        _parse(body)


def test_round_trip_is_camel_case_and_stable() -> None:
    rtj = _parse(job_body(failurePolicy={"maxRestarts": 2, "countPreemptions": True}))
    wire = rtj.spec.to_json()
    assert wire["failurePolicy"]["maxRestarts"] == 2
    assert wire["failurePolicy"]["countPreemptions"] is True
    assert "queueName" in wire and "queue_name" not in wire
    assert _parse({**job_body(), "spec": wire}).spec == rtj.spec


def test_status_ignores_fields_it_does_not_know() -> None:
    body = {**job_body(), "status": {"phase": "Running", "attempt": 2, "kopf": {"progress": {}}}}
    assert _parse(body).status.attempt == 2


def test_every_class_has_a_category() -> None:
    assert {c.category for c in FailureClass} == set(FailureCategory)
    assert FailureClass.OUT_OF_MEMORY.category is FailureCategory.USER
    assert not FailureCategory.USER.retryable and FailureCategory.UNKNOWN.retryable
