"""The environment contract, from the operator's side (issue 44): the trainer container the
operator renders holds exactly the variables of `rtj_shim.wire.pod_env.TRAINER_ENV` (with every
feature on; none undocumented), and its grace period covers the emergency-save deadline it
gives the trainer."""

from __future__ import annotations

from typing import Any

from rtj_test_support import job_body

from rtj_operator.api import ResilientTrainingJob
from rtj_operator.policy.render import GRACE_MARGIN_SECONDS, render_jobset
from rtj_shim.wire import pod_env

EVERYTHING: dict[str, Any] = {
    "recovery": {"inPlace": True, "inPlaceMaxReplacedPods": 1},
    "spares": 1,
    "provenance": {"codeCommit": "3f2a9c1", "imageDigest": "sha256:abc", "datasetSnapshot": "d"},
    "checkpoint": {
        "uri": "s3://ckpt/team-a/llm",
        "emergencySaveSeconds": 40,
        "maxWriteBytesPerSecond": 52428800,
        "retention": {"keepLast": 3, "keepEvery": 1000},
        "fastTier": {"everySteps": 5},
    },
}


def _trainers(body: dict[str, Any]) -> list[dict[str, Any]]:
    js = render_jobset(ResilientTrainingJob.from_object(body), 2, 100, "control-key")
    pods = [rj["template"]["spec"]["template"] for rj in js["spec"]["replicatedJobs"]]
    return [
        {**next(c for c in pod["spec"]["containers"] if c["name"] == "trainer"),
         "grace": pod["spec"]["terminationGracePeriodSeconds"]}
        for pod in pods
    ]  # fmt: skip


def _ours(container: dict[str, Any]) -> set[str]:
    return {e["name"] for e in container["env"]}


def test_every_variable_the_operator_renders_is_in_the_contract_and_the_other_way() -> None:
    trainers = _trainers(job_body(**EVERYTHING))
    assert len(trainers) == 2, "the workers' and the spares' templates"
    rendered = set().union(*(_ours(t) for t in trainers))
    assert rendered - pod_env.names() == set(), "rendered but not in rtj_shim.wire.pod_env"
    assert pod_env.names() - rendered == set(), "in rtj_shim.wire.pod_env but never rendered"


def test_a_plain_job_renders_only_the_always_on_variables_and_the_user_keeps_theirs() -> None:
    body = job_body()
    body["spec"]["template"]["spec"]["containers"][0]["env"] = [{"name": "HF_HOME", "value": "/c"}]
    (trainer,) = _trainers(body)
    always = {v.name for v in pod_env.TRAINER_ENV if not v.when}
    assert always <= _ours(trainer)
    assert _ours(trainer) - pod_env.names() == {"HF_HOME"}


def test_the_grace_period_covers_the_deadline_the_trainer_is_given() -> None:
    for trainer in _trainers(job_body(**EVERYTHING)):
        env = {e["name"]: e.get("value") for e in trainer["env"]}
        deadline = pod_env.emergency_save_seconds(env)
        assert deadline == 40
        assert trainer["grace"] >= deadline + GRACE_MARGIN_SECONDS
