"""`plannedIntervalSeconds: auto` (issue 48): the platform's policy, the failures and save
costs it is chosen from, status, the signed order to every pod, and the sidecar's mount."""

from __future__ import annotations

import copy
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from pydantic import ValidationError
from rtj_world import NOW, jobset, rtj_raw, snapshot
from test_in_place import KEY, RUNNING, T
from test_in_place_peer_replica import names
from test_in_place_replace import replaceable_pods

from rtj_operator import reconcile as rc
from rtj_operator.api import keys
from rtj_operator.api.checkpoint_spec import Checkpoint
from rtj_operator.api.intervals import CheckpointIntervals
from rtj_operator.api.resource import ResilientTrainingJob
from rtj_operator.api.status import RestartCounts
from rtj_operator.policy import intervals
from rtj_operator.policy.intervals import (
    IntervalConfigError,
    IntervalPolicy,
    Measured,
    choose,
    durable_cost,
    planned_seconds,
    work_losing_failures,
)
from rtj_operator.policy.platform import PlatformConfigError, load_interval_policy
from rtj_operator.policy.progress import PodReport
from rtj_operator.policy.render import pod_template
from rtj_shim.wire.interval_order import accept_interval_order

UID = "6f1c-uid"
AUTO = {
    "replicas": 3,
    "recovery": {"inPlace": True},
    "checkpoint": {"uri": "s3://ckpt/team-a/llm", "plannedIntervalSeconds": "auto"},
}


def test_the_spec_takes_seconds_or_auto_and_names_the_field_otherwise() -> None:
    assert Checkpoint(uri="s3://b/x", planned_interval_seconds="auto").auto_interval
    assert not Checkpoint(uri="s3://b/x", planned_interval_seconds=60).auto_interval
    for bad in (0, "fast", True):
        with pytest.raises(ValidationError, match=r"(?i)planned_?interval_?seconds"):
            Checkpoint(uri="s3://b/x", planned_interval_seconds=bad)


def test_the_platforms_policy_names_a_bad_field() -> None:
    policy = load_interval_policy("checkpointIntervals: {priorFailuresPerNodeHour: 0.01}\n")
    assert policy.prior_failures_per_node_hour == 0.01 and policy.min_seconds == 30
    assert load_interval_policy("nodeHealth: {}\n") == IntervalPolicy()
    for text, field in (
        ("checkpointIntervals: {priorWeightHours: 0}", "priorWeightHours"),
        ("checkpointIntervals: {minSeconds: 90, maxSeconds: 60}", "minSeconds"),
        ("checkpointIntervals: {everySeconds: 5}", "unknown field"),
        ("checkpointIntervals: [1]", "checkpointIntervals: expected a mapping"),
    ):
        with pytest.raises(PlatformConfigError, match=field):
            load_interval_policy(text)
    with pytest.raises(IntervalConfigError, match="assumedSaveSeconds"):
        IntervalPolicy(assumed_save_seconds=float("nan"))


def test_preemptions_cost_no_work_the_other_restarts_do() -> None:
    counts = RestartCounts(infrastructure=5, preemption=2, user=1, silent_data_corruption=1)
    assert work_losing_failures(counts) == 5


def _entry(**costs: Any) -> dict[str, Any]:
    return {"rank": 0, "save_costs": costs}


def test_the_slowest_ranks_durable_save_is_the_cost_and_a_bad_entry_is_skipped() -> None:
    reports = [
        PodReport("p0", T, {"ranks": [_entry(durable={"seconds": 1.5, "saves": 2})]}),
        PodReport("p1", T, {"ranks": [_entry(durable={"seconds": 2.5, "saves": 2}),
                                      _entry(durable={"seconds": -4, "saves": 1}),
                                      _entry(fast={"seconds": 9.0, "saves": 9}), "junk"]}),
    ]  # fmt: skip
    assert durable_cost(reports) == 2.5
    assert durable_cost([PodReport("p0", T, {"ranks": [{"rank": 0}]})]) is None


DEFAULT = IntervalPolicy()


def _choose(
    failures: int,
    hours: float,
    cost: float | None,
    current: CheckpointIntervals | None = None,
    policy: IntervalPolicy = DEFAULT,
) -> CheckpointIntervals | None:
    return choose(policy, pods=4, failures=failures, exposure_hours=hours,
                  measured=Measured(durable_cost=cost), current=current, now=NOW)  # fmt: skip


def test_more_failures_and_cheaper_saves_mean_shorter_intervals() -> None:
    quiet = _choose(0, 100.0, 2.0)
    failing = _choose(20, 100.0, 2.0)
    assert quiet is not None and failing is not None
    assert failing.failures_per_hour > quiet.failures_per_hour
    assert failing.durable_seconds < quiet.durable_seconds
    # the rate it states is the posterior's, the interval Daly's for it (within the rounding)
    rate = intervals.failure_rate(IntervalPolicy().prior(4), 20, 100.0)
    assert failing.failures_per_hour == pytest.approx(rate)
    assert failing.durable_seconds == round(intervals.daly_interval(2.0, 3600 / rate))
    assumed = _choose(20, 100.0, None)
    assert assumed is not None and not assumed.save_cost_measured
    assert assumed.durable_save_seconds == IntervalPolicy().assumed_save_seconds
    assert assumed.durable_seconds > failing.durable_seconds  # 10 s assumed against 2 s measured


def test_the_platforms_floor_and_ceiling_bound_the_tenants_word() -> None:
    policy = IntervalPolicy(min_seconds=45, max_seconds=900)
    fast = _choose(10_000, 1.0, 1e-9, policy=policy)  # a lie of a free save and many failures
    slow = _choose(0, 0.0, 80_000.0, policy=policy)
    assert fast is not None and fast.durable_seconds == 45
    assert slow is not None and slow.durable_seconds == 900


def test_an_interval_within_a_tenth_stands_until_a_failure_or_a_measurement() -> None:
    first = _choose(1, 10.0, 2.0)
    assert first is not None
    assert _choose(1, 10.5, 2.1, current=first) is None  # noise: the trainers are not re-sent
    assert _choose(2, 10.5, 2.0, current=first) is not None  # a new failure
    # restarted trainers report no cost until their first save: the measured one stands,
    # never the platform's assumption again (10 s: an interval ten times too long)
    assert _choose(1, 10.0, None, current=first) is None
    after_restart = _choose(2, 10.0, None, current=first)
    assert after_restart is not None and after_restart.save_cost_measured
    assert after_restart.durable_save_seconds == first.durable_save_seconds == 2.0
    assumed = _choose(2, 10.0, None)
    assert assumed is not None and assumed.durable_seconds > after_restart.durable_seconds
    assert planned_seconds(600, first, 21600) == 600
    assert planned_seconds("auto", first, 21600) == first.durable_seconds
    assert planned_seconds("auto", None, 21600) == 21600


def _running(status_extra: dict[str, Any] | None = None) -> dict[str, Any]:
    raw = rtj_raw({**RUNNING, **(status_extra or {})}, **copy.deepcopy(AUTO))
    raw["metadata"]["creationTimestamp"] = (NOW - timedelta(hours=10)).isoformat()
    return raw


def _readings(pods: list[dict[str, Any]], bodies: list[dict[str, Any]]) -> rc.RankReadings:
    reports = tuple(
        PodReport(p["metadata"]["name"], T, b) for p, b in zip(pods, bodies, strict=True)
    )
    return rc.RankReadings(attempt=1, reports=reports, polled_at=T)


def test_a_running_auto_job_gets_its_interval_in_status_from_the_measured_cost() -> None:
    pods = replaceable_pods(3)
    bodies = [{"ranks": [_entry(durable={"seconds": 4.0, "saves": 3})]} for _ in pods]
    snap = snapshot(_running({"restarts": {"infrastructure": 2}}), jobsets=[jobset(1)], pods=pods)
    patch = rc.plan(replace(snap, ranks=_readings(pods, bodies), control_key=KEY)).status_patch
    assert patch is not None
    chosen = CheckpointIntervals.model_validate(patch.status["checkpointIntervals"])
    assert chosen.failures == 2 and chosen.save_cost_measured
    assert chosen.durable_save_seconds == 4.0
    assert chosen.exposure_hours == pytest.approx(10.0)
    expected = intervals.daly_interval(4.0, 3600 / intervals.failure_rate(
        IntervalPolicy().prior(3), 2, 10.0))  # fmt: skip
    assert chosen.durable_seconds == round(expected)
    # a job that sets its own seconds has none
    fixed = _running({"checkpointIntervals": patch.status["checkpointIntervals"]})
    fixed["spec"]["checkpoint"]["plannedIntervalSeconds"] = 300
    snap = replace(snapshot(fixed, jobsets=[jobset(1)], pods=pods), control_key=KEY)
    patch = rc.plan(snap).status_patch
    assert patch is not None and patch.patch.get("checkpointIntervals", "kept") is None


def _interval_messages(snap: rc.Snapshot) -> dict[str, list[rc.PollMessage]]:
    sent = rc.pod_messages(snap, rc.poll_targets(snap)).messages
    return {pod: [m for m in ms if m.path == "/intervals"] for pod, ms in sent.items()
            if any(m.path == "/intervals" for m in ms)}  # fmt: skip


def test_every_pod_is_sent_the_signed_interval_until_its_report_shows_it() -> None:
    pods = replaceable_pods(3)
    chosen = {
        "durableSeconds": 420, "failuresPerHour": 0.1, "failures": 1, "exposureHours": 2,
        "durableSaveSeconds": 3.0, "saveCostMeasured": True, "chosenAt": NOW.isoformat(),
    }  # fmt: skip
    raw = _running({"checkpointIntervals": chosen})
    snap = replace(snapshot(raw, jobsets=[jobset(1)], pods=pods), control_key=KEY)
    sent = _interval_messages(replace(snap, ranks=_readings(pods, [{}, {}, {}])))
    assert set(sent) == set(names(pods))
    (message,) = sent[names(pods)[1]]
    order = accept_interval_order(message.body, message.signature, key=KEY, job_uid=UID)
    assert order.durable_seconds == 420
    shown = [{"intervals": {"durable_seconds": 420}}, {"intervals": {"durable_seconds": 60}}, {}]
    sent = _interval_messages(replace(snap, ranks=_readings(pods, shown)))
    assert set(sent) == set(names(pods)[1:])  # the first shows it; the others do not yet
    fixed = copy.deepcopy(raw)
    fixed["spec"]["checkpoint"]["plannedIntervalSeconds"] = 600
    assert _interval_messages(replace(snap, rtj=ResilientTrainingJob.model_validate(fixed))) == {}


def test_the_sidecar_may_write_the_progress_volume_only_to_take_the_interval() -> None:
    def mount(spec: dict[str, Any], key: str | None) -> bool:
        rtj = ResilientTrainingJob.model_validate(rtj_raw(RUNNING, **spec))
        (sidecar,) = [c for c in pod_template(rtj, 1, 0, "llm-a1", key)["spec"]["initContainers"]
                      if c["name"] == keys.PROGRESS_SIDECAR]  # fmt: skip
        (volume,) = [m for m in sidecar["volumeMounts"] if m["name"] == keys.PROGRESS_VOLUME]
        return bool(volume["readOnly"])

    assert mount(AUTO, KEY) is False
    assert mount(AUTO, None) is True  # no key: no order could be taken
    fixed = copy.deepcopy(AUTO)
    fixed["checkpoint"]["plannedIntervalSeconds"] = 600
    assert mount(fixed, KEY) is True


# --- fastTier.everySteps: auto ------------------------------------------------------------


def test_a_fast_tier_takes_the_failures_it_covers_from_the_durable_interval() -> None:
    measured = Measured(durable_cost=2.0, fast_cost=0.05, step_seconds=0.06)
    kwargs: dict[str, Any] = {"pods": 4, "failures": 3, "exposure_hours": 20.0, "current": None,
                              "now": NOW, "measured": measured}  # fmt: skip
    alone = choose(DEFAULT, **kwargs)
    fixed = choose(DEFAULT, fast_tier="fixed", **kwargs)
    auto = choose(DEFAULT, fast_tier="auto", **kwargs)
    assert alone is not None and fixed is not None and auto is not None
    assert fixed.durable_seconds > alone.durable_seconds  # the fast tier takes most failures
    assert fixed.fast_every_steps is None and fixed.fast_covers == DEFAULT.fast_tier_covers
    tiers = intervals.tier_intervals(
        auto.failures_per_hour, 2.0, 0.05, DEFAULT.fast_tier_covers)  # fmt: skip
    assert tiers.fast is not None and auto.fast_seconds == pytest.approx(tiers.fast)
    assert auto.fast_every_steps == round(tiers.fast / 0.06)
    assert auto.fast_save_seconds == 0.05
    # no step time measured yet: no steps chosen (the pods keep what they started with)
    early = choose(DEFAULT, fast_tier="auto", **{**kwargs, "measured": Measured()})
    assert early is not None and early.fast_every_steps is None
    assert early.fast_save_seconds == DEFAULT.assumed_fast_save_seconds
    # a new failure moves the fast interval too, and a move beyond a tenth is a new choice
    again = choose(DEFAULT, fast_tier="auto", **{**kwargs, "failures": 9, "current": auto})
    assert again is not None and again.fast_every_steps is not None
    assert again.fast_every_steps < auto.fast_every_steps
    with pytest.raises(IntervalConfigError, match="fastTierCovers"):
        IntervalPolicy(fast_tier_covers=1.0)


def test_a_measured_fast_save_cost_outlives_the_trainers_that_measured_it() -> None:
    kwargs: dict[str, Any] = {"pods": 4, "exposure_hours": 20.0, "now": NOW, "fast_tier": "auto"}
    measured = Measured(durable_cost=2.0, fast_cost=0.05, step_seconds=0.06)
    first = choose(DEFAULT, failures=3, current=None, measured=measured, **kwargs)
    assert first is not None and first.fast_save_cost_measured is True
    # restarted trainers report no cost until their first saves: the measured ones stand
    # (the assumed 0.5 s fast save would set an interval three times too long)
    restarted = Measured(step_seconds=0.06)
    assert choose(DEFAULT, failures=3, current=first, measured=restarted, **kwargs) is None
    after = choose(DEFAULT, failures=4, current=first, measured=restarted, **kwargs)
    assert after is not None and after.fast_save_cost_measured and after.save_cost_measured
    assert after.fast_save_seconds == 0.05 and after.durable_save_seconds == 2.0
    assumed = choose(DEFAULT, failures=4, current=None, measured=restarted, **kwargs)
    assert assumed is not None and assumed.fast_save_cost_measured is False
    assert assumed.fast_every_steps is not None and after.fast_every_steps is not None
    assert assumed.fast_every_steps > after.fast_every_steps
    # a job without a fast tier says nothing of one
    alone = choose(DEFAULT, **{**kwargs, "fast_tier": "none"}, failures=3, current=None,
                   measured=Measured(durable_cost=2.0))  # fmt: skip
    assert alone is not None and alone.fast_save_cost_measured is None


def _fast_auto(chosen: dict[str, Any] | None = None, **fast: Any) -> ResilientTrainingJob:
    spec = copy.deepcopy(AUTO)
    spec["checkpoint"]["fastTier"] = {"everySteps": "auto", **fast}
    extra = {"checkpointIntervals": chosen} if chosen else {}
    return ResilientTrainingJob.model_validate(rtj_raw({**RUNNING, **extra}, **spec))


def test_a_new_world_starts_at_the_fast_interval_chosen_last() -> None:
    chosen = {
        "durableSeconds": 420, "failuresPerHour": 0.1, "failures": 1, "exposureHours": 2,
        "durableSaveSeconds": 3.0, "saveCostMeasured": True, "fastEverySteps": 35,
        "chosenAt": NOW.isoformat(),
    }  # fmt: skip

    def every(rtj: ResilientTrainingJob) -> str:
        (trainer,) = pod_template(rtj, 1, 0, "llm-a1", KEY)["spec"]["containers"]
        return next(e["value"] for e in trainer["env"] if e["name"] == keys.ENV_FAST_EVERY_STEPS)

    assert every(_fast_auto(chosen)) == "35"
    assert every(_fast_auto()) == str(intervals.AUTO_FAST_EVERY_START)  # none chosen yet
    with pytest.raises(ValidationError, match="drainEverySteps must be a multiple"):
        _fast_auto(drainEverySteps=100)  # a drain cannot follow auto
