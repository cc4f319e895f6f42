"""The soak's Kueue preemption (issue 18): the schedule draws it, the harness makes Kueue
itself preempt (a fake API here: what is created, waited for and deleted, in order), the
judge holds it to `Preempted` and the report gives its figures; the JobSet baseline tells
the world its resumed pods start from the suspended one's."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from test_soak import CREATED, INJECTED, KILL, NODE_LOST, job_logs, job_status, no_fault

from bench import goodput, goodput_baseline, soak_judge, soak_report
from bench.soak_schedule import DEFAULT_MIX, KINDS, Fault, schedule
from e2e.cluster import kueue_preemption

# ---------------------------------------------------------------- the schedule


def test_preemption_is_in_the_default_mix_as_often_as_an_eviction() -> None:
    assert "preemption" in KINDS
    assert DEFAULT_MIX["preemption"] == DEFAULT_MIX["eviction"] > 0
    drawn = schedule(3, 36000, 60, ranks=2, caps=goodput.CAPS)
    share = sum(f.kind == "preemption" for f in drawn) / len(drawn)
    assert 0.05 < share < 0.25, share
    without = {k: w for k, w in DEFAULT_MIX.items() if k != "preemption"}
    assert all(f.kind != "preemption" for f in schedule(3, 36000, 60, ranks=2, mix=without))


def test_the_verification_seed_preempts_early() -> None:
    """`python -m bench.goodput --steps 2000 --mtbf 30 --seed 8`: a preemption first."""
    plan = schedule(8, 2000 * goodput.SoakOptions.expected_step_seconds, 30,
                    ranks=goodput.RANKS, caps=goodput.CAPS)  # fmt: skip
    assert plan[0].kind == "preemption" and plan[0].at < 30, plan


# ---------------------------------------------------------------- Kueue, faked


class Clock:
    """`kueue_preemption.time` without waiting: each `monotonic()` call `step` seconds later."""

    def __init__(self, step: float) -> None:
        self.step, self.now = step, 0.0

    def monotonic(self) -> float:
        self.now += self.step
        return self.now

    def time(self) -> float:
        return 1e9 + self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class FakeKube:
    """What `kueue_preemption.kueue_preempt` calls: Kueue admits the urgent Job's Workload after
    `admit_after` polls; its Job and Workload go `gone_after` polls after the delete."""

    def __init__(self, quota: int = 48, admit_after: int = 2, gone_after: int = 2) -> None:
        self.calls: list[tuple[str, str]] = []
        self.quota, self.admit_after, self.gone_after = quota, admit_after, gone_after
        self.job: dict[str, Any] | None = None
        self.deleted = False
        self.polls = 0
        self.batch = self
        self.custom = self

    # Kueue custom objects
    def kueue_get(self, plural: str, name: str) -> dict[str, Any]:
        assert plural == "clusterqueues"
        gpu = {"name": "nvidia.com/gpu", "nominalQuota": str(self.quota)}
        flavor = {"name": "f", "resources": [{"name": "cpu", "nominalQuota": "9"}, gpu]}
        return {"spec": {"resourceGroups": [{"flavors": [flavor]}]}}

    def kueue_create(self, plural: str, obj: dict[str, Any]) -> None:
        self.calls.append(("create", f"{plural}/{obj['metadata']['name']}"))
        assert obj["value"] == goodput.PREEMPTION_PRIORITY

    def kueue_list(self, plural: str, namespace: str) -> list[dict[str, Any]]:
        assert plural == "workloads"
        if self.job is None:
            return []
        self.polls += 1
        if self.deleted and self.polls > self.gone_after:
            return []
        admitted = self.polls > self.admit_after
        owner = {"kind": "Job", "name": self.job["metadata"]["name"]}
        status = {"conditions": [{"type": "Admitted", "status": "True"}]} if admitted else {}
        return [{"metadata": {"name": "job-urgent", "ownerReferences": [owner]},
                 "status": status}]  # fmt: skip

    def delete_cluster_custom_object(
        self, group: str, version: str, plural: str, name: str
    ) -> None:
        self.calls.append(("delete", f"{plural}/{name}"))

    # batch/v1 Jobs
    def create_namespaced_job(self, namespace: str, body: dict[str, Any]) -> None:
        self.calls.append(("create", f"jobs/{body['metadata']['name']}"))
        self.job = body

    def delete_namespaced_job(self, name: str, namespace: str, propagation_policy: str) -> None:
        assert propagation_policy == "Foreground"
        self.calls.append(("delete", f"jobs/{name}"))
        self.deleted, self.polls = True, 0

    def read_namespaced_job(self, name: str, namespace: str) -> None:
        self.polls += 1
        if self.deleted and self.polls > self.gone_after:
            raise ApiException(status=404)


def test_kueue_preempt_creates_the_urgent_work_holds_and_cleans_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kueue_preemption, "time", Clock(1))
    kube = FakeKube()
    p = kueue_preemption.kueue_preempt(kube, "ns", "q", "cq", hold=5.0, name="urgent-1",  # type: ignore[arg-type]
                             priority=goodput.PREEMPTION_PRIORITY)  # fmt: skip
    assert kube.calls == [
        ("create", "workloadpriorityclasses/urgent-1"),
        ("create", "jobs/urgent-1"),
        ("delete", "jobs/urgent-1"),
        ("delete", "workloadpriorityclasses/urgent-1"),
    ]
    assert (p.pods, p.gpus_per_pod) == (6, 8), "the ClusterQueue's whole quota"
    assert p.admitted is not None and p.gone is not None
    assert p.created <= p.admitted <= p.released <= p.gone
    job = kube.job
    assert job is not None
    labels = job["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/queue-name"] == "q"
    assert labels["kueue.x-k8s.io/priority-class"] == "urgent-1"
    assert job["spec"]["suspend"] is True and job["spec"]["parallelism"] == 6
    [container] = job["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["requests"]["nvidia.com/gpu"] == "8"


def test_an_urgent_workload_never_admitted_is_still_deleted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kueue_preemption, "time", Clock(10))
    kube = FakeKube(admit_after=10**6, gone_after=0)
    p = kueue_preemption.kueue_preempt(kube, "ns", "q", "cq", hold=5.0, timeout=30.0)  # type: ignore[arg-type]
    assert p.admitted is None
    assert ("delete", "jobs/urgent") in kube.calls
    assert kube.calls[-1] == ("delete", "workloadpriorityclasses/urgent")
    assert goodput.preemption_text(p).endswith("not admitted: nothing preempted")


class FakeCQ:
    def __init__(self) -> None:
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.custom = self

    def patch_cluster_custom_object(
        self, group: str, version: str, plural: str, name: str, body: dict[str, Any]
    ) -> None:
        self.patches.append((f"{plural}/{name}", body))


def test_the_cluster_queue_preempts_only_when_the_schedule_holds_a_preemption() -> None:
    kube = FakeCQ()
    assert not goodput.prepare_preemption(kube, [Fault(10.0, "eviction", 0)])
    assert kube.patches == []
    assert goodput.prepare_preemption(kube, [Fault(10.0, "eviction", 0),
                                             Fault(60.0, "preemption", 1)])  # fmt: skip
    lower = {"spec": {"preemption": {"withinClusterQueue": "LowerPriority"}}}
    assert kube.patches == [(f"clusterqueues/{goodput.CLUSTER_QUEUE}", lower)]


def test_a_preemption_is_recorded_from_the_urgent_workloads_arrival() -> None:
    class Injector:
        def __init__(self) -> None:
            self.preemptions: list[kueue_preemption.Preemption] = []

        def apply(self, fault: Fault) -> str:
            if fault.kind == "preemption":
                self.preemptions.append(kueue_preemption.Preemption("urgent-1", 6, 8, 1000, 100.0,
                                                          101.5, 106.5, 108.0))  # fmt: skip
                return goodput.preemption_text(self.preemptions[-1])
            return "SIGKILL"

    injector = Injector()
    record = goodput.inject(injector, Fault(30.0, "preemption", 1))  # type: ignore[arg-type]
    assert record["at"] == 100.0 and record["scheduled"] == 30.0
    assert record["preemptor"] == {"name": "urgent-1", "created": 100.0, "admitted": 101.5,
                                   "released": 106.5, "gone": 108.0}  # fmt: skip
    assert record["what"] == (
        "Kueue: urgent Job urgent-1 (6 pods x 8 GPUs, the ClusterQueue's whole quota, priority "
        "1000) admitted 1.5 s after it arrived (ours evicted), held the quota 5.0 s, gone 1.5 s "
        "after its deletion"
    )
    other = goodput.inject(injector, Fault(80.0, "rank_killed", 0))  # type: ignore[arg-type]
    assert "preemptor" not in other and other["at"] > 1000


def test_the_settings_name_the_hold_only_when_a_preemption_may_come() -> None:
    opts = goodput.SoakOptions(preemption_hold=3.0)
    assert goodput.settings(opts)["preemption hold"] == "3 s"
    smoke = goodput.SoakOptions(faults=[Fault(15.0, "hang", 1)])
    assert "preemption hold" not in goodput.settings(smoke)


# ---------------------------------------------------------------- the judge and the report
#
# test_soak's job with its second fault a preemption: node_lost at NODE_LOST becomes Kueue
# evicting attempt 1 (the urgent workload admitted 1 s later, held 5 s), attempt 2 resumes.

PREEMPTOR = {"name": "urgent-1", "created": NODE_LOST, "admitted": NODE_LOST + 1.0,
             "released": NODE_LOST + 6.0, "gone": NODE_LOST + 7.0}  # fmt: skip
PREEMPTED = [INJECTED[0], {**INJECTED[1], "kind": "preemption", "what": "Kueue: ...",
                           "preemptor": PREEMPTOR}]  # fmt: skip


def preempted_status(failure_class: str = "Preempted") -> dict[str, Any]:
    status = job_status()
    category = "preemption" if failure_class == "Preempted" else "infrastructure"
    status["attempts"][0].update(failureClass=failure_class, failureCategory=category)
    status["restarts"].update(infrastructure=1, preemption=1)
    return status


def test_a_kueue_preemption_is_judged_and_reported() -> None:
    facts = soak_judge.judge(CREATED, preempted_status(), job_logs(), PREEMPTED, no_fault(), [])
    assert facts["problems"] == []
    killed, preempted = facts["recoveries"]
    assert "quota_held_seconds" not in killed
    assert (preempted["kind"], preempted["path"], preempted["failure_class"]) == (
        "preemption", "whole world", "Preempted",
    )  # fmt: skip
    # attempt 2's first step at 161: 13.5 s from the urgent workload's arrival, of which
    # 1 s for Kueue to evict ours, 5 s held, 7.5 s after it left
    assert preempted["seconds_to_first_step"] == pytest.approx(161.0 - NODE_LOST)
    assert preempted["evicted_seconds"] == pytest.approx(1.0)
    assert preempted["quota_held_seconds"] == pytest.approx(5.0)
    assert preempted["after_release_seconds"] == pytest.approx(161.0 - NODE_LOST - 6.0)
    text = soak_report.markdown(facts, {}, "test")
    assert "| preemption | 1 g1 -> 2 | whole world | Preempted |" in text
    assert ("Kueue preemptions (the time not admitted is lost wall time, in the recovery's "
            "seconds to the first step): attempt 1 g1: Kueue evicted it and admitted the urgent "
            "workload in 1.0 s, which held the quota 5.0 s; the job trained again 7.5 s after "
            "it left.") in text  # fmt: skip
    assert "Not injected yet" not in text and "a Kueue preemption included" in text


def test_a_preemption_must_be_recorded_preempted_and_spend_no_max_restarts() -> None:
    status = preempted_status("Evicted")
    status["restarts"].update(infrastructure=2, preemption=0)
    problems = soak_judge.judge(CREATED, status, job_logs(), PREEMPTED, no_fault(), [])["problems"]
    assert problems == ["preemption at +48 s recorded as Evicted, not Preempted"]
    status = preempted_status()
    status["restarts"].update(infrastructure=2, preemption=0)
    problems = soak_judge.judge(CREATED, status, job_logs(), PREEMPTED, no_fault(), [])["problems"]
    assert problems == [
        "budget: 1 attempts ended by a preemption, the status counts 0 preemption restarts"
    ]


def test_a_preemption_kueue_never_made_or_never_undid_is_a_problem() -> None:
    stuck = [INJECTED[0], {**PREEMPTED[1], "preemptor": {**PREEMPTOR, "gone": None}}]
    problems = soak_judge.judge(CREATED, preempted_status(), job_logs(), stuck, no_fault(),
                                ["Job urgent-1"])["problems"]  # fmt: skip
    assert problems == [
        "leaked: Job urgent-1",
        "preemption at +48 s: the urgent workload urgent-1 was not gone within the timeout",
    ]
    never = [INJECTED[0], {**PREEMPTED[1], "preemptor": {**PREEMPTOR, "admitted": None}}]
    problems = soak_judge.judge(CREATED, preempted_status(), job_logs(), never, no_fault(),
                                [])["problems"]  # fmt: skip
    assert problems == [
        "preemption at +48 s: Kueue never admitted the urgent workload (nothing preempted)"
    ]
    skipped = [INJECTED[0], {**PREEMPTED[1], "what": "skipped: no running trainer"}]
    status = job_status()
    status["attempts"][0].update(failureClass="NodeLost")
    assert soak_judge.judge(CREATED, status, job_logs(), skipped, no_fault(), [])["problems"] == []


# ---------------------------------------------------------------- the baseline's worlds


def pod_log(restored: int, first: float, steps: range) -> list[str]:
    out = [json.dumps({"event": "restore", "step": restored, "time": first})]
    out += [json.dumps({"step": s, "loss": 1.0, "time": first + i + 1})
            for i, s in enumerate(steps)]  # fmt: skip
    return out


def test_the_baseline_counts_a_resumed_jobset_as_a_world_of_its_own() -> None:
    restart0 = [(0, r, pod_log(0, 10.0 + r * 0.01, range(1, 31))) for r in (0, 1)]
    # restart 1: killed rank; then Kueue suspends the JobSet, and its Jobs' new pods (same
    # restart attempt) resume from step 40 at t=120 (rank 1's file globbed first)
    restart1 = [(1, r, pod_log(20, 50.0 + r * 0.01, range(21, 46))) for r in (0, 1)]
    resumed = [(1, r, pod_log(40, 120.0 + r * 0.01, range(41, 61))) for r in (1, 0)]
    restart2 = [(2, 0, pod_log(60, 200.0, range(61, 71)))]
    worlds = goodput_baseline.split_restarts([*restart0, *resumed, *restart1, *restart2])
    assert sorted(worlds) == [0, 1, 2, 3]
    assert worlds[1][0] == restart1[0][2] and worlds[2][0] == resumed[1][2]
    assert worlds[2][1] == resumed[0][2] and worlds[3] == {0: restart2[0][2]}
    # without a preemption the attempts are the JobSet's restart attempts, as before
    plain = goodput_baseline.split_restarts([*restart0, *restart1, (3, 0, ["{}"])])
    assert sorted(plain) == [0, 1, 3] and plain[1][0] == restart1[0][2]


def test_kueue_preemption_names_what_reaches_the_baseline() -> None:
    from bench import soak_compare

    assert "**preemption** is Kueue's own" in soak_compare.HOW
    assert KILL < NODE_LOST


def test_the_baseline_draws_the_schedule_the_operators_run_drew() -> None:
    opts = goodput.SoakOptions(steps=4000, mtbf=90, seed=4)

    def ran(mix: dict[str, float], faults: int) -> dict[str, Any]:
        plan = goodput_baseline.seeded(goodput.SoakOptions(steps=4000, mtbf=90, seed=4, mix=mix))
        injected = [{"scheduled": f.at, "kind": f.kind, "rank": f.rank} for f in plan[:faults]]
        return {"injected": json.loads(json.dumps(injected))}

    legacy = goodput_baseline.LEGACY_MIX
    assert "preemption" not in legacy
    # seed 4 draws a node_lost at +149 s under the old mix, a preemption under today's
    old = ran(legacy, 3)
    assert [f["kind"] for f in old["injected"]] == ["rank_killed", "rank_killed", "node_lost"]
    assert goodput_baseline.mix_of(old, opts) == legacy
    assert goodput_baseline.mix_of(ran(dict(DEFAULT_MIX), 3), opts) == dict(DEFAULT_MIX)
    assert goodput_baseline.mix_of({"mix": {"hang": 1.0}, "injected": []}, opts) == {"hang": 1.0}
