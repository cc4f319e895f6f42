"""The controller's runtime pieces without a cluster: metrics, work queue, leases, wiring."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta
from typing import Any

import kopf
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from rtj_test_support import NOW, make_job
from rtj_world import iso, jobset, node, pod, rtj_raw

from rtj_operator import controller as ctl
from rtj_operator import event_reads, handlers, work_queue
from rtj_operator.api import FailureClass, ResilientTrainingJob, keys
from rtj_operator.cache import WatchCache, newer_or_same
from rtj_operator.kube_errors import Conflict, Unavailable
from rtj_operator.leader import LeaseRecord, Move, lease_decision
from rtj_operator.metrics import Metrics, UnknownLabels, sample
from rtj_operator.selection import Selection
from rtj_operator.settings import Settings

# --- metrics -----------------------------------------------------------------------------------


def _series(reg: CollectorRegistry, name: str) -> list[dict[str, str]]:
    """The label sets of every sample named `name`."""
    return [s.labels for f in reg.collect() for s in f.samples if s.name == name]


def test_metrics_have_the_documented_names_and_labels() -> None:
    reg = CollectorRegistry()
    m = Metrics(reg)
    job = ResilientTrainingJob.from_object(
        rtj_raw({"phase": "Running", "attempt": 1, "lastVerifiedCheckpoint": {
            "step": 1200, "uri": "s3://x", "committedAt": "2025-03-14T11:00:00Z",
            "verifiedAt": "2025-03-14T12:00:00Z"}})
    )  # fmt: skip
    m.observe_job(job)
    m.record_failure("team-a", "llm", FailureClass.GPU_FAULT)
    m.record_restart("team-a", "llm", FailureClass.GPU_FAULT)
    m.record_restart("team-a", "llm", FailureClass.GPU_FAULT, in_place=True)
    m.record_restart("team-a", "llm", FailureClass.GPU_FAULT, in_place=True)
    m.record_detection(FailureClass.GPU_FAULT, 0.4)
    m.record_recovery(FailureClass.GPU_FAULT, 12.0)
    m.record_lost_steps("team-a", "llm", 500)
    per_job = {"namespace": "team-a", "name": "llm"}
    assert sample(reg, "rtj_checkpoint_last_verified_step", per_job) == 1200
    assert (
        sample(reg, "rtj_checkpoint_last_success_timestamp_seconds", per_job)
        == (NOW - timedelta(hours=1)).timestamp()
    )
    assert sample(reg, "rtj_checkpoint_planned_interval_seconds", per_job) == 600
    assert sample(reg, "rtj_quarantined_nodes", per_job) == 0
    assert sample(reg, "rtj_jobs", {"phase": "Running"}) == 1
    assert sample(reg, "rtj_jobs", {"phase": "Failed"}) == 0
    gpu = {**per_job, "class": "GPUFault"}
    assert sample(reg, "rtj_restarts_total", {**gpu, "scope": "world"}) == 1
    assert sample(reg, "rtj_restarts_total", {**gpu, "scope": "in_place"}) == 2
    with pytest.raises(UnknownLabels, match="scope"):  # the old label set: not a silent 0
        sample(reg, "rtj_restarts_total", gpu)
    assert sample(reg, "rtj_failures_total", gpu) == 1
    assert sample(reg, "rtj_lost_steps_total", per_job) == 500
    assert sample(reg, "rtj_detection_seconds_count", {"class": "GPUFault"}) == 1
    assert sample(reg, "rtj_recovery_seconds_sum", {"class": "GPUFault"}) == 12.0
    text = generate_latest(reg).decode()
    for name in ("rtj_detection_seconds_bucket", "rtj_recovery_seconds_bucket", "rtj_jobs{"):
        assert name in text
    assert "rtj_checkpoint_fast_last_step{" not in text, "no fast tier: no sample"
    m.forget_job("team-a", "llm")
    assert not _series(reg, "rtj_restarts_total"), "both scopes' series go with the job"
    assert not _series(reg, "rtj_failures_total")


def test_the_fast_tier_has_its_own_step_and_age_beside_the_durable_ones() -> None:
    reg = CollectorRegistry()
    m = Metrics(reg)
    job = ResilientTrainingJob.from_object(
        rtj_raw({"phase": "Running", "attempt": 1, "progress": {
            "attempt": 1, "step": 1312, "observedAt": "2025-03-14T12:00:00Z",
            "fastStep": 1310, "fastCommittedAt": "2025-03-14T11:59:58Z"}})
    )  # fmt: skip
    m.observe_job(job)
    per_job = {"namespace": "team-a", "name": "llm"}
    assert sample(reg, "rtj_checkpoint_fast_last_step", per_job) == 1310
    assert (
        sample(reg, "rtj_checkpoint_fast_last_success_timestamp_seconds", per_job)
        == (NOW - timedelta(seconds=2)).timestamp()
    )
    text = generate_latest(reg).decode()
    assert "rtj_checkpoint_last_success_timestamp_seconds{" not in text, "the durable age is "
    "the store's alone: no verified durable step, no durable timestamp"

    # a Running job that has no verified checkpoint still exports when it started running
    fresh = ResilientTrainingJob.from_object(rtj_raw({"phase": "Running", "attempt": 1,
        "conditions": [{"type": "Running", "status": "True", "reason": "AttemptRunning",
                        "lastTransitionTime": "2025-03-14T11:30:00Z"}]}))  # fmt: skip
    m.observe_job(fresh)
    assert (
        sample(reg, "rtj_job_running_since_timestamp_seconds", per_job)
        == (NOW - timedelta(minutes=30)).timestamp()
    )
    assert reg.get_sample_value("rtj_checkpoint_last_success_timestamp_seconds", per_job) is None

    # a Failed job says which category ended it (the alert warns for "user", pages else)
    failed = ResilientTrainingJob.from_object(rtj_raw({"phase": "Failed", "attempt": 1,
        "attempts": [{"attempt": 1, "jobSet": "llm-a1", "failureClass": "UserError",
                      "failureCategory": "user"}]}))  # fmt: skip
    m.observe_job(failed)
    assert sample(reg, "rtj_job_failed", {**per_job, "category": "user"}) == 1
    assert reg.get_sample_value("rtj_job_running_since_timestamp_seconds", per_job) is None

    # a file:// root: the operator cannot see new steps, so it exports no age to misread
    on_volume = ResilientTrainingJob.from_object(rtj_raw({"phase": "Running", "attempt": 1,
        "conditions": [{"type": "Running", "status": "True", "reason": "AttemptRunning",
                        "lastTransitionTime": "2025-03-14T11:30:00Z"}]},
        checkpoint={"uri": "file:///mnt/ckpt/llm"}))  # fmt: skip
    m.observe_job(on_volume)
    assert reg.get_sample_value("rtj_job_running_since_timestamp_seconds", per_job) is None

    m.forget_job("team-a", "llm")
    assert reg.get_sample_value("rtj_job_failed", {**per_job, "category": "user"}) is None
    assert sample(reg, "rtj_checkpoint_last_verified_step", per_job) == 0
    assert not _series(reg, "rtj_restarts_total")
    assert sample(reg, "rtj_jobs", {"phase": "Running"}) == 0


# --- work queue --------------------------------------------------------------------------------


def test_work_queue_coalesces_and_never_hands_out_a_key_twice_at_once() -> None:
    async def scenario() -> None:
        q = work_queue.WorkQueue()
        q.add(("a", "x"))
        q.add(("a", "x"))
        q.add(("a", "y"))
        assert len(q) == 2
        key = await q.get()
        assert key == ("a", "x")
        q.add(("a", "x"))  # while processing: re-queued only after done()
        assert await q.get() == ("a", "y")
        q.done(("a", "y"))
        q.done(key)
        assert await asyncio.wait_for(q.get(), 1) == ("a", "x")

    asyncio.run(scenario())


def test_work_queue_delays_keep_the_earliest_deadline() -> None:
    async def scenario() -> None:
        q = work_queue.WorkQueue()
        q.add_after(("a", "x"), 5.0)
        q.add_after(("a", "x"), 0.05)
        assert await asyncio.wait_for(q.get(), 1) == ("a", "x")
        assert q.add_rate_limited(("a", "y")) == 0.1
        assert q.add_rate_limited(("a", "y")) == 0.2
        q.forget_failures(("a", "y"))
        assert q.add_rate_limited(("a", "y")) == 0.1

    asyncio.run(scenario())


def test_a_change_is_planned_before_every_routine_look() -> None:
    """1,000 jobs' progress rounds queued ahead of a failed pod's plan held decisions 6-11 s
    (`bench.operator_scale_jobs`): a change goes first, a routine look moves ahead when its
    key changes, and no key is handed out twice."""

    async def scenario() -> None:
        q = work_queue.WorkQueue()
        for job in ("r1", "r2", "r3"):
            q.add_routine(("a", job))
        q.add(("a", "failed"))
        q.add(("a", "r3"))  # queued for a look, then its pod failed: ahead now
        q.add_routine(("a", "failed"))  # a change queued already: a routine add changes nothing
        assert len(q) == 4
        taken = [await asyncio.wait_for(q.get(), 1) for _ in range(4)]
        assert taken == [("a", "failed"), ("a", "r3"), ("a", "r1"), ("a", "r2")]
        q.add_routine(("a", "r1"))  # while processing: after done(), in its own lane
        q.add(("a", "z"))
        for key in taken:
            q.done(key)
        assert await asyncio.wait_for(q.get(), 1) == ("a", "z")
        assert await asyncio.wait_for(q.get(), 1) == ("a", "r1")
        assert len(q) == 0
        with pytest.raises(asyncio.TimeoutError):  # nothing left, no stale entry handed out
            await asyncio.wait_for(q.get(), 0.1)

    asyncio.run(scenario())


def test_a_worker_waiting_on_an_empty_queue_takes_the_next_key_of_either_lane() -> None:
    async def scenario() -> None:
        q = work_queue.WorkQueue()
        waiting = asyncio.ensure_future(q.get())
        await asyncio.sleep(0.01)
        q.add_routine(("a", "r"))
        assert await asyncio.wait_for(waiting, 1) == ("a", "r")
        waiting = asyncio.ensure_future(q.get())
        await asyncio.sleep(0.01)
        q.done(("a", "r"))
        q.add(("a", "r"))
        assert await asyncio.wait_for(waiting, 1) == ("a", "r")

    asyncio.run(scenario())


# --- leases ------------------------------------------------------------------------------------


def test_lease_decision_trusts_only_the_local_clock() -> None:
    other = LeaseRecord("b", 15, 0, "2020-01-01T00:00:00.000000Z", "7")
    assert lease_decision(None, 0, 0, "a", 15) is Move.CREATE
    assert lease_decision(LeaseRecord("a", 15, 0, "", "7"), 0, 100, "a", 15) is Move.RENEW
    assert lease_decision(LeaseRecord("", 1, 0, "", "7"), 0, 0, "a", 15) is Move.TAKE
    # an old renewTime means nothing: only how long *we* saw the record unchanged
    assert lease_decision(other, observed_at=100, now=110, me="a", duration=15) is Move.FOLLOW
    assert lease_decision(other, observed_at=100, now=116, me="a", duration=15) is Move.TAKE


# --- helpers that route watch events -----------------------------------------------------------


def test_routing_keys() -> None:
    assert event_reads.workload_jobset("jobset-llm-a3-1f2e3") == "llm-a3"
    assert event_reads.workload_jobset("job-x-1f2e3") is None
    event = {
        "involvedObject": {"kind": "Workload", "name": "jobset-llm-a3-1f2e3", "namespace": "ns"}
    }
    assert event_reads.event_key(event) == ("ns", "Workload", "llm-a3")
    assert event_reads.event_key({"involvedObject": {"kind": "Node", "name": "n1"}}) == (
        "",
        "Node",
        "n1",
    )
    pod_ref = {"kind": "Pod", "name": "llm-a1-worker-0-0-abcde", "namespace": "team-a"}
    assert event_reads.relevant_event({"involvedObject": pod_ref, "reason": "Evicted"})
    assert not event_reads.relevant_event({"involvedObject": pod_ref, "reason": "Pulled"})
    # what the classifier reads, the reader keeps: Kueue v0.17's PodsReady eviction
    # (pkg/workload/workload.go "Evicted" + "DueTo" + reason; workload_controller.go
    # "Exceeded the PodsReady timeout %s")
    workload = {"kind": "Workload", "name": "jobset-llm-a1-3f2a1", "namespace": "team-a"}
    timeout = "Exceeded the PodsReady timeout team-a/jobset-llm-a1-3f2a1"
    evicted = {"involvedObject": workload, "reason": "EvictedDueToPodsReadyTimeout"}
    assert event_reads.relevant_event({**evicted, "message": timeout})
    assert newer_or_same(
        {"metadata": {"resourceVersion": "10"}}, {"metadata": {"resourceVersion": "9"}}
    )
    assert not newer_or_same(
        {"metadata": {"resourceVersion": "9"}}, {"metadata": {"resourceVersion": "10"}}
    )


# --- the controller against a fake API -----------------------------------------------------------


class FakeKube:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.conflict = False

    def create_jobset(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("create_jobset", body["metadata"]["name"]))
        return body

    def delete_jobset(self, namespace: str, name: str) -> bool:
        self.calls.append(("delete_jobset", name))
        return True

    def delete_pod(self, namespace: str, name: str, grace_seconds: int | None = None) -> bool:
        self.calls.append(("delete_pod", name))
        return True

    def edit_taints(self, node: str, edit: Any) -> bool:
        self.calls.append(("taint", node, edit([])))
        return True

    def patch_rtj_status(
        self, namespace: str, name: str, patch: dict[str, Any], rv: str
    ) -> dict[str, Any]:
        self.calls.append(("patch_status", rv))
        if self.conflict:
            raise Conflict("stale", 409)
        body = rtj_raw(rv=int(rv) + 1)
        body["status"] = patch
        return body

    def post_event(
        self, involved: dict[str, Any], type_: str, reason: str, message: str, **_: Any
    ) -> None:
        self.calls.append(("event", reason))

    def list_events(self, namespace: str | None, selector: str) -> list[dict[str, Any]]:
        self.calls.append(("list_events", selector))
        if selector.startswith("involvedObject.kind=Pod") and selector.endswith(
            ("=Pod", "=llm-a1-worker-0-0-abcde")
        ):
            return [{"involvedObject": {"kind": "Pod", "name": "llm-a1-worker-0-0-abcde",
                                        "namespace": "team-a"}, "reason": "Evicted",
                     "message": "The node was low on resource: memory."}]  # fmt: skip
        return []

    def secret_data(self, namespace: str, name: str) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": "x"}


SHARED_BUCKET = ("s3://ckpt/",)
"""The jobs here name no credentialsSecret: the platform lets the operator read this bucket."""


def _controller(kube: FakeKube, registry: CollectorRegistry) -> ctl.Controller:
    def reader(uri: str, bad: Any, credentials: Any) -> Selection:
        return Selection(1200, f"{uri}/steps/step-000000001200", NOW)

    settings = Settings(workers=1, operator_identity_stores=SHARED_BUCKET)
    c = ctl.Controller(kube, Metrics(registry), settings, clock=lambda: NOW,  # type: ignore[arg-type]
                       store_reader=reader)  # fmt: skip
    return c


def test_controller_starts_an_attempt_and_remembers_its_own_status_write() -> None:
    async def scenario() -> None:
        kube, reg = FakeKube(), CollectorRegistry()
        c = _controller(kube, reg)
        c.on_rtj(None, rtj_raw())
        again = await c.reconcile(("team-a", "llm"))
        assert again is None
        await asyncio.gather(*c._posting)  # Events go out in the background
        assert [x[0] for x in kube.calls] == ["create_jobset", "patch_status", "event"]
        assert c.rtjs[("team-a", "llm")]["metadata"]["resourceVersion"] == "11"
        assert c.store_readings[("team-a", "llm")].selection.step == 1200  # type: ignore[union-attr]
        c.on_rtj(None, rtj_raw(rv=10))  # an older event arriving late changes nothing
        assert c.rtjs[("team-a", "llm")]["metadata"]["resourceVersion"] == "11"
        assert sample(reg, "rtj_reconciles_total", {"result": "ok"}) == 1
        c.executor.shutdown()

    asyncio.run(scenario())


def test_a_job_managed_by_another_controller_is_left_alone() -> None:
    """spec.managedBy (issue 44): MultiKueue's job is dispatched to a worker cluster; here
    nothing is created, patched, posted, polled, read or exported for it."""

    async def scenario() -> None:
        kube, reg = FakeKube(), CollectorRegistry()
        c = _controller(kube, reg)
        key = ("team-a", "llm")
        running = {"phase": "Running", "attempt": 1, "attempts": [{"attempt": 1,
                   "jobSet": "llm-a1"}]}  # fmt: skip
        c.on_rtj(None, rtj_raw(running, managedBy="kueue.x-k8s.io/multikueue"))
        assert await c.reconcile(key) is None
        assert c.snapshot(key) is None and c.progress_targets() == []
        assert kube.calls == [] and key not in c.store_readings
        assert sample(reg, "rtj_jobs", {"phase": "Running"}) == 0
        # its own name, or none: this operator's job
        c.on_rtj(None, rtj_raw(rv=11, managedBy=keys.CONTROLLER_NAME))
        await c.reconcile(key)
        await asyncio.gather(*c._posting)
        assert [x[0] for x in kube.calls] == ["create_jobset", "patch_status", "event"]
        c.executor.shutdown()

    asyncio.run(scenario())


def _running_attempt_1(c: Any) -> None:
    """The controller's caches hold job `llm` running attempt 1 (JobSet llm-a1)."""
    status = {"phase": "Running", "attempt": 1, "attempts": [{"attempt": 1, "jobSet": "llm-a1"}]}
    c.on_rtj(None, rtj_raw(status))
    c.on_jobset(None, jobset(1))


def test_controller_retries_quickly_on_a_stale_decision() -> None:
    async def scenario() -> None:
        kube, reg = FakeKube(), CollectorRegistry()
        kube.conflict = True
        c = _controller(kube, reg)
        _running_attempt_1(c)
        c.on_pod(None, pod(1, 0, exit_code=1, message="NCCL timeout"))
        assert await c.reconcile(("team-a", "llm")) == ctl.CONFLICT_RETRY_SECONDS
        # conflicts in a row back off (the watch brings the newer job sooner), up to a cap
        delays = [await c.reconcile(("team-a", "llm")) for _ in range(8)]
        assert delays[:3] == [0.4, 0.8, 1.6] and delays[-1] == ctl.CONFLICT_RETRY_MAX_SECONDS
        kube.calls.clear()
        await c.reconcile(("team-a", "llm"))
        calls = [x[0] for x in kube.calls]
        # the JobSet's, the pod's and its node's Events (no Workload's: Kueue stopped nothing)
        assert calls == ["list_events"] * 3 + ["patch_status"], "nothing deleted after a refusal"
        assert not _series(reg, "rtj_restarts_total"), "no restart of any class or scope"
        c.executor.shutdown()

    asyncio.run(scenario())


def test_a_failure_is_recorded_then_the_whole_old_world_deleted_in_one_pass() -> None:
    async def scenario() -> None:
        kube, reg = FakeKube(), CollectorRegistry()
        c = _controller(kube, reg)
        _running_attempt_1(c)
        c.on_pod(None, pod(1, 0, exit_code=1, message="NCCL error: unhandled system error"))
        for i in (1, 2, 3):
            c.on_pod(None, pod(1, i))
        await c.reconcile(("team-a", "llm"))
        await asyncio.gather(*c._posting)
        calls = [x[0] for x in kube.calls if x[0] != "list_events"]
        assert calls[0] == "patch_status", "the failure is recorded before anything is deleted"
        assert sorted(calls[1:6]) == ["delete_jobset"] + ["delete_pod"] * 4
        assert calls[6:] == ["event"]
        c.executor.shutdown()

    asyncio.run(scenario())


def test_a_failed_delete_still_lets_the_committed_decisions_event_and_metrics_out() -> None:
    async def scenario() -> None:
        kube, reg = FakeKube(), CollectorRegistry()
        deletes = kube.delete_pod

        def flaky(namespace: str, name: str, grace_seconds: int | None = None) -> bool:
            if name.endswith("-2-abcde"):
                raise Unavailable("delete pod: 503", 503)
            return deletes(namespace, name, grace_seconds)

        kube.delete_pod = flaky  # type: ignore[method-assign]
        c = _controller(kube, reg)
        _running_attempt_1(c)
        c.on_pod(None, pod(1, 0, exit_code=1, message="NCCL error: unhandled system error"))
        for i in (1, 2, 3):
            c.on_pod(None, pod(1, i))
        with pytest.raises(Unavailable):
            await c.reconcile(("team-a", "llm"))
        await asyncio.gather(*c._posting)
        assert "event" in [x[0] for x in kube.calls], "the decision's Event went out"
        record = c.rtjs[("team-a", "llm")]["status"]["attempts"][0]
        labels = {"namespace": "team-a", "name": "llm", "class": record["failureClass"],
                  "scope": "world"}  # fmt: skip
        assert sample(reg, "rtj_restarts_total", labels) == 1, "the committed restart counts"
        c.executor.shutdown()

    asyncio.run(scenario())


def test_a_storm_of_pod_changes_is_planned_in_batches_a_quiet_jobs_failure_at_once() -> None:
    async def scenario() -> None:
        c = _controller(FakeKube(), CollectorRegistry())
        key = ("team-a", "llm")
        _running_attempt_1(c)
        pods = [pod(1, i) for i in range(8)]
        for p in pods:
            c.on_pod("ADDED", p)
        assert await c.queue.get() == key
        c.queue.done(key)
        c._next_plan.clear()  # a quiet job
        c._held.clear()
        c.queue.forget(key)  # the batch the ADDED events started
        loop = asyncio.get_running_loop()
        # a failure and what follows it by milliseconds: planned at once (the burst)
        for i in range(ctl.WORLD_BURST):
            c.on_pod("MODIFIED", pod(1, i, exit_code=1, message="NCCL error"))
        assert len(c.queue) == 1 and key not in c.queue._timers
        # the storm goes on: its changes wait for one plan, WORLD_BATCH_SECONDS on
        for i in range(ctl.WORLD_BURST, 8):
            c.on_pod("MODIFIED", {**pods[i], "status": {"phase": "Running"}})
        due, _ = c.queue._timers[key]
        assert due - loop.time() == pytest.approx(ctl.WORLD_BATCH_SECONDS, abs=0.05)
        assert await c.queue.get() == key  # the plan for the burst
        c.queue.done(key)
        assert await asyncio.wait_for(c.queue.get(), 2) == key  # one plan for the rest
        c.queue.done(key)
        assert len(c.queue) == 0 and key not in c.queue._timers
        # a job whose plans take long is planned at most once per a multiple of that time
        c._next_plan.clear()
        c._held.clear()
        took = 2 * ctl.WORLD_BATCH_SECONDS / ctl.WORLD_BATCH_FACTOR
        c._plan_seconds[key] = took
        for i in range(ctl.WORLD_BURST + 1):
            c.on_pod("MODIFIED", pod(1, i, exit_code=1, message="NCCL error"))
        due, _ = c.queue._timers[key]
        assert due - loop.time() == pytest.approx(ctl.WORLD_BATCH_FACTOR * took, abs=0.05)
        c.executor.shutdown()

    asyncio.run(scenario())


def test_pods_of_the_old_world_going_do_not_each_enqueue_the_job() -> None:
    """While the job waits for its old world to go, only what can change a decision
    enqueues it: a pod seen for the first time, and the last pod of an attempt gone."""
    c = _controller(FakeKube(), CollectorRegistry())
    key = ("team-a", "llm")
    status = {"phase": "Running", "attempt": 1, "attempts": [{"attempt": 1, "jobSet": "llm-a1"}]}
    c.on_rtj(None, rtj_raw(status))

    def quiet() -> None:  # nothing queued, no batch under way (see the storm test)
        c.queue._dirty.clear()
        c._next_plan.clear()
        c._held.clear()

    pods = [pod(1, i) for i in range(3)]
    for p in pods:
        c.on_pod("ADDED", p)
    quiet()
    c.on_pod("MODIFIED", pods[0])
    assert len(c.queue) == 1, "a running attempt: every pod change counts"
    quiet()
    c.on_rtj("MODIFIED", rtj_raw({**status, "phase": "Restarting"}, rv=11))
    quiet()
    for p in pods:
        c.on_pod("MODIFIED", pod(1, int(p["metadata"]["labels"][keys.JOB_COMPLETION_INDEX]),
                                 deleting=True))  # fmt: skip
    c.on_pod("DELETED", pods[0])
    c.on_pod("DELETED", pods[1])
    assert len(c.queue) == 0, "a deletionTimestamp, a pod gone while others remain"
    assert c.snapshot(key) is not None and len(c.snapshot(key).pods) == 1  # type: ignore[union-attr]
    late = pod(1, 7)
    c.on_pod("ADDED", late)
    assert len(c.queue) == 1, "a pod appearing late is deleted by the next plan"
    quiet()
    c.on_pod("DELETED", late)
    c.on_pod("DELETED", pods[2])
    assert len(c.queue) == 1, "the last one gone: the next attempt may start"
    quiet()
    c.on_pod("MODIFIED", pod(1, 8))  # an old pod the cache lacked (its ADDED missed)
    assert len(c.queue) == 1
    c.executor.shutdown()


def test_only_a_node_seen_deleted_counts_as_deleted() -> None:
    kube, reg = FakeKube(), CollectorRegistry()
    c = _controller(kube, reg)
    _running_attempt_1(c)
    p = pod(1, 0)
    c.on_pod(None, p)
    name = p["spec"]["nodeName"]
    body = {**node(name), "metadata": {"name": name, "uid": "n1", "resourceVersion": "5"}}
    snap = c.snapshot(("team-a", "llm"))
    assert snap is not None and snap.deleted_nodes == frozenset(), "never seen: no proof"
    c.on_node("DELETED", body)
    snap = c.snapshot(("team-a", "llm"))
    assert snap is not None and snap.deleted_nodes == {name}
    c.on_node("ADDED", {**body, "metadata": {**body["metadata"], "uid": "n2"}})
    snap = c.snapshot(("team-a", "llm"))
    assert snap is not None and snap.deleted_nodes == frozenset(), "a node back is not gone"
    c.executor.shutdown()


def test_deleted_pods_are_remembered_for_classification() -> None:
    kube, reg = FakeKube(), CollectorRegistry()
    c = _controller(kube, reg)
    c.on_rtj(None, rtj_raw({"phase": "Running", "attempt": 1}))
    c.on_pod("DELETED", pod(1, 0, deleting=True))
    snap = c.snapshot(("team-a", "llm"))
    assert snap is not None and len(snap.gone_pods) == 1
    assert make_job().metadata.name == "llm"
    c.executor.shutdown()


def test_kopf_builds_no_diff_base_while_only_watch_handlers_are_registered() -> None:
    settings = handlers.make_settings(handlers.WatchOptions())
    storage = settings.persistence.diffbase_storage
    assert handlers.watch_only(handlers.registry), "no change handler, daemon or timer"
    assert isinstance(storage, handlers.WatchOnlyDiffBase)
    body = kopf.Body(pod(1, 0))
    assert storage.build(body=body) == {} and storage.fetch(body=body) is None
    other = kopf.OperatorRegistry()

    @kopf.on.update("pods", registry=other)
    def changed(**_: Any) -> None: ...

    assert not handlers.watch_only(other), "a change handler needs kopf's diff base"


# --- watch caches --------------------------------------------------------------------------------


def _obj(uid: str, rv: int, **labels: str) -> dict[str, Any]:
    return {"metadata": {"uid": uid, "name": uid, "resourceVersion": str(rv), "labels": labels}}


def test_watch_cache_moves_only_forward_and_remembers_deletions() -> None:
    cache = WatchCache(lambda b: [b["metadata"]["labels"].get("job")])
    assert cache.upsert(_obj("a", 5, job="x"))
    assert not cache.upsert(_obj("a", 4, job="y")), "an older event is ignored"
    assert [o["metadata"]["resourceVersion"] for o in cache.get("x")] == ["5"]
    cache.upsert(_obj("a", 6, job="y"))
    assert cache.get("x") == [] and len(cache.get("y")) == 1, "secondary keys follow the object"
    cache.apply("DELETED", _obj("a", 7, job="y"))
    assert not cache.get("y")
    assert not cache.upsert(_obj("a", 6, job="y")), "a late LIST cannot resurrect it"


def test_watch_cache_list_drops_what_the_watch_missed_but_keeps_newer_objects() -> None:
    cache = WatchCache(lambda b: ["all"])
    cache.upsert(_obj("gone", 3))
    cache.upsert(_obj("fresh", 12))
    cache.upsert(_obj("kept", 4))
    removed = cache.replace([_obj("kept", 4), _obj("new", 9)], list_rv=10)
    assert [o["metadata"]["uid"] for o in removed] == ["gone"]
    assert sorted(o["metadata"]["uid"] for o in cache.get("all")) == ["fresh", "kept", "new"]


def test_node_changes_enqueue_the_jobs_with_pods_there() -> None:
    async def scenario() -> None:
        c = _controller(FakeKube(), CollectorRegistry())
        c.on_pod(None, pod(1, 0, node="n1"))
        await c.queue.get()
        c.queue.done(("team-a", "llm"))
        c.on_node("MODIFIED", {"metadata": {"name": "n1", "resourceVersion": "3"}})
        assert await asyncio.wait_for(c.queue.get(), 1) == ("team-a", "llm")
        c.executor.shutdown()

    asyncio.run(scenario())


def test_a_background_refresh_racing_a_corrupt_step_verdict_never_pins_that_step() -> None:
    """Issue 20's interleaving, in the controller: a periodic refresh starts while the cache
    still shows no bad steps (the failure's status patch not seen yet), and finishes after
    the job recorded step 200 as bad. Its reading (step 200) must not pin attempt 2."""
    clock = [NOW]
    release = threading.Event()
    started = threading.Event()

    def reader(uri: str, bad: Any, credentials: Any) -> Selection:
        step = 100 if 200 in set(bad) else 200
        if not bad:  # the racing background refresh
            started.set()
            assert release.wait(5)
        return Selection(step, f"{uri}/steps/step-{step:012d}", NOW - timedelta(minutes=1))

    async def scenario() -> None:
        kube, reg = FakeKube(), CollectorRegistry()
        bodies: list[dict[str, Any]] = []
        create = kube.create_jobset

        def capture(namespace: str, body: dict[str, Any]) -> dict[str, Any]:
            bodies.append(body)
            return create(namespace, body)

        kube.create_jobset = capture  # type: ignore[method-assign]
        settings = Settings(workers=1, operator_identity_stores=SHARED_BUCKET)
        c = ctl.Controller(kube, Metrics(reg), settings,  # type: ignore[arg-type]
                           clock=lambda: clock[0], store_reader=reader)  # fmt: skip
        key = ("team-a", "llm")
        _running_attempt_1(c)
        running = ResilientTrainingJob.from_object(c.rtjs[key])
        refresh = asyncio.ensure_future(c.read_store(running))
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 5)
        # the failure is recorded (step 200 bad) ... then the refresh finishes
        ended = clock[0] - timedelta(seconds=1)
        record = {"attempt": 1, "jobSet": "llm-a1", "endedAt": iso(ended),
                  "failureClass": "CheckpointCorrupt"}  # fmt: skip
        c.on_rtj(None, rtj_raw({"phase": "Restarting", "attempt": 1, "attempts": [record],
                                "badSteps": [200]}, rv=12))  # fmt: skip
        c.on_jobset("DELETED", jobset(1))  # the old world is gone
        release.set()
        c._keep_reading(key, await refresh)
        clock[0] = NOW + timedelta(seconds=1)
        await c.reconcile(key)
        pins = [b["metadata"]["annotations"][keys.RESUME_STEP_ANNOTATION] for b in bodies]
        assert pins == ["100"]
        c.executor.shutdown()

    asyncio.run(scenario())


def test_a_job_recreated_under_the_same_name_inherits_nothing_of_the_old_one() -> None:
    """Issue 13: the RTJJobFailed runbook tells users to delete and re-apply the job. The
    new job (another uid) must not fail at once on the old job's failed pods, even when the
    operator missed the old job's deletion (it was down)."""

    async def scenario() -> None:
        kube, reg = FakeKube(), CollectorRegistry()
        c = _controller(kube, reg)
        key = ("team-a", "llm")
        old = rtj_raw({"phase": "Failed", "attempt": 1,
                       "attempts": [{"attempt": 1, "jobSet": "llm-a1"}]}, rv=10)  # fmt: skip
        c.on_rtj(None, old)
        c.on_jobset(None, jobset(1))
        failed = pod(1, 0, exit_code=1, message="Traceback: ZeroDivisionError")
        c.on_pod(None, failed)
        c.on_pod("DELETED", failed)
        assert c.gone[key]
        new = rtj_raw(rv=30)
        new["metadata"]["uid"] = "a-new-uid"
        c.on_rtj(None, new)  # no DELETED seen for the old uid
        assert key not in c.gone and key not in c.store_readings
        c.on_jobset("DELETED", jobset(1))
        await c.reconcile(key)
        created = [x for x in kube.calls if x[0] == "create_jobset"]
        assert created == [("create_jobset", "llm-a1")], kube.calls
        assert c.rtjs[key]["status"].get("phase") != "Failed"
        c.executor.shutdown()

    asyncio.run(scenario())


def test_a_job_deleted_while_a_list_was_in_flight_does_not_come_back() -> None:
    kube, reg = FakeKube(), CollectorRegistry()
    c = _controller(kube, reg)
    key = ("team-a", "llm")
    c.on_rtj(None, rtj_raw(rv=10))
    c.on_rtj("DELETED", rtj_raw(rv=20))
    listed = rtj_raw(rv=15)  # the LIST's snapshot predates the deletion
    c.on_rtj(None, listed)
    assert key not in c.rtjs
    # another job of the same name (new uid) is a new job, not the deleted one
    again = rtj_raw(rv=25)
    again["metadata"]["uid"] = "a-new-uid"
    c.on_rtj(None, again)
    assert c.rtjs[key]["metadata"]["uid"] == "a-new-uid"
    c.executor.shutdown()


def test_a_failed_events_read_never_yields_a_classification_from_partial_evidence() -> None:
    async def scenario() -> None:
        kube, reg = FakeKube(), CollectorRegistry()
        listed = kube.list_events

        asked: list[str] = []

        def flaky(namespace: str | None, selector: str) -> list[dict[str, Any]]:
            asked.append(selector)
            if "kind=Node" in selector:
                raise Unavailable("etcdserver: request timed out", 504)
            return listed(namespace, selector)

        kube.list_events = flaky  # type: ignore[method-assign]
        c = _controller(kube, reg)
        _running_attempt_1(c)
        c.on_pod(None, pod(1, 0, exit_code=1, message="NCCL error: unhandled system error"))
        with pytest.raises(Unavailable):
            await c.reconcile(("team-a", "llm"))
        assert "patch_status" not in [x[0] for x in kube.calls], "nothing decided"
        # the Events of the job's few nodes are asked for by node name, not cluster-wide
        assert "involvedObject.kind=Node,involvedObject.name=gpu-node-000" in asked
        c.executor.shutdown()

    asyncio.run(scenario())


def test_the_operator_reads_a_store_with_its_own_identity_only_where_allowed() -> None:
    """Issue 13 (confused deputy): a job without a credentialsSecret does not get the
    operator's cloud identity for an arbitrary s3:// URI."""

    async def scenario() -> None:
        kube, reg = FakeKube(), CollectorRegistry()
        reads: list[str] = []

        def reader(uri: str, bad: Any, credentials: Any) -> Selection:
            reads.append(uri)
            return Selection(1200, f"{uri}/steps/step-000000001200", NOW)

        c = ctl.Controller(kube, Metrics(reg), Settings(  # type: ignore[arg-type]
            workers=1, operator_identity_stores=("s3://platform-ckpt/",)),
            clock=lambda: NOW, store_reader=reader)  # fmt: skip
        other = ResilientTrainingJob.from_object(rtj_raw())  # s3://ckpt/team-a/llm
        refused = await c.read_store(other)
        assert refused.error is not None and "credentialsSecret" in refused.error
        assert reads == [], "nothing was read with the operator's identity"
        allowed = rtj_raw(checkpoint={"uri": "s3://platform-ckpt/team-a/llm"})
        assert (await c.read_store(ResilientTrainingJob.from_object(allowed))).error is None
        # near-miss prefixes are not the allowed bucket
        lookalike = rtj_raw(checkpoint={"uri": "s3://platform-ckpt-evil/x"})
        assert (await c.read_store(ResilientTrainingJob.from_object(lookalike))).error
        # with its own credentials a job's store is read (with those credentials)
        owned = rtj_raw(checkpoint={"uri": "s3://anything/x", "credentialsSecret": "mine"})
        assert (await c.read_store(ResilientTrainingJob.from_object(owned))).error is None
        assert reads == ["s3://platform-ckpt/team-a/llm", "s3://anything/x"]
        c.executor.shutdown()

    asyncio.run(scenario())


def test_a_refused_jobset_create_is_remembered_for_the_plan_not_retried_blindly() -> None:
    from rtj_operator.kube_errors import Invalid

    async def scenario() -> None:
        kube, reg = FakeKube(), CollectorRegistry()

        def refuse(namespace: str, body: dict[str, Any]) -> dict[str, Any]:
            kube.calls.append(("create_jobset", body["metadata"]["name"]))
            raise Invalid('JobSet.jobset.x-k8s.io "llm-a1" is invalid: spec: Required', 422)

        kube.create_jobset = refuse  # type: ignore[method-assign]
        c = _controller(kube, reg)
        key = ("team-a", "llm")
        c.on_rtj(None, rtj_raw())
        await c.reconcile(key)
        assert c.rejections[key].jobset == "llm-a1"
        await c.reconcile(key)  # the plan reports it; nothing is sent again
        await asyncio.gather(*c._posting)
        creates = [x for x in kube.calls if x[0] == "create_jobset"]
        assert creates == [("create_jobset", "llm-a1")]
        assert ("event", "JobSetRejected") in kube.calls
        c.executor.shutdown()

    asyncio.run(scenario())


def test_the_local_queue_is_read_at_kueues_preferred_version_first() -> None:
    from rtj_operator.kube_errors import NotFound

    kube, reg = FakeKube(), CollectorRegistry()
    asked: list[str] = []
    served = {"v1beta2": False, "v1beta1": True}  # an older Kueue: v1beta1 only

    def request(what: str, method: str, path: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        asked.append(path.split("/")[3])
        version = path.split("/")[3]
        if not served[version]:
            raise NotFound("the server could not find the requested resource", 404)
        raise NotFound(f'localqueues.kueue.x-k8s.io "{path.split("/")[-1]}" not found', 404)

    kube.request = request  # type: ignore[attr-defined]
    c = _controller(kube, reg)
    reading = c.read_queue("team-a", "team-a")
    assert (reading.exists, asked) == (False, ["v1beta2", "v1beta1"])
    served["v1beta2"] = True  # the pinned Kueue: answered at v1beta2, nothing more asked
    asked.clear()
    # another queue (the lookup of team-a answers for a few seconds, job_reads.QUEUE_SHARED)
    assert c.read_queue("team-a", "team-b").exists is False and asked == ["v1beta2"]
    c.executor.shutdown()
