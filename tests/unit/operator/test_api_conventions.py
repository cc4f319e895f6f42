"""API conventions of the ResilientTrainingJob CRD (issue 44): a Secret named by a reference
(`checkpoint.credentialsSecretRef`, the bare-string `credentialsSecret` deprecated but kept),
and a Warning Event for each deprecated field a job sets, once per spec generation."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError
from rtj_test_support import job_body, make_job
from rtj_world import jobset, reading, rtj_raw, snapshot, with_status

from rtj_operator import crdgen
from rtj_operator import reconcile as rc
from rtj_operator.api import ResilientTrainingJob, keys
from rtj_operator.api.checkpoint_spec import CREDENTIALS_CONFLICT
from rtj_operator.api.detection_spec import TAINT_KEY_DEPRECATED
from rtj_operator.policy.render import render_jobset

S3 = "s3://ckpt/team-a/llm"


def _checkpoint_schema() -> dict[str, Any]:
    spec = crdgen.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return dict(spec["properties"]["checkpoint"])


def _pod(rtj: ResilientTrainingJob) -> dict[str, Any]:
    body = render_jobset(rtj, 1, 100)
    return dict(body["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"])


def _deprecation_events(plan: rc.Plan) -> list[rc.PostEvent]:
    return [
        a for a in plan.actions if isinstance(a, rc.PostEvent) and a.reason == "DeprecatedField"
    ]


# --- checkpoint.credentialsSecretRef --------------------------------------------------------


def test_the_credentials_secret_is_named_by_a_reference() -> None:
    ckpt = make_job(checkpoint={"uri": S3, "credentialsSecretRef": {"name": "s3"}}).spec.checkpoint
    assert ckpt.credentials_secret_name == "s3"
    assert ckpt.to_json()["credentialsSecretRef"] == {"name": "s3"}
    assert "credentialsSecret" not in ckpt.to_json()
    assert make_job().spec.checkpoint.credentials_secret_name is None


def test_the_deprecated_bare_string_maps_to_the_reference() -> None:
    old = make_job(checkpoint={"uri": S3, "credentialsSecret": "s3"})
    new = make_job(checkpoint={"uri": S3, "credentialsSecretRef": {"name": "s3"}})
    assert old.spec.checkpoint.credentials_secret_name == "s3"
    # the pods get the same Secret either way (the resume init container and the trainer's
    # store credentials)
    init_old = _pod(old)["initContainers"][0]
    init_new = _pod(new)["initContainers"][0]
    assert init_old["envFrom"] == init_new["envFrom"] == [{"secretRef": {"name": "s3"}}]


def test_both_fields_may_name_the_same_secret_but_not_two() -> None:
    both = {"uri": S3, "credentialsSecret": "s3", "credentialsSecretRef": {"name": "s3"}}
    assert make_job(checkpoint=both).spec.checkpoint.credentials_secret_name == "s3"
    with pytest.raises(ValidationError) as err:
        make_job(checkpoint={**both, "credentialsSecretRef": {"name": "other"}})
    assert CREDENTIALS_CONFLICT in str(err.value)
    assert "checkpoint.credentialsSecret " in CREDENTIALS_CONFLICT
    assert "checkpoint.credentialsSecretRef.name" in CREDENTIALS_CONFLICT
    with pytest.raises(ValidationError):
        make_job(checkpoint={"uri": S3, "credentialsSecretRef": {"name": ""}})


def test_the_crd_refuses_two_different_secrets_and_marks_the_old_field_deprecated() -> None:
    schema = _checkpoint_schema()
    rules = schema["x-kubernetes-validations"]
    assert [r["message"] for r in rules] == [CREDENTIALS_CONFLICT]
    assert rules[0]["fieldPath"] == ".credentialsSecretRef"
    props = schema["properties"]
    assert props["credentialsSecretRef"]["required"] == ["name"]
    assert props["credentialsSecret"]["description"].startswith("Deprecated: use ")


# --- the warning --------------------------------------------------------------------------------


def test_a_job_using_a_deprecated_field_gets_one_warning_per_generation() -> None:
    raw = rtj_raw(checkpoint={"uri": S3, "credentialsSecret": "s3"})
    plan = rc.plan(snapshot(raw, store=reading(1200)))
    (event,) = _deprecation_events(plan)
    assert event.type == "Warning"
    assert "spec.checkpoint.credentialsSecret is deprecated" in event.message
    assert "credentialsSecretRef" in event.message
    assert "credentialsSecret is deprecated" in plan.summary  # the operator's log
    # the generation is observed: the next plans say nothing more
    stored = with_status(raw, plan)
    assert stored["status"]["observedGeneration"] == 1
    assert not _deprecation_events(rc.plan(snapshot(stored, store=reading(1200))))
    # a new generation (the spec edited) is warned about again
    stored["metadata"]["generation"] = 2
    assert len(_deprecation_events(rc.plan(snapshot(stored, store=reading(1200))))) == 1


def test_a_job_using_only_current_fields_gets_no_warning() -> None:
    raw = rtj_raw(checkpoint={"uri": S3, "credentialsSecretRef": {"name": "s3"}})
    assert not _deprecation_events(rc.plan(snapshot(raw, store=reading(1200))))
    assert ResilientTrainingJob.from_object(job_body()).spec.deprecations() == ()


# --- spec.managedBy -------------------------------------------------------------------------------

MULTIKUEUE = "kueue.x-k8s.io/multikueue"


def test_managed_by_unset_or_this_operator_is_reconciled_here() -> None:
    assert keys.CONTROLLER_NAME == "training.resilient.dev/rtj-operator"
    assert not make_job().spec.managed_elsewhere
    assert not make_job(managedBy=keys.CONTROLLER_NAME).spec.managed_elsewhere
    assert make_job(managedBy=MULTIKUEUE).spec.managed_elsewhere


def test_a_job_managed_elsewhere_gets_an_empty_plan() -> None:
    raw = rtj_raw(managedBy=MULTIKUEUE, checkpoint={"uri": S3, "credentialsSecret": "s3"})
    plan = rc.plan(snapshot(raw, store=reading(1200)))
    assert plan.actions == () and not plan.needs_store and plan.requeue_after is None
    assert plan.summary == f"managed by {MULTIKUEUE}"
    ours = rc.plan(snapshot(rtj_raw(managedBy=keys.CONTROLLER_NAME), store=reading(1200)))
    assert any(isinstance(a, rc.CreateJobSet) for a in ours.actions)


@pytest.mark.parametrize("value", ["", "multikueue", "Kueue.io/x", "a/" + "b" * 62, "a/b/"])
def test_managed_by_is_a_domain_prefixed_path(value: str) -> None:
    with pytest.raises(ValidationError):
        make_job(managedBy=value)


def test_managed_by_is_immutable_in_the_crd() -> None:
    spec = crdgen.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["managedBy"]["maxLength"] == 63
    (rule,) = [r for r in spec["x-kubernetes-validations"] if r.get("fieldPath") == ".managedBy"]
    assert rule["rule"] == (
        "has(self.managedBy) == has(oldSelf.managedBy) "
        "&& (!has(self.managedBy) || self.managedBy == oldSelf.managedBy)"
    )


# --- spec.nodeHealth.taintKey (deprecated) -----------------------------------------------------


def test_a_job_setting_its_own_taint_key_is_warned_and_still_served() -> None:
    own = {"taintKey": "team-a.example/own"}
    raw = rtj_raw(nodeHealth=own)
    assert make_job(nodeHealth=own).spec.node_health.taint_key == "team-a.example/own"
    plan = rc.plan(snapshot(raw, store=reading(1200)))
    (event,) = _deprecation_events(plan)
    assert event.message == TAINT_KEY_DEPRECATED
    assert "spec.nodeHealth.taintKey is deprecated" in event.message
    # the CRD's default (every job created before this release carries it) is not a use
    assert not _deprecation_events(rc.plan(snapshot(rtj_raw(), store=reading(1200))))
    both = rtj_raw(nodeHealth=own, checkpoint={"uri": S3, "credentialsSecret": "s3"})
    assert len(_deprecation_events(rc.plan(snapshot(both, store=reading(1200))))) == 2


def test_the_quarantine_toleration_filter_uses_the_platforms_key() -> None:
    """The job's taintKey is ignored, but a toleration of the platform's quarantine taint in
    the template is still dropped (the plan renders with the platform's key)."""
    raw = rtj_raw(nodeHealth={"taintKey": "team-a.example/own"})
    tolerations = [
        {"key": keys.DEFAULT_TAINT_KEY, "operator": "Exists"},
        {"key": "team-a.example/own", "operator": "Exists"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    ]
    raw["spec"]["template"]["spec"]["tolerations"] = tolerations
    plan = rc.plan(snapshot(raw, store=reading(1200)))
    (create,) = [a for a in plan.actions if isinstance(a, rc.CreateJobSet)]
    pod = create.body["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert [t["key"] for t in pod["tolerations"]] == ["team-a.example/own", "nvidia.com/gpu"]


def test_the_crd_describes_taint_key_as_deprecated() -> None:
    spec = crdgen.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    field = spec["properties"]["nodeHealth"]["properties"]["taintKey"]
    assert field["description"].startswith("Deprecated and ignored: ")
    assert field["default"] == keys.DEFAULT_TAINT_KEY


# --- spec.queueName optional: no Kueue, JobSet alone ---------------------------------------------


def _without_queue(raw: dict[str, Any]) -> dict[str, Any]:
    raw["spec"].pop("queueName")
    return raw


def test_without_a_queue_name_the_jobset_has_no_queue_label_and_is_not_suspended() -> None:
    body = _without_queue(job_body())
    body["metadata"]["labels"] = {"kueue.x-k8s.io/priority-class": "urgent"}
    rtj = ResilientTrainingJob.from_object(body)
    assert rtj.spec.queue_name is None
    js = render_jobset(rtj, 1, None)
    assert keys.KUEUE_QUEUE_LABEL not in js["metadata"]["labels"]
    # the user's other Kueue labels stay (a Kueue that manages jobs without a queue name
    # reads them)
    assert js["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "urgent"
    assert js["spec"]["suspend"] is False
    queued = render_jobset(make_job(), 1, None)
    assert queued["metadata"]["labels"][keys.KUEUE_QUEUE_LABEL] == "team-a"
    assert queued["spec"]["suspend"] is True


def _admitted(status: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == "Admitted")


def test_without_a_queue_name_the_attempt_is_admitted_without_waiting_for_kueue() -> None:
    raw = _without_queue(rtj_raw())
    plan = rc.plan(snapshot(raw, store=reading(1200)))
    (create,) = [a for a in plan.actions if isinstance(a, rc.CreateJobSet)]
    assert create.body["spec"]["suspend"] is False
    raw = with_status(raw, plan)
    assert "without Kueue" in _admitted(raw["status"])["message"]
    # the JobSet as the API server shows it (running, no queue label): admitted at once, no
    # LocalQueue looked up
    plan = rc.plan(snapshot(raw, jobsets=[jobset(1)], store=reading(1200)))
    assert plan.needs_queue is None
    status = with_status(raw, plan)["status"]
    assert status["phase"] == "Admitted"
    admitted = _admitted(status)
    assert admitted["status"] == "True" and admitted["reason"] == "AttemptAdmitted"
    assert "runs without Kueue" in admitted["message"]


def test_a_jobset_suspended_with_no_queue_waits_without_a_queue_lookup() -> None:
    """A Kueue with manageJobsWithoutQueueName suspends it on its own: the attempt waits."""
    raw = _without_queue(rtj_raw())
    raw = with_status(raw, rc.plan(snapshot(raw, store=reading(1200))))
    plan = rc.plan(snapshot(raw, jobsets=[jobset(1, suspended=True)], store=reading(1200)))
    assert plan.needs_queue is None
    admitted = _admitted(with_status(raw, plan)["status"])
    assert admitted["status"] == "False" and "manageJobsWithoutQueueName" in admitted["message"]


def test_with_a_queue_name_the_attempt_waits_for_kueue() -> None:
    raw = rtj_raw()
    raw = with_status(raw, rc.plan(snapshot(raw, store=reading(1200))))
    assert "waits for Kueue" in _admitted(raw["status"])["message"]
    js = jobset(1, suspended=True)
    js["metadata"]["labels"][keys.KUEUE_QUEUE_LABEL] = "team-a"
    assert rc.plan(snapshot(raw, jobsets=[js], store=reading(1200))).needs_queue == "team-a"
