"""reconcile.plan: the operator's loop as a pure function of a snapshot."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from typing import Any

from rtj_test_support import NOW
from rtj_world import (
    JOB_UID,
    apply_patch,
    iso,
    jobset,
    node,
    nodes_for,
    pod,
    reading,
    rtj_raw,
    snapshot,
    with_status,
)

from rtj_operator import reconcile as rc
from rtj_operator.api import keys
from rtj_operator.reconcile.detect import UNEXPLAINED_SETTLE as SETTLED

FILE_URI = {"checkpoint": {"uri": "file:///mnt/ckpt/llm"}}


def kinds(plan: rc.Plan) -> list[str]:
    return [type(a).__name__ for a in plan.actions]


def pod_name_of(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["name"])


def of(plan: rc.Plan, kind: type) -> list[Any]:
    return [a for a in plan.actions if isinstance(a, kind)]


def status_of(plan: rc.Plan, raw: dict[str, Any]) -> dict[str, Any]:
    return with_status(raw, plan)["status"]


def condition(status: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions", []) if c["type"] == type_), None)


def running(attempt: int = 1, **extra: Any) -> dict[str, Any]:
    record = {
        "attempt": attempt,
        "jobSet": f"llm-a{attempt}",
        "startedAt": iso(NOW - timedelta(hours=2)),
        "resumedFromStep": 100,
    }
    return {"phase": "Running", "attempt": attempt, "attempts": [record], **extra}


# --- starting ---------------------------------------------------------------------------------


def test_first_attempt_reads_the_store_then_pins_its_newest_verified_step() -> None:
    raw = rtj_raw()
    first = rc.plan(snapshot(raw))
    assert first.needs_store and not first.actions

    plan = rc.plan(snapshot(raw, store=reading(1200)))
    assert kinds(plan) == ["CreateJobSet", "PatchStatus", "PostEvent"]
    body = of(plan, rc.CreateJobSet)[0].body
    assert body["metadata"]["name"] == "llm-a1"
    assert body["metadata"]["annotations"][keys.RESUME_STEP_ANNOTATION] == "1200"
    status = status_of(plan, raw)
    assert status["attempt"] == 1 and status["phase"] == "Pending"
    assert status["attempts"][0]["resumedFromStep"] == 1200
    assert status["lastVerifiedCheckpoint"]["step"] == 1200
    assert of(plan, rc.PostEvent)[0].reason == "AttemptStarted"


def test_a_stale_store_reading_is_read_again_before_starting() -> None:
    old = reading(1200, at=NOW - timedelta(minutes=5))
    assert rc.plan(snapshot(rtj_raw(), store=old)).needs_store


def test_file_roots_are_never_pinned_by_the_operator() -> None:
    plan = rc.plan(snapshot(rtj_raw(**FILE_URI)))
    assert not plan.needs_store
    body = of(plan, rc.CreateJobSet)[0].body
    assert keys.RESUME_STEP_ANNOTATION not in body["metadata"]["annotations"]
    init = body["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "initContainers"
    ][0]
    assert "--step" not in init["command"]


def test_an_unreadable_store_blocks_the_attempt_with_a_condition_not_a_fresh_start() -> None:
    raw = rtj_raw()
    plan = rc.plan(snapshot(raw, store=reading(None, error="access denied (403)")))
    assert not of(plan, rc.CreateJobSet)
    status = status_of(plan, raw)
    cond = condition(status, "CheckpointUnreadable")
    assert cond is not None and cond["status"] == "True" and "access denied" in cond["message"]
    assert [e.reason for e in of(plan, rc.PostEvent)] == ["CheckpointStoreUnreadable"]
    assert plan.requeue_after == rc.STORE_RETRY_MIN_SECONDS

    again = rc.plan(
        snapshot(with_status(raw, plan), store=reading(None, error="access denied (403)"))
    )
    assert not again.actions, "no second event, no status churn while it stays unreadable"

    healed = rc.plan(snapshot(with_status(raw, plan), store=reading(1200)))
    assert "CreateJobSet" in kinds(healed)
    assert (
        condition(status_of(healed, with_status(raw, plan)), "CheckpointUnreadable")["status"]
        == "False"
    )


def test_an_unreadable_store_is_read_again_soon_at_first_then_less_often() -> None:
    raw = rtj_raw()
    err = "Could not connect to the endpoint URL"
    first = rc.plan(snapshot(raw, store=reading(None, error=err)))
    assert first.requeue_after == rc.STORE_RETRY_MIN_SECONDS
    raw = with_status(raw, first)
    due = NOW + timedelta(seconds=rc.STORE_RETRY_MIN_SECONDS)
    assert rc.plan(snapshot(raw, now=due, store=reading(None, at=NOW, error=err))).needs_store
    later = NOW + timedelta(seconds=20)  # 20 s into the outage: the next read 20 s later
    plan = rc.plan(snapshot(raw, now=later, store=reading(None, at=later, error=err)))
    assert not plan.needs_store and plan.requeue_after == 20.0
    assert not rc.plan(snapshot(raw, now=later + timedelta(seconds=19),
                                store=reading(None, at=later, error=err))).needs_store  # fmt: skip
    hour = NOW + timedelta(hours=1)
    plan = rc.plan(snapshot(raw, now=hour, store=reading(None, at=hour, error=err)))
    assert plan.requeue_after == rc.STORE_RETRY_SECONDS


def test_a_jobset_created_before_a_crash_is_adopted_not_created_twice() -> None:
    raw = rtj_raw()
    plan = rc.plan(snapshot(raw, jobsets=[jobset(1, suspended=True, resume=1200)]))
    assert "CreateJobSet" not in kinds(plan)
    status = status_of(plan, raw)
    assert status["attempt"] == 1 and status["attempts"][0]["resumedFromStep"] == 1200


def test_a_same_named_jobset_another_job_owns_is_never_adopted_but_deleted() -> None:
    """A job deleted and re-created under the same name: the old job's JobSet (another owner
    uid) is not this job's attempt 1; it goes before this job's attempt 1 is created."""
    raw = rtj_raw()
    old = jobset(1, suspended=True, resume=1200, owner="uid-of-a-deleted-job")
    plan = rc.plan(snapshot(raw, jobsets=[old]))
    assert "CreateJobSet" not in kinds(plan)
    assert [a.name for a in of(plan, rc.DeleteJobSet)] == ["llm-a1"]
    assert (plan.status_patch is None) or status_of(plan, raw).get("attempt", 0) == 0


# --- watching an attempt ------------------------------------------------------------------------


def test_a_pod_not_controlled_by_this_jobs_jobset_is_no_evidence() -> None:
    """Issue 13: a bare pod in the tenant's namespace with the job's labels and another
    team's node (or a pod of an earlier job of the same name) cannot fail the job, and so
    cannot get that node quarantined."""
    raw = rtj_raw(running())
    healthy = [pod(1, i) for i in range(3)]
    nccl = "NCCL error: unhandled system error"
    bare = pod(1, 9, node="team-b-node", exit_code=1, message=nccl)
    del bare["metadata"]["ownerReferences"]
    earlier = pod(1, 8, node="team-b-node", exit_code=1, message=nccl, owner="old-uid")
    for spoof in (bare, earlier):
        snap = snapshot(raw, jobsets=[jobset(1)], pods=[*healthy, spoof])
        plan = rc.plan(snap)
        assert not of(plan, rc.TaintNode) and not of(plan, rc.DeleteJobSet), spoof
        assert plan.status_patch is None or status_of(plan, raw)["phase"] == "Running"
        assert "ignored as evidence" in plan.summary
    # the same failure on a pod the JobSet's Job created is evidence (the check can fail)
    real = pod(1, 3, node="team-b-node", exit_code=1, message=nccl)
    plan = rc.plan(snapshot(raw, jobsets=[jobset(1)], pods=[*healthy, real]))
    assert [a.name for a in of(plan, rc.DeleteJobSet)] == ["llm-a1"]
    assert status_of(plan, raw)["phase"] == "Restarting"


def test_a_pod_of_an_attempt_whose_jobset_is_gone_stays_evidence() -> None:
    raw = rtj_raw(running())
    failed = pod(1, 2, exit_code=1, message="NCCL error: unhandled system error")
    gone_js = jobset(1, deleting=True)
    plan = rc.plan(snapshot(raw, gone=[failed], gone_jobsets=[gone_js]))
    assert status_of(plan, raw)["attempts"][-1]["firstFailed"]["pod"] == pod_name_of(failed)


def test_admission_then_running_are_recorded_once() -> None:
    raw = rtj_raw({"phase": "Pending", "attempt": 1, "attempts": running()["attempts"]})
    pods = [pod(1, i) for i in range(4)]
    plan = rc.plan(snapshot(raw, jobsets=[jobset(1)], pods=pods))
    status = status_of(plan, raw)
    assert status["phase"] == "Running"
    assert condition(status, "Admitted")["status"] == "True"
    assert condition(status, "Running")["status"] == "True"
    again = rc.plan(snapshot(with_status(raw, plan), jobsets=[jobset(1)], pods=pods))
    assert not again.status_patch


def test_suspended_jobset_keeps_the_job_pending() -> None:
    raw = rtj_raw({"phase": "Pending", "attempt": 1, "attempts": running()["attempts"]})
    plan = rc.plan(snapshot(raw, jobsets=[jobset(1, suspended=True)]))
    assert not plan.status_patch
    assert plan.needs_queue == "team-a", "waiting for admission: is there a LocalQueue at all?"
    there = rc.QueueReading(NOW, exists=True, name="team-a")
    plan = rc.plan(rc.with_queue(snapshot(raw, jobsets=[jobset(1, suspended=True)]), there))
    assert not plan.status_patch and not plan.needs_queue
    assert plan.requeue_after == rc.QUEUE_RECHECK.total_seconds()


def test_a_queue_that_does_not_exist_is_reported_in_the_admitted_condition() -> None:
    raw = rtj_raw({"phase": "Pending", "attempt": 1, "attempts": running()["attempts"]})
    waiting = snapshot(raw, jobsets=[jobset(1, suspended=True)])
    missing = rc.QueueReading(NOW, exists=False, detail='"team-a" not found', name="team-a")
    plan = rc.plan(rc.with_queue(waiting, missing))
    admitted = condition(status_of(plan, raw), "Admitted")
    assert admitted["status"] == "False" and admitted["reason"] == "LocalQueueNotFound"
    assert "LocalQueue team-a does not exist in namespace team-a" in admitted["message"]
    assert [(e.type, e.reason) for e in of(plan, rc.PostEvent)] == [
        ("Warning", "LocalQueueNotFound")
    ]
    raw = with_status(raw, plan)
    again = rc.plan(rc.with_queue(snapshot(raw, jobsets=[jobset(1, suspended=True)]), missing))
    assert not again.actions, "said once"
    stale = snapshot(raw, jobsets=[jobset(1, suspended=True)], now=NOW + rc.QUEUE_RECHECK)
    assert rc.plan(rc.with_queue(stale, missing)).needs_queue, "looked up again later"
    created = rc.QueueReading(NOW, exists=True, name="team-a")
    fixed = rc.plan(rc.with_queue(snapshot(raw, jobsets=[jobset(1, suspended=True)]), created))
    assert condition(status_of(fixed, raw), "Admitted")["reason"] == "AwaitingAdmission"
    unknown = rc.QueueReading(NOW, exists=None, detail="forbidden", name="team-a")
    raw2 = rtj_raw({"phase": "Pending", "attempt": 1, "attempts": running()["attempts"]})
    plan = rc.plan(rc.with_queue(snapshot(raw2, jobsets=[jobset(1, suspended=True)]), unknown))
    assert not plan.actions, "a lookup that failed proves nothing"


def test_the_queue_looked_up_is_the_one_the_waiting_jobset_carries() -> None:
    raw = rtj_raw({"phase": "Pending", "attempt": 1, "attempts": running()["attempts"]})
    js = jobset(1, suspended=True)
    js["metadata"].setdefault("labels", {})["kueue.x-k8s.io/queue-name"] = "typo-queue"
    plan = rc.plan(snapshot(raw, jobsets=[js]))  # spec.queueName was fixed since: team-a
    assert plan.needs_queue == "typo-queue", "Kueue reads the label, not the spec"
    other = rc.QueueReading(NOW, exists=True, name="team-a")
    assert rc.plan(rc.with_queue(snapshot(raw, jobsets=[js]), other)).needs_queue == "typo-queue"
    missing = rc.QueueReading(NOW, exists=False, name="typo-queue")
    admitted = condition(status_of(rc.plan(rc.with_queue(snapshot(raw, jobsets=[js]), missing)),
                                   raw), "Admitted")  # fmt: skip
    assert "LocalQueue typo-queue does not exist" in admitted["message"]


def test_gpu_fault_quarantines_then_restarts_converging_before_the_next_attempt() -> None:
    raw = rtj_raw(running())
    pods = [pod(1, i) for i in range(4)]
    xid = "RuntimeError: CUDA error: unspecified launch failure"
    pods[2] = pod(1, 2, exit_code=1, message=xid)
    nodes = {**nodes_for(pods), "gpu-node-002": node("gpu-node-002", xid=79)}
    snap = dict(jobsets=[jobset(1)], pods=pods, nodes=nodes)

    # one plan quarantines and restarts (one classification, one call of the policy)
    restart = rc.plan(snapshot(raw, **snap))
    order = kinds(restart)
    assert order[:2] == ["PatchStatus", "DeleteJobSet"], "record the failure, then tear down"
    assert order.index("SetFinalizer") < order.index("TaintNode"), (
        "the quarantine is recorded (the intent), then the finalizer, then the taint"
    )
    taint = of(restart, rc.TaintNode)[0]
    assert (taint.node, taint.job, taint.uid) == ("gpu-node-002", "team-a/llm", JOB_UID)
    assert dict(taint.taint) == {
        "key": keys.DEFAULT_TAINT_KEY,
        "value": "llm",
        "effect": "NoSchedule",
    }
    assert of(restart, rc.DeleteJobSet)[0].name == "llm-a1"
    status = status_of(restart, raw)
    quarantined = status["quarantinedNodes"][0]
    assert (quarantined["node"], quarantined["taintKey"], quarantined["taintEffect"]) == (
        "gpu-node-002", keys.DEFAULT_TAINT_KEY, "NoSchedule")  # fmt: skip
    assert status["phase"] == "Restarting" and status["recoveryPhase"] == "BackingOff"
    assert status["restarts"]["infrastructure"] == 1
    record = status["attempts"][0]
    assert record["failureClass"] == "GPUFault" and record["failureCategory"] == "infrastructure"
    assert record["firstFailed"]["pod"].startswith("llm-a1-worker-0-2")
    assert record["detectionSeconds"] is not None
    assert record["evidence"] and record["quarantinedNodes"] == ["gpu-node-002"]
    warnings = [e for e in of(restart, rc.PostEvent) if e.type == "Warning"]
    assert [e.reason for e in warnings][:2] == ["NodesQuarantined", "RestartScheduled"]
    assert all("GPUFault" in e.message and "evidence" in e.message for e in warnings[:2])
    assert {m.kind for m in restart.metrics} == {"failure", "restart", "detection"}
    raw = with_status(raw, restart)
    raw["metadata"]["finalizers"] = [keys.RELEASE_FINALIZER]
    # the node as the API server then shows it: tainted, the claim recorded
    edit = rc.claim([], None, taint.taint, rc.Claimant(taint.job, taint.uid))
    assert edit is not None
    claimed = {keys.QUARANTINE_OWNERS_ANNOTATION: edit.annotation or ""}
    nodes["gpu-node-002"] = node("gpu-node-002", xid=79, taints=edit.taints, annotations=claimed)

    # the old world is still there (being deleted): nothing new starts
    later = NOW + timedelta(seconds=30)
    deleting = [jobset(1, deleting=True)]
    waiting = rc.plan(
        snapshot(raw, jobsets=deleting, pods=pods, now=later, store=reading(1200, at=later))
    )
    assert "CreateJobSet" not in kinds(waiting) and "DeleteJobSet" not in kinds(waiting)
    assert waiting.requeue_after == rc.CONVERGE_POLL_SECONDS
    raw = with_status(raw, waiting) if waiting.status_patch else raw

    # the world is gone and the backoff (10 s) elapsed: attempt 2, avoiding the bad node
    start = rc.plan(snapshot(raw, now=later, store=reading(1200, at=later)))
    assert kinds(start)[:2] == ["CreateJobSet", "PatchStatus"]
    body = of(start, rc.CreateJobSet)[0].body
    assert body["metadata"]["name"] == "llm-a2"
    pod_spec = body["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    terms = pod_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["gpu-node-002"]
    status = status_of(start, raw)
    assert status["attempt"] == 2 and status["phase"] == "Pending"
    assert status["attempts"][0]["recoverySeconds"] == 30.0
    assert status["attempts"][1]["resumedFromStep"] == 1200
    assert "recovery" in {m.kind for m in start.metrics}


def test_backoff_is_waited_out_with_a_requeue_not_a_sleep() -> None:
    until = NOW + timedelta(seconds=40)
    raw = rtj_raw({**running(), "phase": "Restarting", "nextAttemptAt": iso(until)})
    plan = rc.plan(snapshot(raw, store=reading(1200)))
    assert "CreateJobSet" not in kinds(plan)
    assert plan.requeue_after == 40.0
    assert condition(status_of(plan, raw), "Restarting")["reason"] == "BackoffWaiting"


def test_old_jobsets_and_every_old_pod_are_deleted_before_the_next_attempt() -> None:
    raw = rtj_raw({**running(), "phase": "Restarting"})
    orphan = pod(1, 3)
    orphan["metadata"]["labels"][keys.JOBSET_NAME_LABEL] = "llm-a0"  # its JobSet is gone
    going = pod(1, 1, deleting=True)
    pods = [pod(1, 0), going, orphan]
    plan = rc.plan(snapshot(raw, jobsets=[jobset(1)], pods=pods, store=reading(1)))
    assert [a.name for a in of(plan, rc.DeleteJobSet)] == ["llm-a1"]
    assert [(a.name, a.grace_seconds) for a in of(plan, rc.DeletePod)] == [
        (pods[0]["metadata"]["name"], None),
        (orphan["metadata"]["name"], None),
    ], "every pod not being deleted yet, directly (not only after the JobSet's cascade)"
    assert "CreateJobSet" not in kinds(plan)


def _failed_and_recorded() -> tuple[dict[str, Any], list[dict[str, Any]], rc.Plan]:
    """A NetworkFault on rank 0 of 4, recorded at NOW: the job as stored after it."""
    raw = rtj_raw(running())
    pods = [pod(1, 0, exit_code=1, message="NCCL error: unhandled system error")]
    pods += [pod(1, i) for i in range(1, 4)]
    restart = rc.plan(snapshot(raw, jobsets=[jobset(1)], pods=pods))
    return with_status(raw, restart), pods, restart


def test_the_failure_plan_deletes_the_jobset_and_every_pod_in_the_same_pass() -> None:
    _, pods, restart = _failed_and_recorded()
    assert kinds(restart)[:6] == ["PatchStatus", "DeleteJobSet"] + ["DeletePod"] * 4, (
        "record the failure first, then the whole old world at once"
    )
    assert sorted(a.name for a in of(restart, rc.DeletePod)) == sorted(
        p["metadata"]["name"] for p in pods
    )


def test_deletes_just_sent_are_not_sent_again_until_the_resend_window_passes() -> None:
    raw, pods, _ = _failed_and_recorded()
    soon = NOW + timedelta(seconds=1)  # the watch cache has not seen the deletions yet
    plan = rc.plan(snapshot(raw, jobsets=[jobset(1)], pods=pods, now=soon, store=reading(1, soon)))
    assert not of(plan, rc.DeleteJobSet) and not of(plan, rc.DeletePod)
    assert "CreateJobSet" not in kinds(plan)
    assert plan.requeue_after == (rc.DELETE_RESEND - timedelta(seconds=1)).total_seconds()
    late = pod(1, 9)  # created after the failure's pass: it was not deleted then
    late["metadata"]["creationTimestamp"] = iso(soon)
    plan = rc.plan(snapshot(raw, pods=[*pods, late], now=soon, store=reading(1, soon)))
    assert [a.name for a in of(plan, rc.DeletePod)] == [late["metadata"]["name"]]
    # a delete that got lost is sent again once the window has passed
    after = NOW + rc.DELETE_RESEND
    plan = rc.plan(snapshot(raw, jobsets=[jobset(1)], pods=pods, now=after,
                            store=reading(1, after)))  # fmt: skip
    assert [a.name for a in of(plan, rc.DeleteJobSet)] == ["llm-a1"]
    assert len(of(plan, rc.DeletePod)) == 4


def test_pod_deletes_the_api_server_accepted_are_not_sent_again_while_the_cache_lags() -> None:
    """At 1,250 pods the watch cache showed the old pods deleting 30 s after their deletes
    were accepted, and every plan past the resend window sent them all again (4,291 DELETEs
    for 1,250 pods). The applier remembers the accepted ones (`Snapshot.accepted_deletes`):
    only a delete never accepted, of another pod under the same name, or a force now needed
    where a graceful one was accepted goes out again."""
    raw, pods, _ = _failed_and_recorded()
    for p in pods:
        p["metadata"]["uid"] = f"uid-{p['metadata']['name']}"
    names = [p["metadata"]["name"] for p in pods]
    accepted = {n: rc.AcceptedDelete(f"uid-{n}", None) for n in names[:3]}
    accepted[names[0]] = rc.AcceptedDelete("uid-of-an-earlier-pod-of-that-name", None)
    after = NOW + rc.DELETE_RESEND
    snap = snapshot(raw, jobsets=[jobset(1)], pods=pods, now=after, store=reading(1, after))
    plan = rc.plan(replace(snap, accepted_deletes=accepted))
    assert [a.name for a in of(plan, rc.DeleteJobSet)] == ["llm-a1"]
    assert sorted(a.name for a in of(plan, rc.DeletePod)) == sorted([names[0], names[3]])
    assert {a.uid for a in of(plan, rc.DeletePod)} == {f"uid-{names[0]}", f"uid-{names[3]}"}
    # a graceful delete accepted does not stand for the force a gone node's pod needs
    assert not rc.AcceptedDelete("u", None).covers("u", 0)
    assert rc.AcceptedDelete("u", 0).covers("u", 0) and rc.AcceptedDelete("u", 0).covers("u", None)
    assert rc.AcceptedDelete("u", 5).covers("u", None)


def test_a_teardown_stamped_by_a_clock_ahead_of_ours_is_not_trusted_to_be_recent() -> None:
    raw, pods, _ = _failed_and_recorded()
    earlier = NOW - timedelta(minutes=10)  # a new leader whose clock is 10 minutes behind
    plan = rc.plan(snapshot(raw, jobsets=[jobset(1)], pods=pods, now=earlier,
                            store=reading(1, earlier)))  # fmt: skip
    assert [a.name for a in of(plan, rc.DeleteJobSet)] == ["llm-a1"], "deletes are re-sent"


def test_converging_patches_the_status_once_not_once_per_pod_gone() -> None:
    raw, pods, _ = _failed_and_recorded()
    patches = 0
    for left in range(len(pods), 0, -1):  # the pods go one by one
        at = NOW + timedelta(seconds=len(pods) - left + 1)
        going = [pod(1, i, deleting=True) for i in range(left)]
        plan = rc.plan(snapshot(raw, pods=going, now=at, store=reading(1, at)))
        assert "CreateJobSet" not in kinds(plan) and not of(plan, rc.DeletePod)
        if plan.status_patch:
            patches += 1
            raw = with_status(raw, plan)
    assert patches == 1
    cond = condition(raw["status"], "Restarting")
    assert cond["reason"] == "WaitingForOldWorld"
    assert not any(ch.isdigit() for ch in cond["message"].split(":", 1)[1]), cond["message"]


def test_pods_on_a_deleted_node_are_force_deleted_so_the_restart_is_not_held() -> None:
    raw = rtj_raw({**running(), "phase": "Restarting"})
    stuck = pod(1, 1, deleting=True)  # Terminating on a node whose Node object is gone
    alive = pod(1, 0, deleting=True)
    nodes = {"gpu-node-000": node("gpu-node-000")}  # gpu-node-001 no longer exists
    snap = snapshot(raw, jobsets=[jobset(1, deleting=True)], pods=[alive, stuck], nodes=nodes,
                    store=reading(1), deleted_nodes=frozenset({"gpu-node-001"}))  # fmt: skip
    plan = rc.plan(snap)
    deletes = of(plan, rc.DeletePod)
    assert [(a.name, a.grace_seconds) for a in deletes] == [(stuck["metadata"]["name"], 0)]
    assert "CreateJobSet" not in kinds(plan), "still converging until both pods are gone"
    # a node the cache merely lacks (its watch event not in yet) is no proof: no force
    unseen = rc.plan(replace(snap, deleted_nodes=frozenset()))
    assert not of(unseen, rc.DeletePod)


def test_a_restart_is_counted_once_however_often_the_same_world_is_seen() -> None:
    raw = rtj_raw(running())
    pods = [pod(1, 0, exit_code=1, message="NCCL error: unhandled system error"), pod(1, 1)]
    restart = rc.plan(snapshot(raw, jobsets=[jobset(1)], pods=pods))
    patch = restart.status_patch
    assert patch is not None and patch.resource_version == "10", "conditional on what was read"
    raw = with_status(raw, restart)
    for seconds in (1, 2, 3):
        again = rc.plan(snapshot(raw, jobsets=[jobset(1, deleting=True)], pods=pods,
                                 now=NOW + timedelta(seconds=seconds)))  # fmt: skip
        status = status_of(again, raw) if again.status_patch else raw["status"]
        assert status["restarts"]["infrastructure"] == 1
        assert not [m for m in again.metrics if m.kind == "restart"]


def test_user_errors_fail_fast_and_never_taint() -> None:
    raw = rtj_raw(running())
    pods = [
        pod(1, 0, exit_code=1, message="Traceback (most recent call last):\nValueError: bad config")
    ]
    settled = NOW + rc.USER_FAILURE_SETTLE
    plan = rc.plan(snapshot(raw, jobsets=[jobset(1)], pods=pods, now=settled))
    assert not of(plan, rc.TaintNode)
    status = status_of(plan, raw)
    assert status["phase"] == "Failed"
    assert status["attempts"][0]["failureClass"] == "UserError"
    assert condition(status, "Failed")["reason"] == "UserErrorBudgetExhausted"
    # a failed job holds no JobSet (so no quota, no GPUs): deleted after the status patch
    assert kinds(plan)[:2] == ["PatchStatus", "DeleteJobSet"]
    failed = with_status(raw, plan)
    again = snapshot(failed, jobsets=[jobset(1, deleting=True)], pods=pods, now=settled)
    assert not rc.plan(again).actions
    # a Failed job whose JobSet survived (a lost delete, an older operator) loses it now
    kept = rc.plan(snapshot(failed, jobsets=[jobset(1)], pods=pods, now=settled))
    assert [a.name for a in of(kept, rc.DeleteJobSet)] == ["llm-a1"]
    assert kept.status_patch is None


# --- the settle window before a user-category failure is final ----------------------------------

CUDA_TRACEBACK = (
    'Traceback (most recent call last):\n  File "train.py", line 212, in <module>\n'
    "RuntimeError: CUDA error: unspecified launch failure"
)


def _xid_node(name: str, at: Any) -> dict[str, Any]:
    """The node as the GPU health agent leaves it: an XID 79 condition since `at`."""
    n = node(name)
    n["status"]["conditions"].append(
        {"type": "SysLogsXIDError", "status": "True", "reason": "XIDError",
         "message": "ErrorCode:79 GPU has fallen off the bus", "lastTransitionTime": iso(at)}
    )  # fmt: skip
    return n


def test_a_user_failure_is_not_recorded_within_the_settle_window() -> None:
    raw = rtj_raw(running())
    pods = [pod(1, 0, exit_code=1, message=CUDA_TRACEBACK), *(pod(1, i) for i in range(1, 4))]
    for seconds in (0.0, 1.0, 4.5):
        at = NOW + timedelta(seconds=seconds)
        plan = rc.plan(snapshot(raw, jobsets=[jobset(1)], pods=pods, now=at))
        assert not plan.actions, "nothing recorded, nothing deleted, nothing tainted"
        assert plan.requeue_after == (rc.USER_FAILURE_SETTLE.total_seconds() - seconds)
    events_unread = replace(snapshot(raw, jobsets=[jobset(1)], pods=pods), events=None)
    assert rc.plan(events_unread).needs_events, "each look reads the events afresh"


def test_a_kubelet_clock_far_ahead_does_not_hold_a_user_failure_open() -> None:
    raw = rtj_raw(running())
    ahead = NOW + timedelta(minutes=10)
    pods = [pod(1, 0, exit_code=1, message=CUDA_TRACEBACK, finished=ahead),
            *(pod(1, i) for i in range(1, 4))]  # fmt: skip
    plan = rc.plan(snapshot(raw, jobsets=[jobset(1)], pods=pods, now=NOW))
    assert status_of(plan, raw)["attempts"][0]["failureClass"] == "UserError"


def test_an_xid_reported_within_the_window_turns_the_record_into_a_gpu_fault() -> None:
    raw = rtj_raw(running())
    pods = [pod(1, 0, exit_code=1, message=CUDA_TRACEBACK), *(pod(1, i) for i in range(1, 4))]
    at = NOW + timedelta(seconds=2)
    first = rc.plan(snapshot(raw, jobsets=[jobset(1)], pods=pods, now=NOW + timedelta(seconds=1)))
    assert not first.actions
    nodes = {p["spec"]["nodeName"]: node(p["spec"]["nodeName"]) for p in pods}
    nodes["gpu-node-000"] = _xid_node("gpu-node-000", at)  # the agent reports a moment late
    quarantine = rc.plan(snapshot(raw, jobsets=[jobset(1)], pods=pods, nodes=nodes, now=at))
    assert [a.node for a in of(quarantine, rc.TaintNode)] == ["gpu-node-000"]
    raw = with_status(raw, quarantine)
    restart = rc.plan(snapshot(raw, jobsets=[jobset(1)], pods=pods, nodes=nodes, now=at))
    status = status_of(restart, raw)
    record = status["attempts"][0]
    assert record["failureClass"] == "GPUFault" and record["failureCategory"] == "infrastructure"
    assert status["phase"] == "Restarting" and status["restarts"]["user"] == 0
    assert record["detectionSeconds"] == 2.0
    assert any("SysLogsXIDError" in line for line in record["evidence"])


def test_after_the_window_a_user_error_is_recorded() -> None:
    raw = rtj_raw(running())
    pods = [pod(1, 0, exit_code=1, message=CUDA_TRACEBACK), *(pod(1, i) for i in range(1, 4))]
    at = NOW + rc.USER_FAILURE_SETTLE
    plan = rc.plan(snapshot(raw, jobsets=[jobset(1)], pods=pods, now=at))
    status = status_of(plan, raw)
    assert status["phase"] == "Failed"
    record = status["attempts"][0]
    assert record["failureClass"] == "UserError"
    assert record["detectionSeconds"] == rc.USER_FAILURE_SETTLE.total_seconds()
    assert not of(plan, rc.TaintNode)


def test_an_oom_waits_out_the_window_too() -> None:
    raw = rtj_raw(running(), failurePolicy={"userErrorRestarts": 1})
    pods = [pod(1, 1, exit_code=137, reason="OOMKilled"), pod(1, 0)]
    waiting = rc.plan(snapshot(raw, jobsets=[jobset(1)], pods=pods))
    assert not waiting.actions and waiting.requeue_after == rc.USER_FAILURE_SETTLE.total_seconds()
    at = NOW + rc.USER_FAILURE_SETTLE
    status = status_of(rc.plan(snapshot(raw, jobsets=[jobset(1)], pods=pods, now=at)), raw)
    assert status["attempts"][0]["failureClass"] == "OutOfMemory"
    assert status["restarts"]["user"] == 1


def test_infrastructure_failures_are_recorded_at_once() -> None:
    raw = rtj_raw(running())
    nccl = [pod(1, 0, exit_code=1, message="NCCL error: unhandled system error"), pod(1, 1)]
    status = status_of(rc.plan(snapshot(raw, jobsets=[jobset(1)], pods=nccl)), raw)
    assert status["attempts"][0]["failureClass"] == "NetworkFault"
    assert status["attempts"][0]["detectionSeconds"] == 0.0
    gpu = [pod(1, 0, exit_code=1, message="RuntimeError: CUDA error"), pod(1, 1)]
    agent = {"gpu-node-000": node("gpu-node-000", xid=79), "gpu-node-001": node("gpu-node-001")}
    plan = rc.plan(snapshot(raw, jobsets=[jobset(1)], pods=gpu, nodes=agent))
    assert [a.node for a in of(plan, rc.TaintNode)] == ["gpu-node-000"]
    lost = {"gpu-node-000": node("gpu-node-000", ready=False), "gpu-node-001": node("gpu-node-001")}
    plan = rc.plan(snapshot(raw, jobsets=[jobset(1)], pods=nccl, nodes=lost))
    assert [a.node for a in of(plan, rc.TaintNode)] == ["gpu-node-000"]


def test_node_lost_quarantines_the_lost_node() -> None:
    raw = rtj_raw(running())
    pods = [pod(1, 0), pod(1, 1, exit_code=1, message="NCCL timeout")]
    nodes = {
        "gpu-node-000": node("gpu-node-000", ready=False),
        "gpu-node-001": node("gpu-node-001"),
    }
    plan = rc.plan(snapshot(raw, jobsets=[jobset(1)], pods=pods, nodes=nodes))
    assert [a.node for a in of(plan, rc.TaintNode)] == ["gpu-node-000"]


def test_corrupt_pinned_step_is_marked_bad_and_restarts_at_once() -> None:
    raw = rtj_raw(running())
    init = {"exitCode": 1, "reason": "Error", "message": json.dumps({"step": None}),
            "finishedAt": iso(NOW)}  # fmt: skip
    failed = pod(1, 0, phase="Failed", init=init)
    failed["status"]["containerStatuses"] = []
    plan = rc.plan(snapshot(raw, jobsets=[jobset(1)], pods=[failed]))
    status = status_of(plan, raw)
    assert status["attempts"][0]["failureClass"] == "CheckpointCorrupt"
    assert status["badSteps"] == [100]
    assert status["nextAttemptAt"] == status["attempts"][0]["endedAt"]


def test_file_root_init_container_reports_the_resumed_step() -> None:
    raw = rtj_raw({**running(), "attempts": [{"attempt": 1, "jobSet": "llm-a1"}]}, **FILE_URI)
    result = json.dumps({"step": 700, "uri": "file:///mnt/ckpt/llm/steps/step-000000000700",
                         "verification": "deep", "skipped": []})  # fmt: skip
    init = {"exitCode": 0, "reason": "Completed", "message": result, "finishedAt": iso(NOW)}
    plan = rc.plan(snapshot(raw, jobsets=[jobset(1)], pods=[pod(1, 0, init=init)]))
    status = status_of(plan, raw)
    assert status["attempts"][0]["resumedFromStep"] == 700
    assert status["lastVerifiedCheckpoint"]["step"] == 700


def test_jobset_completion_succeeds_the_job() -> None:
    raw = rtj_raw(running())
    pods = [pod(1, i, exit_code=0, reason="Completed") for i in range(2)]
    status = status_of(rc.plan(snapshot(raw, jobsets=[jobset(1, completed=True)], pods=pods)), raw)
    assert status["phase"] == "Succeeded"
    assert condition(status, "Complete")["status"] == "True"  # kubectl wait's word
    assert condition(status, "Complete")["reason"] == "JobSucceeded"
    assert condition(status, "Succeeded")["status"] == "True"  # the deprecated alias


def test_a_jobset_deleted_behind_the_operators_back_is_a_failure_after_a_grace() -> None:
    raw = rtj_raw(running())
    plan = rc.plan(snapshot(raw))
    status = status_of(plan, raw)
    assert status["phase"] == "Restarting"
    assert "no longer exists" in status["attempts"][0]["evidence"][0]
    fresh = rtj_raw(
        {**running(), "attempts": [{"attempt": 1, "jobSet": "llm-a1", "startedAt": iso(NOW)}]}
    )
    assert rc.plan(snapshot(fresh)).requeue_after == 1.0


def test_stray_jobsets_of_earlier_attempts_are_deleted() -> None:
    raw = rtj_raw(running(attempt=2))
    plan = rc.plan(snapshot(raw, jobsets=[jobset(1), jobset(2)], pods=[pod(2, 0)]))
    assert [a.name for a in of(plan, rc.DeleteJobSet)] == ["llm-a1"]


# --- quarantine TTL ---------------------------------------------------------------------------


def test_quarantine_ttl_lifts_the_taint_and_the_record() -> None:
    q = {"node": "gpu-node-002", "failureClass": "GPUFault", "attempt": 1,
         "since": iso(NOW - timedelta(hours=2))}  # fmt: skip
    fresh = {**q, "node": "gpu-node-003", "since": iso(NOW - timedelta(minutes=30))}
    raw = rtj_raw(
        {**running(), "quarantinedNodes": [q, fresh]}, nodeHealth={"quarantineTtlSeconds": 3600}
    )
    plan = rc.plan(snapshot(raw, jobsets=[jobset(1)], pods=[pod(1, i) for i in range(4)]))
    assert [a.node for a in of(plan, rc.UntaintNode)] == ["gpu-node-002"]
    assert [q["node"] for q in status_of(plan, raw)["quarantinedNodes"]] == ["gpu-node-003"]
    assert plan.requeue_after is not None and plan.requeue_after <= 1800
    assert "QuarantineLifted" in [e.reason for e in of(plan, rc.PostEvent)]


def test_without_a_ttl_quarantine_stays() -> None:
    q = {"node": "gpu-node-002", "failureClass": "GPUFault", "attempt": 1,
         "since": iso(NOW - timedelta(days=30))}  # fmt: skip
    raw = rtj_raw({**running(), "quarantinedNodes": [q]})
    plan = rc.plan(snapshot(raw, jobsets=[jobset(1)], pods=[pod(1, i) for i in range(4)]))
    assert not of(plan, rc.UntaintNode)


# --- checkpoint age -----------------------------------------------------------------------------


def test_checkpoint_stale_condition_follows_the_newest_verified_step() -> None:
    since = NOW - timedelta(hours=3)
    conditions = [{"type": "Running", "status": "True", "reason": "AttemptRunning",
                   "lastTransitionTime": iso(since)}]  # fmt: skip
    old = {"step": 5, "uri": "s3://x", "committedAt": iso(NOW - timedelta(hours=2)),
           "verifiedAt": iso(NOW)}  # fmt: skip
    raw = rtj_raw({**running(), "conditions": conditions, "lastVerifiedCheckpoint": old})
    pods = [pod(1, i) for i in range(4)]
    plan = rc.plan(snapshot(raw, jobsets=[jobset(1)], pods=pods))
    assert condition(status_of(plan, raw), "CheckpointStale")["status"] == "True"
    # a newer verified step arrives through the periodic store reading
    newer = rc.plan(
        snapshot(with_status(raw, plan), jobsets=[jobset(1)], pods=pods, store=reading(9))
    )
    status = status_of(newer, with_status(raw, plan))
    assert status["lastVerifiedCheckpoint"]["step"] == 9
    assert condition(status, "CheckpointStale")["status"] == "False"


# --- small pure pieces ------------------------------------------------------------------------


def test_merge_patch_nulls_what_disappeared() -> None:
    old = {"a": 1, "b": {"c": 2, "d": 3}, "e": [1]}
    new = {"a": 1, "b": {"c": 2}, "e": [1, 2], "f": "x"}
    patch = rc.merge_patch(old, new)
    assert patch == {"b": {"d": None}, "e": [1, 2], "f": "x"}
    assert apply_patch(old, patch) == new


def test_jobs_sharing_a_quarantined_node_keep_their_claims_apart() -> None:
    """Issue 13: one taint per key and effect, several jobs' claims beside it; each job
    releases only its own, and the taint goes with the last claim."""
    ours = {"key": keys.DEFAULT_TAINT_KEY, "value": "llm", "effect": "NoSchedule"}
    a, b = rc.Claimant("team-a/llm", "uid-a"), rc.Claimant("team-b/big", "uid-b")
    first = rc.claim([], None, ours, a)
    assert first is not None and first.taints == [ours]
    assert rc.claim(first.taints, first.annotation, ours, a) is None, "idempotent"
    theirs = {**ours, "value": "big"}
    second = rc.claim(first.taints, first.annotation, theirs, b)
    assert second is not None and second.taints == [ours], "one taint, two claims"
    lifted_a = rc.release(second.taints, second.annotation, ours, a)
    assert lifted_a is not None and lifted_a.taints == [ours], "b still holds it"
    assert rc.release(lifted_a.taints, lifted_a.annotation, ours, a) is None, "idempotent"
    lifted_b = rc.release(lifted_a.taints, lifted_a.annotation, theirs, b)
    assert lifted_b is not None and lifted_b.taints == [] and lifted_b.annotation is None
    # a taint an administrator placed with our key is claimed but never removed by us
    admin = {**ours, "value": "by-hand"}
    held = rc.claim([admin], None, ours, a)
    assert held is not None and held.taints == [admin]
    released = rc.release(held.taints, held.annotation, ours, a)
    assert released is not None and released.taints == [admin]
    # a claim whose taint an administrator removed is not placed again
    assert rc.claim([], first.annotation, ours, a) is None
    # a legacy taint (no claims recorded) naming this job is removed, another job's is not
    other = {"key": "x", "effect": "NoExecute"}
    legacy = rc.release([ours, other], None, ours, a)
    assert legacy is not None and legacy.taints == [other]
    assert rc.release([theirs], None, ours, a) is None
    # an annotation that cannot be read: whose taint it is cannot be told, nothing changes
    assert rc.release([ours], "{not json", ours, a) is None
    assert rc.claim([ours], "{not json", ours, a) is None


def test_a_deleted_job_releases_its_claims_then_its_finalizer_and_starts_nothing() -> None:
    taint = {"key": keys.DEFAULT_TAINT_KEY, "value": "llm", "effect": "NoSchedule"}
    record = {"node": "gpu-node-002", "failureClass": "GPUFault", "attempt": 1,
              "since": iso(NOW), "taintKey": "old.example/key", "taintValue": "llm",
              "taintEffect": "NoSchedule"}  # fmt: skip
    raw = rtj_raw({"phase": "Restarting", "attempt": 1, "quarantinedNodes": [record]})
    raw["metadata"]["deletionTimestamp"] = iso(NOW)
    raw["metadata"]["finalizers"] = [keys.RELEASE_FINALIZER]
    plan = rc.plan(snapshot(raw, store=reading(100)))
    assert kinds(plan) == ["UntaintNode", "SetFinalizer"]
    untaint = of(plan, rc.UntaintNode)[0]
    # the taint recorded, not the job's current settings (a taintKey edited since)
    assert dict(untaint.taint) == {**taint, "key": "old.example/key"}
    assert (untaint.uid, of(plan, rc.SetFinalizer)[0].present) == (JOB_UID, False)
    # without the finalizer (already released) nothing is left to do
    raw["metadata"]["finalizers"] = []
    assert not rc.plan(snapshot(raw, store=reading(100))).actions


def _admitted(at: Any) -> dict[str, Any]:
    status = {**running(), "phase": "Admitted"}
    status["conditions"] = [{"type": "Admitted", "status": "True", "reason": "AttemptAdmitted",
                             "message": "", "lastTransitionTime": iso(at)}]  # fmt: skip
    return status


def _pending(index: int, why: str | None) -> dict[str, Any]:
    p = pod(1, index)
    p["status"] = {"phase": "Pending", "conditions": []}
    if why is not None:  # as kube-scheduler writes it (handleSchedulingFailure, v1.35.4)
        p["status"]["conditions"] = [{"type": "PodScheduled", "status": "False",
                                      "reason": "Unschedulable", "message": why}]  # fmt: skip
    return p


def test_an_admitted_attempt_whose_pods_stay_unschedulable_is_reported_stalled() -> None:
    """Issue 13: Kueue admitted the quota but quarantines shrank the real capacity."""
    # FitError.Error() in pkg/scheduler/framework/types.go and the TaintToleration plugin's
    # "node(s) had untolerated taint(s)" (k8s.io/kubernetes v1.35.4), with the preemption
    # PostFilter message appended
    why = (
        "0/4 nodes are available: 1 node(s) had untolerated taint(s), 3 Insufficient "
        "nvidia.com/gpu. preemption: 0/4 nodes are available: 4 Preemption is not helpful "
        "for scheduling."
    )
    raw = rtj_raw(_admitted(NOW - timedelta(seconds=50)))
    pods = [pod(1, 0), pod(1, 1), _pending(2, why), _pending(3, why)]
    early = rc.plan(snapshot(rtj_raw(_admitted(NOW - timedelta(seconds=10))), jobsets=[jobset(1)],
                             pods=pods))  # fmt: skip
    assert early.status_patch is None and early.requeue_after == 35.0
    plan = rc.plan(snapshot(raw, jobsets=[jobset(1)], pods=pods))
    stalled = condition(status_of(plan, raw), "Stalled")
    assert stalled is not None and stalled["status"] == "True"
    assert stalled["reason"] == "PodsUnschedulable" and "untolerated taint(s)" in stalled["message"]
    assert [e.reason for e in of(plan, rc.PostEvent)] == ["PodsUnschedulable"]
    again = rc.plan(snapshot(with_status(raw, plan), jobsets=[jobset(1)], pods=pods))
    assert not of(again, rc.PostEvent), "one Event per stall, not one per look"
    # the group runs at last: no longer stalled
    ran = rc.plan(snapshot(with_status(raw, plan), jobsets=[jobset(1)],
                           pods=[pod(1, i) for i in range(4)]))  # fmt: skip
    assert condition(status_of(ran, raw), "Stalled")["status"] == "False"


def test_an_admitted_attempt_whose_pods_are_never_created_is_reported_stalled() -> None:
    raw = rtj_raw(_admitted(NOW - timedelta(seconds=50)))
    plan = rc.plan(snapshot(raw, jobsets=[jobset(1)], pods=[pod(1, 0), pod(1, 1)]))
    stalled = condition(status_of(plan, raw), "Stalled")
    assert stalled is not None and stalled["reason"] == "PodsNotCreated"
    assert "2 of 4 worker pods exist" in stalled["message"]


def test_trimmed_bodies_keep_what_the_planner_reads() -> None:
    body = pod(1, 0, exit_code=1, message="boom")
    body["metadata"]["managedFields"] = [{"big": "x" * 1000}]
    body["spec"]["containers"] = [{"name": "trainer"}]
    trimmed = rc.trim_pod(body)
    assert "managedFields" not in trimmed["metadata"] and "containers" not in trimmed["spec"]
    assert trimmed["status"] == body["status"]
    assert apply_patch({}, {}) == {}


def test_lost_steps_count_verified_steps_passed_over_on_resume() -> None:
    known = {"step": 1200, "uri": "s3://x", "committedAt": iso(NOW), "verifiedAt": iso(NOW)}
    raw = rtj_raw({**running(), "phase": "Restarting", "badSteps": [1200],
                   "lastVerifiedCheckpoint": known})  # fmt: skip
    plan = rc.plan(snapshot(raw, store=reading(1000, excluded=(1200,))))
    status = status_of(plan, raw)
    assert status["attempts"][-1]["resumedFromStep"] == 1000
    assert status["attempts"][-1]["lostSteps"] == 200
    assert [m.value for m in plan.metrics if m.kind == "lost_steps"] == [200.0]


def test_a_step_marked_bad_is_no_longer_the_last_verified_checkpoint() -> None:
    known = {"step": 1200, "uri": "s3://x", "committedAt": iso(NOW), "verifiedAt": iso(NOW)}
    raw = rtj_raw({**running(), "phase": "Restarting", "badSteps": [1200],
                   "lastVerifiedCheckpoint": known})  # fmt: skip
    status = status_of(rc.plan(snapshot(raw, store=reading(1000, excluded=(1200,)))), raw)
    assert status["lastVerifiedCheckpoint"]["step"] == 1000, "kubectl and the age alert"
    # while an older step than a good newest one never replaces it
    good = rtj_raw({**running(), "phase": "Restarting", "lastVerifiedCheckpoint": known})
    status = status_of(rc.plan(snapshot(good, store=reading(1000))), good)
    assert status["lastVerifiedCheckpoint"]["step"] == 1200


def test_a_reading_that_did_not_exclude_every_bad_step_is_never_used_to_pin() -> None:
    """Issue 20: a reading taken before `badSteps` grew (a background refresh racing the
    failure's status patch) may select the step just marked bad; it is read again instead."""
    ended = NOW - timedelta(seconds=2)
    record = {"attempt": 1, "jobSet": "llm-a1", "endedAt": iso(ended),
              "failureClass": "CheckpointCorrupt"}  # fmt: skip
    raw = rtj_raw({"phase": "Restarting", "attempt": 1, "attempts": [record], "badSteps": [200]})
    # started after the failure was recorded, but before its patch reached the cache
    raced = reading(200, at=ended + timedelta(seconds=1), excluded=())
    plan = rc.plan(snapshot(raw, store=raced))
    assert plan.needs_store and not of(plan, rc.CreateJobSet)
    # even a reading that claims to have excluded it is refused if it still picked it
    liar = reading(200, at=ended + timedelta(seconds=1), excluded=(200,))
    assert rc.plan(snapshot(raw, store=liar)).needs_store
    # the reading taken with the bad step excluded pins the previous verified step
    fresh = reading(100, at=ended + timedelta(seconds=1), excluded=(200,))
    created = of(rc.plan(snapshot(raw, store=fresh)), rc.CreateJobSet)
    assert [c.body["metadata"]["annotations"][keys.RESUME_STEP_ANNOTATION] for c in created] == [
        "100"
    ]


def test_a_running_job_never_takes_a_bad_step_as_its_last_verified_checkpoint() -> None:
    raw = rtj_raw({**running(), "badSteps": [200]})
    snap = snapshot(raw, jobsets=[jobset(1)], store=reading(200))
    patch = rc.plan(snap).status_patch
    verified = (patch.status.get("lastVerifiedCheckpoint") or {}) if patch else {}
    assert verified.get("step") != 200
    # the same reading is taken when the step is not bad (the assertion above can fail)
    good = rc.plan(snapshot(rtj_raw(running()), jobsets=[jobset(1)], store=reading(200)))
    assert good.status_patch is not None
    assert good.status_patch.status["lastVerifiedCheckpoint"]["step"] == 200


def test_the_store_is_read_again_after_a_failure_so_a_just_published_step_counts() -> None:
    ended = NOW - timedelta(seconds=2)
    record = {
        "attempt": 1,
        "jobSet": "llm-a1",
        "endedAt": iso(ended),
        "failureClass": "NetworkFault",
    }
    raw = rtj_raw({"phase": "Restarting", "attempt": 1, "attempts": [record]})
    before = reading(100, at=ended - timedelta(seconds=1))
    assert rc.plan(snapshot(raw, store=before)).needs_store
    assert not rc.plan(snapshot(raw, store=reading(300, at=NOW))).needs_store


def test_events_are_read_only_once_a_failure_is_seen() -> None:
    raw = rtj_raw(running())
    healthy = [pod(1, i) for i in range(4)]
    snap = snapshot(raw, jobsets=[jobset(1)], pods=healthy)
    assert not rc.plan(replace(snap, events=None)).needs_events
    failed = [pod(1, 0, exit_code=137, reason="Error"), *healthy[1:]]
    snap = snapshot(raw, jobsets=[jobset(1)], pods=failed)
    assert rc.plan(replace(snap, events=None)).needs_events
    evicted = {
        "involvedObject": {"kind": "Pod", "name": failed[0]["metadata"]["name"]},
        "reason": "Evicted",
        "message": "low on memory",
        "lastTimestamp": iso(NOW),
    }
    plan = rc.plan(replace(snap, events=(evicted,)))
    assert status_of(plan, raw)["attempts"][0]["failureClass"] == "Evicted"


def test_status_lists_stay_bounded_in_a_cluster_wide_incident() -> None:
    """Issue 13: quarantine records and bad steps are capped so the job stays writable."""
    from rtj_operator.reconcile.failure import MAX_BAD_STEPS, MAX_QUARANTINED_NODES

    records = [
        {"node": f"old-{i}", "failureClass": "GPUFault", "attempt": 1, "since": iso(NOW)}
        for i in range(MAX_QUARANTINED_NODES)
    ]
    raw = rtj_raw({**running(), "quarantinedNodes": records})
    pods = [pod(1, 0, exit_code=1, message="RuntimeError: CUDA error"), pod(1, 1)]
    nodes = {"gpu-node-000": node("gpu-node-000", xid=79), "gpu-node-001": node("gpu-node-001")}
    plan = rc.plan(snapshot(raw, jobsets=[jobset(1)], pods=pods, nodes=nodes))
    assert not any(a.node == "gpu-node-000" for a in of(plan, rc.TaintNode))
    assert any("not tainting gpu-node-000" in e.message for e in of(plan, rc.PostEvent))
    status = status_of(plan, raw)
    assert len(status["quarantinedNodes"]) == MAX_QUARANTINED_NODES
    assert status["phase"] == "Restarting", "the job still restarts, away from nothing new"
    # bad steps: the newest are kept
    many = list(range(100, 100 + 100 * (MAX_BAD_STEPS + 5), 100))
    record = {**running()["attempts"][0], "resumedFromStep": 99_999}
    bad = rtj_raw({**running(), "attempts": [record], "badSteps": many})
    corrupt = {"exitCode": 1, "reason": "Error", "message": "", "finishedAt": iso(NOW)}
    # ended past the settle window of an unexplained failure (reconcile.detect)
    failing = pod(1, 0, exit_code=1, message="boom", init=corrupt, finished=NOW - SETTLED)
    after = status_of(rc.plan(snapshot(bad, jobsets=[jobset(1)], pods=[failing])), bad)
    assert len(after["badSteps"]) <= MAX_BAD_STEPS
    assert max(after["badSteps"]) >= max(many)


def test_a_jobset_the_api_server_refuses_is_a_condition_not_a_retry_loop() -> None:
    """Issue 13: a 422 on create (CEL, schema, a webhook's denial) is reported once, and the
    job waits for its spec to change instead of re-sending the refused object."""
    raw = rtj_raw()
    message = (
        'JobSet.jobset.x-k8s.io "llm-a1" is invalid: spec.replicatedJobs[0].template.spec'
        ".template.spec.containers[0].image: Required value"
    )  # the API server's StatusReasonInvalid message shape (apimachinery errors.NewInvalid)
    refused = rc.Rejection("llm-a1", 1, message)
    plan = rc.plan(replace(snapshot(raw, store=reading(100)), rejection=refused))
    assert not of(plan, rc.CreateJobSet)
    status = status_of(plan, raw)
    admitted = condition(status, "Admitted")
    assert admitted is not None and admitted["reason"] == "JobSetRejected"
    assert "Required value" in admitted["message"]
    assert [e.reason for e in of(plan, rc.PostEvent)] == ["JobSetRejected"]
    again = rc.plan(
        replace(snapshot(with_status(raw, plan), store=reading(100)), rejection=refused)
    )
    assert not of(again, rc.PostEvent) and not of(again, rc.CreateJobSet)
    # the user fixed the template: a new generation is tried again
    fixed = with_status(raw, plan)
    fixed["metadata"]["generation"] = 2
    assert of(
        rc.plan(replace(snapshot(fixed, store=reading(100)), rejection=refused)), rc.CreateJobSet
    )


def test_pods_stuck_terminating_on_a_live_node_are_reported_once_while_the_restart_waits() -> None:
    raw = rtj_raw({**running(), "phase": "Restarting"})
    stuck = pod(1, 1, deleting=True, finished=NOW - timedelta(minutes=5))  # due 4.5 min ago
    plan = rc.plan(snapshot(raw, pods=[stuck], store=reading(100)))
    assert not of(plan, rc.CreateJobSet)
    restarting = condition(status_of(plan, raw), "Restarting")
    assert restarting is not None and restarting["reason"] == "PodsStuckTerminating"
    assert stuck["metadata"]["name"] in restarting["message"]
    assert [e.reason for e in of(plan, rc.PostEvent)] == ["PodsStuckTerminating"]
    again = rc.plan(snapshot(with_status(raw, plan), pods=[stuck], store=reading(100)))
    assert not of(again, rc.PostEvent), "reported once"
    # a pod within its grace period is just being deleted
    fresh = pod(1, 1, deleting=True)
    calm = rc.plan(snapshot(raw, pods=[fresh], store=reading(100)))
    assert condition(status_of(calm, raw), "Restarting")["reason"] == "WaitingForOldWorld"


def test_a_file_root_checkpoint_age_is_unknown_not_stale() -> None:
    """Issue 13: the operator cannot read a file:// root, so it never claims a stale
    checkpoint it cannot see (it used to, two intervals into every run)."""
    since = NOW - timedelta(hours=3)
    conditions = [{"type": "Running", "status": "True", "reason": "AttemptRunning",
                   "lastTransitionTime": iso(since)}]  # fmt: skip
    resumed = {"step": 5, "uri": "file:///mnt/ckpt/llm", "committedAt": iso(since),
               "verifiedAt": iso(since)}  # fmt: skip
    raw = rtj_raw({**running(), "conditions": conditions, "lastVerifiedCheckpoint": resumed},
                  checkpoint={"uri": "file:///mnt/ckpt/llm"})  # fmt: skip
    plan = rc.plan(snapshot(raw, jobsets=[jobset(1)], pods=[pod(1, i) for i in range(4)]))
    stale = condition(status_of(plan, raw), "CheckpointStale")
    assert stale is not None and (stale["status"], stale["reason"]) == (
        "Unknown", "CheckpointAgeUnknown")  # fmt: skip


def test_with_a_control_key_the_attempt_is_preceded_by_the_jobs_key_secret() -> None:
    """Issue 42, finding 8: the job's key goes into a Secret the job owns (named by its uid),
    created before the JobSet whose pods refer to it; the JobSet holds no key."""
    key = "f" * 64
    plan = rc.plan(replace(snapshot(rtj_raw(), store=reading(1200)), control_key=key))
    assert kinds(plan)[:2] == ["CreateKeySecret", "CreateJobSet"]
    secret = of(plan, rc.CreateKeySecret)[0].body
    uid = secret["metadata"]["ownerReferences"][0]["uid"]
    assert secret["metadata"]["name"] == f"rtj-control-{uid}"
    assert secret["stringData"] == {"key": key} and secret["immutable"] is True
    owner = secret["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == (keys.KIND, "llm", True)
    assert key not in json.dumps(of(plan, rc.CreateJobSet)[0].body)
    plain = rc.plan(snapshot(rtj_raw(), store=reading(1200)))
    assert "CreateKeySecret" not in kinds(plain), "no control secret: nothing to keep"
