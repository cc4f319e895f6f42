"""The operator's side of the fast checkpoint tier (spec.checkpoint.fastTier, issue 16):
the spec's rules, the pods' emptyDir and environment, which fast step is pinned, and the
order that carries it."""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import ValidationError
from rtj_test_support import NOW, job_body, make_job, supervisor_reports

from rtj_operator.api import ResilientTrainingJob, keys
from rtj_operator.api.attempts import InPlacePhase
from rtj_operator.api.checkpoint_spec import FAST_TIER_MIN_KEEP, SIZE_PATTERN
from rtj_operator.api.schemas.openapi import QUANTITY_PATTERN
from rtj_operator.policy import fast_tier as fast_tier_policy
from rtj_operator.policy import in_place
from rtj_operator.policy.render import render_jobset
from rtj_shim.fast import fast_tier
from rtj_shim.wire.control import parse_order

KEY = "0123456789abcdef" * 4
IN_PLACE = {"inPlace": True}


def _checkpoint(**fast: Any) -> dict[str, Any]:
    return {"uri": "s3://ckpt/team-a/llm", "fastTier": fast}


def _pod_spec(job: Any, key: str | None = KEY) -> dict[str, Any]:
    js = render_jobset(job, 1, None, key)
    return js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]  # type: ignore[no-any-return]


# --- the spec ---------------------------------------------------------------------------


def test_the_operator_copies_of_the_shims_names_are_the_shims() -> None:
    assert keys.ENV_FAST_TIER_DIR == fast_tier.ENV_DIR
    assert keys.ENV_FAST_EVERY_STEPS == fast_tier.ENV_EVERY_STEPS
    assert keys.ENV_FAST_KEEP == fast_tier.ENV_KEEP
    assert FAST_TIER_MIN_KEEP == fast_tier.MIN_KEEP


def test_fast_tier_defaults_and_wire_names() -> None:
    job = make_job(checkpoint=_checkpoint(everySteps=20), recovery=IN_PLACE)
    tier = job.spec.checkpoint.fast_tier
    assert tier is not None
    assert (tier.every_steps, tier.keep, tier.medium, tier.size_limit, tier.peer_replicas) == (
        20, FAST_TIER_MIN_KEEP, "Memory", None, 1)  # fmt: skip
    wire = job.spec.to_json()["checkpoint"]["fastTier"]
    assert wire == {"everySteps": 20, "keep": 2, "medium": "Memory", "peerReplicas": 1}
    assert make_job().spec.checkpoint.fast_tier is None


def test_fast_tier_without_in_place_is_refused_naming_both_fields() -> None:
    with pytest.raises(ValidationError) as refused:
        make_job(checkpoint=_checkpoint(everySteps=20))
    message = str(refused.value)
    assert "spec.checkpoint.fastTier needs spec.recovery.inPlace: true" in message
    assert "only a restart inside the same pods finds the fast tier again" in message
    with pytest.raises(ValidationError, match=re.escape("spec.checkpoint.fastTier needs")):
        make_job(checkpoint=_checkpoint(everySteps=20), recovery={"inPlace": False})


@pytest.mark.parametrize(
    ("fast", "field", "message"),
    [
        ({}, "everySteps", "Field required"),
        ({"everySteps": 0}, "everySteps", "expected steps >= 1 or 'auto'"),
        ({"everySteps": "often"}, "everySteps", "everySteps"),
        ({"everySteps": 10, "keep": 1}, "keep", "greater than or equal to 2"),
        ({"everySteps": 10, "medium": "Tmpfs"}, "medium", "'Memory' or 'Disk'"),
        ({"everySteps": 10, "sizeLimit": "lots"}, "sizeLimit", "should match pattern"),
        ({"everySteps": 10, "sizeLimit": "-1Gi"}, "sizeLimit", "should match pattern"),
        ({"everySteps": 10, "sizeLimit": "500m"}, "sizeLimit", "should match pattern"),
        ({"everySteps": 10, "peerReplicas": -1}, "peerReplicas", "greater than or equal to 0"),
        ({"everySteps": 10, "peerReplicas": 2}, "peerReplicas", "less than or equal to 1"),
    ],
)
def test_bad_fast_tier_fields_are_refused_by_name(
    fast: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        make_job(checkpoint=_checkpoint(**fast), recovery=IN_PLACE)
    errors = refused.value.errors()
    assert [e["loc"][-1] for e in errors] == [field]
    assert message in str(refused.value)


@pytest.mark.parametrize("size", ["64Gi", "512Mi", "1G", "1500000000", "1.5Gi", "8k"])
def test_size_limits_are_sizes_the_api_server_parses(size: str) -> None:
    job = make_job(checkpoint=_checkpoint(everySteps=5, sizeLimit=size), recovery=IN_PLACE)
    assert job.spec.checkpoint.fast_tier is not None
    assert job.spec.checkpoint.fast_tier.size_limit == size
    assert re.match(SIZE_PATTERN, size) and re.match(QUANTITY_PATTERN, size)


def test_the_crd_refuses_what_the_model_refuses() -> None:
    from rtj_operator import crdgen

    schema = crdgen.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]
    rule = next(
        r for r in spec["x-kubernetes-validations"] if r.get("fieldPath") == ".checkpoint.fastTier"
    )
    assert "spec.checkpoint.fastTier needs spec.recovery.inPlace: true" in rule["message"]
    assert "self.recovery.inPlace" in rule["rule"] and "oldSelf" not in rule["rule"]
    fast = spec["properties"]["checkpoint"]["properties"]["fastTier"]
    assert fast["required"] == ["everySteps"]
    props = fast["properties"]
    every = props["everySteps"]  # steps or auto (fastTier.everySteps: auto, issue 48)
    assert every["x-kubernetes-int-or-string"] is True
    assert every["x-kubernetes-validations"][0]["rule"] == (
        "type(self) == int ? self >= 1 : self == 'auto'"
    )
    assert props["keep"]["minimum"] == 2
    assert props["medium"]["enum"] == ["Memory", "Disk"] and props["medium"]["default"] == "Memory"
    assert props["sizeLimit"]["pattern"] == SIZE_PATTERN
    replicas = props["peerReplicas"]
    assert (replicas["minimum"], replicas["maximum"], replicas["default"]) == (0, 1, 1)


# --- rendering --------------------------------------------------------------------------


def test_the_trainer_gets_the_fast_tier_volume_mount_and_environment() -> None:
    job = make_job(
        checkpoint=_checkpoint(everySteps=25, keep=3, sizeLimit="64Gi", peerReplicas=0),
        recovery=IN_PLACE,
    )
    pod = _pod_spec(job)
    volume = next(v for v in pod["volumes"] if v["name"] == keys.FAST_TIER_VOLUME)
    assert volume == {
        "name": "rtj-fast-tier",
        "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"},
    }
    trainer = pod["containers"][0]
    assert {"name": "rtj-fast-tier", "mountPath": "/var/run/rtj-fast-tier"} in trainer[
        "volumeMounts"]  # fmt: skip
    env = {e["name"]: e.get("value") for e in trainer["env"]}
    assert env["RTJ_FAST_TIER_DIR"] == "/var/run/rtj-fast-tier"
    assert (env["RTJ_FAST_EVERY_STEPS"], env["RTJ_FAST_KEEP"]) == ("25", "3")
    # the shim reads back exactly what was rendered
    config = fast_tier.FastTierConfig.from_env({k: v for k, v in env.items() if v is not None})
    assert config is not None and (config.every_steps, config.keep) == (25, 3)
    # the progress sidecar reads it (read-only) to report what the pod holds; the resolver
    # and any other container get nothing
    for c in [*pod["initContainers"], *pod["containers"][1:]]:
        mounts = [m for m in c.get("volumeMounts", []) if m["name"] == keys.FAST_TIER_VOLUME]
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        if c["name"] == keys.PROGRESS_SIDECAR:
            assert mounts == [{"name": "rtj-fast-tier", "mountPath": "/var/run/rtj-fast-tier",
                               "readOnly": True}]  # fmt: skip
            assert env[keys.ENV_FAST_TIER_DIR] == "/var/run/rtj-fast-tier"
            assert keys.ENV_FAST_EVERY_STEPS not in env
        else:
            assert not mounts and keys.ENV_FAST_TIER_DIR not in env, c["name"]
    template = render_jobset(job, 1, None, KEY)["spec"]["replicatedJobs"][0]["template"]
    annotations = template["spec"]["template"]["metadata"]["annotations"]
    assert keys.PEER_REPLICA_ANNOTATION not in annotations, "peerReplicas 0: no assignment"


def test_with_a_peer_replica_the_sidecar_writes_the_fast_tier_and_knows_keep() -> None:
    job = make_job(checkpoint=_checkpoint(everySteps=25, keep=3), recovery=IN_PLACE)
    pod = _pod_spec(job)
    sidecar = next(c for c in pod["initContainers"] if c["name"] == keys.PROGRESS_SIDECAR)
    mounts = [m for m in sidecar["volumeMounts"] if m["name"] == keys.FAST_TIER_VOLUME]
    assert mounts == [{"name": "rtj-fast-tier", "mountPath": "/var/run/rtj-fast-tier"}]
    env = {e["name"]: e.get("value") for e in sidecar["env"]}
    assert (env[keys.ENV_FAST_TIER_DIR], env[keys.ENV_FAST_KEEP]) == ("/var/run/rtj-fast-tier",
                                                                      "3")  # fmt: skip
    assert keys.ENV_FAST_EVERY_STEPS not in env
    trainer = pod["containers"][0]
    assert {"name": "rtj-fast-tier", "mountPath": "/var/run/rtj-fast-tier"} in trainer[
        "volumeMounts"]  # fmt: skip
    template = render_jobset(job, 1, None, KEY)["spec"]["replicatedJobs"][0]["template"]
    annotations = template["spec"]["template"]["metadata"]["annotations"]
    assert annotations[keys.PEER_REPLICA_ANNOTATION] == "true"
    # rendered twice (a re-render): one mount, one of each variable
    again = _pod_spec(job)
    sidecar = next(c for c in again["initContainers"] if c["name"] == keys.PROGRESS_SIDECAR)
    names = [e["name"] for e in sidecar["env"]]
    assert names.count(keys.ENV_FAST_KEEP) == 1 and names.count(keys.ENV_FAST_TIER_DIR) == 1


def test_disk_has_no_medium_and_no_size_limit_renders_none() -> None:
    job = make_job(checkpoint=_checkpoint(everySteps=25, medium="Disk"), recovery=IN_PLACE)
    volume = next(v for v in _pod_spec(job)["volumes"] if v["name"] == keys.FAST_TIER_VOLUME)
    assert volume == {"name": "rtj-fast-tier", "emptyDir": {}}


def test_stale_user_values_are_replaced_not_duplicated() -> None:
    body = job_body(checkpoint=_checkpoint(everySteps=25), recovery=IN_PLACE)
    trainer = body["spec"]["template"]["spec"]["containers"][0]
    trainer["env"] = [{"name": "RTJ_FAST_EVERY_STEPS", "value": "1"}, {"name": "A", "value": "b"}]
    env = _pod_spec(ResilientTrainingJob.from_object(body))["containers"][0]["env"]
    assert [e["value"] for e in env if e["name"] == "RTJ_FAST_EVERY_STEPS"] == ["25"]
    assert {"name": "A", "value": "b"} in env


def test_no_fast_tier_without_the_field_or_without_the_supervisor() -> None:
    def rendered(pod: dict[str, Any]) -> bool:
        containers = [*pod["containers"], *pod["initContainers"]]
        return any(v["name"] == keys.FAST_TIER_VOLUME for v in pod["volumes"]) or any(
            e["name"].startswith("RTJ_FAST_") for c in containers for e in c.get("env", [])
        )

    assert not rendered(_pod_spec(make_job(recovery=IN_PLACE)))
    assert not rendered(_pod_spec(make_job()))
    # no control key: no supervisor, so no restart in place would ever read the fast tier
    job = make_job(checkpoint=_checkpoint(everySteps=25), recovery=IN_PLACE)
    assert rendered(_pod_spec(job))
    assert not rendered(_pod_spec(job, key=None))


# --- the pin ----------------------------------------------------------------------------

PODS = ("p0", "p1", "p2")


LINEAGE_A = "aaaaaaaaaaaaaaaa"
LINEAGE_B = "bbbbbbbbbbbbbbbb"


def _held(steps: list[Any], lineage: str = LINEAGE_A) -> list[Any]:
    """What a supervisor reports with `fast_steps`: each step with its lineage (anything
    that is not a step passes through as it is, to be ignored)."""
    return [f"{lineage}@{s}" if isinstance(s, int) and not isinstance(s, bool) else s
            for s in steps]  # fmt: skip


def _reports(*held: list[int] | None) -> dict[str, dict[str, Any]]:
    return {
        pod: {
            "generation": 1,
            "state": "stopped",
            **({} if h is None else {"fast_steps": h, "fast_held": _held(h)}),
        }
        for pod, h in zip(PODS, held, strict=True)
    }


def _pin(reports: dict[str, dict[str, Any]], *args: Any) -> fast_tier_policy.FastPin:
    """`policy.fast_tier.pin` over the supervisors' JSON, parsed as the operator parses it."""
    return fast_tier_policy.pin(supervisor_reports(reports), *args)


def test_the_newest_step_every_pod_holds_is_pinned() -> None:
    reports = _reports([100, 120, 140], [100, 120, 140], [100, 120, 140])
    assert _pin(reports, PODS, 100, []).step == 140
    assert _pin(reports, PODS, None, []).step == 140, "durable unknown: any goes"
    assert _pin(reports, PODS, 140, []).step == 140, "equal to durable: still pinned"


def test_pods_that_disagree_pin_the_newest_step_they_share() -> None:
    # p2 had not published 140 yet when its rank was stopped; p1 already dropped 100
    reports = _reports([100, 120, 140], [120, 140], [100, 120])
    assert _pin(reports, PODS, 80, []).step == 120
    assert _pin(_reports([140], [120], [140]), PODS, None, []).step is None


def test_a_pod_without_a_report_or_without_a_list_pins_nothing() -> None:
    reports = _reports([100, 120], [100, 120], [100, 120])
    assert _pin({k: v for k, v in reports.items() if k != "p1"}, PODS, 0, []).step is None
    assert _pin(_reports([100], [100], None), PODS, 0, []).step is None
    assert _pin(_reports([100], [100], []), PODS, 0, []).step is None
    garbage = _reports([100], [100], [100])
    garbage["p2"]["fast_steps"] = "100"
    garbage["p2"]["fast_held"] = "100"
    assert _pin(garbage, PODS, 0, []).step is None
    assert _pin(reports, (), 0, []).step is None, "no pods, nothing held by all"
    # the reason, when the pods keep a fast tier; none when no pod keeps one at all
    assert _pin(_reports([100], [100], []), PODS, 0, []).note == (
        "pod p2 holds no fast step and no pod holds its replica (no pod keeps a peer replica)"
    )
    assert _pin(_reports(None, None, None), PODS, 0, []).note is None


def test_a_fast_step_older_than_the_durable_one_is_not_pinned() -> None:
    reports = _reports([100, 120], [100, 120], [100, 120])
    assert _pin(reports, PODS, 121, []).step is None
    assert _pin(reports, PODS, 110, []).step == 120


def test_a_bad_step_is_never_pinned() -> None:
    reports = _reports([100, 120], [100, 120], [100, 120])
    assert _pin(reports, PODS, 100, [120]).step == 100, "the next newest shared one"
    assert _pin(reports, PODS, 110, [120]).step is None, "the older one is too old"
    assert _pin(reports, PODS, None, [100, 120]).step is None


def test_values_that_are_not_steps_are_ignored() -> None:
    reports = _reports([True, -5, 100, "120"], [100, 120], [100, 120])
    assert _pin(reports, PODS, None, []).step == 100


def test_a_step_two_pods_hold_in_different_lineages_is_never_pinned() -> None:
    # issue 43: p0 kept 1250/1260 of the history it left (A); p1 and p2 saved them again
    # after a durable fallback to 1200 (B); numbers alone pinned 1260 and mixed histories
    reports = _reports([1250, 1260], [1250, 1260], [1250, 1260])
    reports["p0"]["fast_held"] = _held([1200, 1250, 1260], LINEAGE_A)
    reports["p1"]["fast_held"] = _held([1200], LINEAGE_A) + _held([1250, 1260], LINEAGE_B)
    reports["p2"]["fast_held"] = _held([1200], LINEAGE_A) + _held([1250, 1260], LINEAGE_B)
    pinned = _pin(reports, PODS, 1200, [])
    assert (pinned.step, pinned.lineage) == (1200, LINEAGE_A), "the newest step all share"
    assert _pin(reports, PODS, 1210, []).step is None
    reports["p0"]["fast_held"] = _held([1250, 1260], LINEAGE_B)
    pinned = _pin(reports, PODS, 1200, [])
    assert (pinned.step, pinned.lineage) == (1260, LINEAGE_B)


def test_steps_of_unknown_lineage_are_never_pinned() -> None:
    legacy = {p: {"generation": 1, "state": "stopped", "fast_steps": [100, 120]} for p in PODS}
    assert _pin(legacy, PODS, 0, []).step is None, "an older supervisor's"
    reports = _reports([100], [100], [100])
    reports["p1"]["fast_held"] = ["legacy@100"]
    assert _pin(reports, PODS, 0, []).step is None


# --- the order --------------------------------------------------------------------------


def test_the_run_order_carries_the_fast_step_and_the_supervisor_reads_it_back() -> None:
    job = make_job(checkpoint=_checkpoint(everySteps=20), recovery=IN_PLACE)
    state = InPlacePhase(generation=2, phase="Starting", since=NOW, step=100, fast_step=140)
    status = job.status.model_copy(update={"attempt": 3})
    job = job.model_copy(update={"status": status})
    running = job.model_copy(update={"status": status.model_copy(update={"in_place": state})})
    order = in_place.order(running)
    assert order is not None
    assert (order.action, order.attempt, order.step, order.fast_step) == ("run", 3, 100, 140)
    assert parse_order(order.encode()) == order
    # the pod that does not hold the step itself is told where its peer replica is
    sourced = state.model_copy(update={"fast_sources": {"1": "10.0.0.9:9478"}})
    running = job.model_copy(update={"status": status.model_copy(update={"in_place": sourced})})
    copies = in_place.order(running, 1)
    assert copies is not None and copies.fast_source == "10.0.0.9:9478"
    assert parse_order(copies.encode()) == copies
    assert in_place.order(running, 0) == order and in_place.order(running) == order
    # the lineage the step is pinned in goes with it: the trainers restore no other copy
    lineaged = state.model_copy(update={"fast_lineage": LINEAGE_B})
    running = job.model_copy(update={"status": status.model_copy(update={"in_place": lineaged})})
    named = in_place.order(running)
    assert named is not None and named.fast_lineage == LINEAGE_B
    assert parse_order(named.encode()) == named
    # everySteps: auto: the interval pinned for the generation goes with it
    paced = state.model_copy(update={"fast_every_steps": 35})
    running = job.model_copy(update={"status": status.model_copy(update={"in_place": paced})})
    timed = in_place.order(running, 1)
    assert timed is not None and timed.fast_every_steps == 35
    assert parse_order(timed.encode()) == timed
    # without a fast step the order is as before (no fast_step key on the wire)
    plain = state.model_copy(update={"fast_step": None})
    running = job.model_copy(update={"status": job.status.model_copy(update={"in_place": plain})})
    order = in_place.order(running)
    assert order is not None and order.fast_step is None
    assert "fast_step" not in order.to_json()
    # a stop order never carries one
    stopping = state.model_copy(update={"phase": "Stopping"})
    running = job.model_copy(
        update={"status": job.status.model_copy(update={"in_place": stopping})}
    )
    order = in_place.order(running)
    assert order is not None and order.action == "stop" and order.fast_step is None


# --- the job's fast-tier step (status.progress.fastStep, metrics) -------------------------


def test_the_jobs_fast_step_is_the_oldest_newest_step_and_complete_when_the_last_pod_was() -> None:
    tiers = {
        "p0": {"step": 140, "committed_wall_time": 1000.0},
        "p1": {"step": 130, "committed_wall_time": 990.0},
        "p2": {"step": 140, "committed_wall_time": 1005.5},
    }
    step, when = fast_tier_policy.summary(tiers, PODS) or (None, None)
    assert step == 130 and when is not None and when.timestamp() == 1005.5
    assert fast_tier_policy.summary({**tiers, "p1": None}, PODS) is None, "p1 holds none yet"
    assert fast_tier_policy.summary({k: v for k, v in tiers.items() if k != "p2"}, PODS) is None
    for junk in ({"step": "140", "committed_wall_time": 1.0}, {"step": 140}, {"step": -1},
                 {"step": True, "committed_wall_time": 1.0}):  # fmt: skip
        assert fast_tier_policy.summary({**tiers, "p0": junk}, PODS) is None, junk
    assert fast_tier_policy.summary(tiers, ()) is None
