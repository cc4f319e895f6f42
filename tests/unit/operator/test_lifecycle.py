"""reconcile/lifecycle.py: spec.suspend, spec.activeDeadlineSeconds and
spec.ttlSecondsAfterFinished, planned against `FakeWorld` (an API server plus the JobSet and
Kueue behaviour the operator relies on, in memory)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from rtj_test_support import NOW
from rtj_world import FakeWorld, iso, jobset, pod, reading, rtj_raw, snapshot

from rtj_operator import reconcile as rc
from rtj_operator.api import ResilientTrainingJob
from rtj_operator.metrics import job_facts
from rtj_operator.reconcile.lifecycle import deadline_of, finished_at

QUIET = (rc.PatchStatus, rc.CreateJobSet, rc.DeleteJobSet, rc.DeletePod, rc.DeleteJob)
GPU_MESSAGE = "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus"


def step(world: FakeWorld) -> rc.Plan:
    plan = rc.plan(world.snapshot())
    for action in plan.actions:
        world.apply(action)
    return plan


def settle(world: FakeWorld, limit: int = 40) -> list[rc.Plan]:
    """Plan, apply and let a second pass until a plan changes nothing."""
    plans = []
    for _ in range(limit):
        plan = step(world)
        plans.append(plan)
        world.tick(1)
        if not any(isinstance(a, QUIET) for a in plan.actions):
            return plans
    raise AssertionError("the world did not settle")


def edit(world: FakeWorld, **spec: Any) -> None:
    """`kubectl patch rtj --type merge -p '{"spec": ...}'`: a new generation."""
    world.raw["spec"].update(spec)
    world.raw["metadata"]["generation"] += 1


def status(world: FakeWorld) -> dict[str, Any]:
    return world.raw["status"]  # type: ignore[no-any-return]


def condition(world: FakeWorld, type_: str) -> dict[str, Any] | None:
    return next((c for c in status(world).get("conditions", []) if c["type"] == type_), None)


def reasons(world: FakeWorld) -> list[str]:
    return [e.reason for e in world.events]


def of(plans: list[rc.Plan], kind: type) -> list[Any]:
    return [a for p in plans for a in p.actions if isinstance(a, kind)]


def running_world(**spec: Any) -> FakeWorld:
    world = FakeWorld(rtj_raw(replicas=2, **spec))
    settle(world)
    assert status(world)["phase"] == "Running" and list(world.jobsets) == ["llm-a1"]
    return world


# --- suspend ----------------------------------------------------------------------------------


def test_suspending_a_running_job_stops_its_attempt_without_spending_budget() -> None:
    world = running_world()
    edit(world, suspend=True)
    plan = step(world)
    kinds = [type(a).__name__ for a in plan.actions]
    # the intent first: the status says Suspended, then the old world is deleted
    assert kinds[0] == "PatchStatus" and {"DeleteJobSet", "DeletePod"} <= set(kinds)
    assert kinds.index("DeleteJobSet") > 0
    st = status(world)
    assert st["phase"] == "Suspended"
    assert st["attempts"][-1]["endReason"] == "Suspended" and st["attempts"][-1]["endedAt"]
    assert "failureClass" not in st["attempts"][-1]
    assert st["restarts"] == {
        "infrastructure": 0,
        "user": 0,
        "preemption": 0,
        "checkpoint": 0,
        "preflight": 0,
        "silentDataCorruption": 0,
    }
    suspended = condition(world, "Suspended")
    assert suspended is not None and suspended["status"] == "True"
    assert suspended["reason"] == "JobSuspended"
    running = condition(world, "Running")
    assert running is not None and running["status"] == "False"
    assert reasons(world)[-1] == "Suspended"
    settle(world)
    assert not world.jobsets and not world.pods, "a suspended job runs nothing"
    assert status(world)["phase"] == "Suspended"
    quiet = step(world)
    assert not [a for a in quiet.actions if isinstance(a, QUIET)], "nothing more to do"


def test_resuming_starts_the_next_attempt_from_the_newest_step_without_backoff() -> None:
    world = running_world(failurePolicy={"backoff": {"initialSeconds": 600, "maxSeconds": 600}})
    edit(world, suspend=True)
    settle(world)
    world.store_step = 250  # published before the suspension took effect
    world.tick(3600)
    edit(world, suspend=False)
    plans = settle(world)
    creates = of(plans, rc.CreateJobSet)
    assert [c.body["metadata"]["name"] for c in creates] == ["llm-a2"]
    assert creates[0].body["metadata"]["annotations"]["training.resilient.dev/resume-step"] == (
        "250"
    )
    st = status(world)
    assert st["phase"] == "Running" and st["attempt"] == 2
    assert st["restarts"]["infrastructure"] == 0
    assert "recoverySeconds" not in st["attempts"][0], "a pause is no recovery"
    resumed = condition(world, "Suspended")
    assert resumed is not None and (resumed["status"], resumed["reason"]) == (
        "False",
        "JobResumed",
    )
    assert "Resumed" in reasons(world)
    assert world.overlaps == [], "attempt 2 waited for attempt 1's world to go"
    assert not [m for p in plans for m in p.metrics if m.kind == "recovery"]


def test_suspending_while_restarting_cancels_the_backoff_and_records_no_recovery() -> None:
    world = running_world(failurePolicy={"backoff": {"initialSeconds": 300, "maxSeconds": 300}})
    world.fail_pod(0)  # NCCL timeout: infrastructure, restart after 300 s of backoff
    for _ in range(3):  # recorded, torn down, waiting out the backoff
        step(world)
        world.tick(1)
    assert status(world)["phase"] == "Restarting" and status(world)["nextAttemptAt"]
    edit(world, suspend=True)
    settle(world)
    st = status(world)
    assert st["phase"] == "Suspended" and "nextAttemptAt" not in st
    assert st["attempts"][-1]["failureClass"] == "NetworkFault", "the failure stays recorded"
    assert "endReason" not in st["attempts"][-1]
    world.tick(10)
    edit(world, suspend=False)
    plans = settle(world)
    assert [c.body["metadata"]["name"] for c in of(plans, rc.CreateJobSet)] == ["llm-a2"]
    assert status(world)["restarts"]["infrastructure"] == 1, "spent by the failure, not more"
    assert "recoverySeconds" not in status(world)["attempts"][0]


def test_a_job_created_suspended_starts_nothing_until_resumed() -> None:
    world = FakeWorld(rtj_raw(replicas=2, suspend=True))
    plans = settle(world)
    assert not of(plans, rc.CreateJobSet) and not world.jobsets
    st = status(world)
    assert st["phase"] == "Suspended" and st.get("attempt", 0) == 0
    edit(world, suspend=False)
    settle(world)
    assert status(world)["phase"] == "Running" and list(world.jobsets) == ["llm-a1"]


def test_suspending_a_queued_attempt_deletes_its_jobset() -> None:
    raw = rtj_raw(
        {"phase": "Pending", "attempt": 1,
         "attempts": [{"attempt": 1, "jobSet": "llm-a1", "startedAt": iso(NOW)}]},
        suspend=True,
    )  # fmt: skip
    plan = rc.plan(snapshot(raw, jobsets=[jobset(1, suspended=True)], store=reading(100)))
    assert [a.name for a in plan.actions if isinstance(a, rc.DeleteJobSet)] == ["llm-a1"]
    patch = plan.status_patch
    assert patch is not None and patch.status["phase"] == "Suspended"
    assert patch.status["attempts"][-1]["endReason"] == "Suspended"


def test_a_failure_seen_while_suspending_spends_nothing() -> None:
    world = running_world()
    world.fail_pod(0, GPU_MESSAGE, xid=79)
    edit(world, suspend=True)
    settle(world)
    st = status(world)
    assert st["phase"] == "Suspended"
    assert st["restarts"]["infrastructure"] == 0 and not st.get("quarantinedNodes")


# --- activeDeadlineSeconds --------------------------------------------------------------------


def test_the_deadline_clock_starts_at_the_first_admission() -> None:
    world = running_world(activeDeadlineSeconds=3600)
    st = status(world)
    admitted = condition(world, "Admitted")
    assert admitted is not None and st["startTime"] == admitted["lastTransitionTime"]
    plan = step(world)
    assert plan.requeue_after is not None and plan.requeue_after <= 3600


def test_past_the_deadline_the_job_fails_for_good_as_a_user_failure() -> None:
    world = running_world(activeDeadlineSeconds=3600)
    world.fail_pod(0)  # an infrastructure restart: the clock keeps running through it
    settle(world)
    assert status(world)["attempt"] == 2 and status(world)["phase"] == "Running"
    world.tick(3600)
    plan = step(world)
    st = status(world)
    assert st["phase"] == "Failed"
    failed = condition(world, "Failed")
    assert failed is not None and failed["reason"] == "DeadlineExceeded"
    record = st["attempts"][-1]
    assert (record["endReason"], record["failureCategory"]) == ("DeadlineExceeded", "user")
    assert [a.name for a in plan.actions if isinstance(a, rc.DeleteJobSet)] == ["llm-a2"]
    assert isinstance(plan.actions[0], rc.PatchStatus), "the JobSet goes after the status"
    assert ("Warning", "DeadlineExceeded") in [(e.type, e.reason) for e in world.events]
    # the alert's category: the user's own limit warns, it does not page the platform
    facts = job_facts(ResilientTrainingJob.from_object(world.raw))
    assert facts.failed_category == "user"
    settle(world)
    assert not world.jobsets and not world.pods and status(world)["phase"] == "Failed"


def test_suspending_stops_and_resets_the_deadline_clock() -> None:
    world = running_world(activeDeadlineSeconds=3600)
    world.tick(3000)
    edit(world, suspend=True)
    settle(world)
    assert "startTime" not in status(world)
    world.tick(7200)  # suspended for longer than the deadline: nothing fails
    settle(world)
    assert status(world)["phase"] == "Suspended"
    edit(world, suspend=False)
    settle(world)
    st = status(world)
    assert st["phase"] == "Running" and datetime.fromisoformat(st["startTime"]) > NOW + timedelta(
        seconds=10000
    ), "the clock starts again at the first admission after the resume"
    world.tick(1800)
    settle(world)
    assert status(world)["phase"] == "Running"


def test_a_completed_jobset_wins_over_a_deadline_passed_meanwhile() -> None:
    start = NOW - timedelta(hours=2)
    raw = rtj_raw(
        {"phase": "Running", "attempt": 1, "startTime": iso(start),
         "attempts": [{"attempt": 1, "jobSet": "llm-a1", "startedAt": iso(start)}]},
        activeDeadlineSeconds=3600,
    )  # fmt: skip
    plan = rc.plan(snapshot(raw, jobsets=[jobset(1, completed=True)], store=reading(100)))
    patch = plan.status_patch
    assert patch is not None and patch.status["phase"] == "Succeeded"


def test_no_deadline_without_a_start() -> None:
    parsed = ResilientTrainingJob.from_object(rtj_raw({"phase": "Pending", "attempt": 1}))
    assert deadline_of(60, parsed.status) is None
    assert deadline_of(None, parsed.status) is None


# --- ttlSecondsAfterFinished ------------------------------------------------------------------


def _finished(phase: str, at: datetime, **spec: Any) -> dict[str, Any]:
    type_ = "Succeeded" if phase == "Succeeded" else "Failed"
    return rtj_raw(
        {"phase": phase, "attempt": 1,
         "attempts": [{"attempt": 1, "jobSet": "llm-a1", "startedAt": iso(at - timedelta(1)),
                       "endedAt": iso(at)}],
         "conditions": [{"type": type_, "status": "True", "reason": "x",
                         "lastTransitionTime": iso(at)}]},
        **spec,
    )  # fmt: skip


def test_a_finished_job_is_deleted_ttl_seconds_after_it_finished() -> None:
    raw = _finished("Succeeded", NOW - timedelta(seconds=30), ttlSecondsAfterFinished=60)
    early = rc.plan(snapshot(raw))
    assert not [a for a in early.actions if isinstance(a, rc.DeleteJob)]
    assert early.requeue_after is not None and abs(early.requeue_after - 30) < 1e-6
    due = rc.plan(snapshot(raw, now=NOW + timedelta(seconds=30)))
    deletes = [a for a in due.actions if isinstance(a, rc.DeleteJob)]
    assert deletes == [rc.DeleteJob("6f1c-uid", "Foreground")]
    assert [e.reason for e in due.actions if isinstance(e, rc.PostEvent)] == ["TTLExpired"]


def test_a_failed_job_is_deleted_too_and_never_without_a_ttl() -> None:
    failed = _finished("Failed", NOW - timedelta(hours=1), ttlSecondsAfterFinished=0)
    plan = rc.plan(snapshot(failed, jobsets=[jobset(1)]))
    kinds = [type(a).__name__ for a in plan.actions]
    assert "DeleteJob" in kinds and "DeleteJobSet" in kinds
    kept = rc.plan(snapshot(_finished("Failed", NOW - timedelta(days=30))))
    assert not [a for a in kept.actions if isinstance(a, rc.DeleteJob)]


def test_a_job_finishing_now_is_deleted_by_a_later_plan_not_this_one() -> None:
    """The plan that writes Succeeded also carries that status patch: the deletion waits for
    the next plan, which sees the finished job (no delete racing its own patch)."""
    world = running_world(ttlSecondsAfterFinished=0)
    world.jobsets["llm-a1"] = jobset(1, completed=True, created=world.now)
    finishing = step(world)
    assert status(world)["phase"] == "Succeeded"
    assert not [a for a in finishing.actions if isinstance(a, rc.DeleteJob)]
    assert finishing.requeue_after == 0.0
    after = step(world)
    assert [a for a in after.actions if isinstance(a, rc.DeleteJob)]


def test_finished_at_reads_the_finished_condition_or_the_last_attempt() -> None:
    at = NOW - timedelta(minutes=5)
    parsed = ResilientTrainingJob.from_object(_finished("Failed", at))
    assert finished_at(parsed.status) == at
    bare = ResilientTrainingJob.from_object(
        rtj_raw({"phase": "Succeeded", "attempt": 1,
                 "attempts": [{"attempt": 1, "jobSet": "llm-a1", "endedAt": iso(at)}]})
    )  # fmt: skip
    assert finished_at(bare.status) == at


def test_a_job_being_deleted_releases_its_claims_and_is_not_deleted_again() -> None:
    raw = _finished("Failed", NOW - timedelta(hours=1), ttlSecondsAfterFinished=0)
    raw["metadata"]["deletionTimestamp"] = iso(NOW)
    plan = rc.plan(snapshot(raw, pods=[pod(1, 0, exit_code=1)]))
    assert not [a for a in plan.actions if isinstance(a, rc.DeleteJob)]


def test_a_deadline_passed_while_restarting_warns_whatever_failed_before_it() -> None:
    world = running_world(activeDeadlineSeconds=3600)
    world.fail_pod(0)  # an infrastructure failure: its record says infrastructure
    step(world)
    assert status(world)["phase"] == "Restarting"
    world.tick(3600)
    settle(world)
    assert status(world)["phase"] == "Failed"
    failed = condition(world, "Failed")
    assert failed is not None and failed["reason"] == "DeadlineExceeded"
    facts = job_facts(ResilientTrainingJob.from_object(world.raw))
    assert facts.failed_category == "user", "the user's own limit: a warning, not a page"
