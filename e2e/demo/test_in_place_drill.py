"""Drill on real training through the pod runner (issue 15): restart in place. A job with
``spec.recovery.inPlace`` runs the example trainer (2 worker pods, one rank each) under
``rtj-shim supervise``; one rank's training process is SIGKILLed. Nothing in Kubernetes
fails (the supervisor keeps the pod up): the operator sees the exit through the progress
sidecar, orders every pod to stop (the barrier: all stopped), pins the newest step every
pod holds in its fast checkpoint tier (issue 16: every 5 steps in the pod's memory, while
durable saves are every 40) and orders the same pods to start again from it. No pod is
re-created, the attempt stays 1, at most 5 steps are trained again, and the finished model
equals a no-fault run of the same steps bit for bit.

The job also keeps its place in the Kueue queue (issue 19): with the quota full, a second
job waits; the restart re-admits nothing, so the waiting job is still waiting after it and
is admitted only when the first one finishes.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import faults
from e2e.cluster.testenv import TestNamespace
from e2e.demo import drills, story
from e2e.demo.replicated import (
    FAST_EVERY,
    REPLACE_STEPS,
    SAVE_EVERY,
    STEPS,
    last_order,
    replica_ahead,
    replicated_job,
    resumed_from_the_buddys_copy,
)
from e2e.operator_proc import wait_for
from rtj_operator.api import keys

pytestmark = [pytest.mark.demo, pytest.mark.timeout(900)]

JOB = "drill-in-place"
WAITING = "drill-waiting"


def test_a_killed_rank_restarts_in_place_without_recreating_a_pod(tmp_path: Path) -> None:
    with drills.controlling_platform(tmp_path, "rtj-inplace", 3) as platform:
        opts, kube, api = platform.opts, platform.kube, platform.api
        body = drills.in_place_job(JOB, SAVE_EVERY, STEPS)
        body["spec"]["checkpoint"]["fastTier"] = {"everySteps": FAST_EVERY}
        api.create_rtj(story.NAMESPACE, body)

        wait_for("both pods running", lambda: len(drills.pods(api, JOB, 1)) == 2, 300, 0.5)
        pods = {p["metadata"]["uid"]: p for p in drills.pods(api, JOB, 1)}
        # the quota is full now: a second job waits behind this one
        TestNamespace(kube=kube, name=story.NAMESPACE, cluster_queue=story.NAMESPACE,
                      local_queue=story.QUEUE).set_gpu_quota(2)  # fmt: skip
        api.create_rtj(story.NAMESPACE, drills.job(WAITING))
        wait_for("the waiting job's JobSet", lambda: drills.jobset(api, WAITING), 60, 0.5)

        def step_now() -> int:  # from the trainer's own log: status lags up to 30 s
            log = drills.rank_log(opts, drills.rank_pod(list(pods.values()), 0), 0)
            try:
                return max(drills.losses(log.read_text().splitlines()), default=0)
            except FileNotFoundError:
                return 0

        def trained(step: int) -> bool:
            return step_now() >= step

        wait_for("training past step 92", lambda: trained(92), 300, 0.5)
        # the fast tier's step, from the progress sidecars (its first is written at once)
        fast_seen = wait_for("a fast-tier step in status.progress", lambda: (
            drills.status(api, JOB).get("progress") or {}).get("fastStep"), 90, 1.0)  # fmt: skip
        assert fast_seen % FAST_EVERY == 0, fast_seen
        # kill between two durable saves, a few fast steps past the last one
        wait_for("a step between durable saves", lambda: (
            2 * FAST_EVERY <= step_now() % SAVE_EVERY <= SAVE_EVERY - 3), 60, 0.05)  # fmt: skip
        victim = drills.rank_pod(list(pods.values()), 1)
        assert victim["spec"]["containers"][0]["command"][:2] == ["rtj-shim", "supervise"]
        os.kill(drills.trainer_pid(opts, victim), signal.SIGKILL)
        killed = time.monotonic()
        log = drills.rank_log(opts, victim, 1)
        trained_before_kill = max(drills.losses(log.read_text().splitlines()))

        def restarted() -> dict[str, Any] | None:

            return drills.first_restart(api, JOB)

        entry = wait_for("the in-place restart", restarted, 180, 0.2)
        took = time.monotonic() - killed
        assert entry["outcome"] == "Running", entry
        assert entry["firstFailed"]["pod"] == victim["metadata"]["name"]
        waiting = drills.jobset(api, WAITING)
        assert waiting is not None and waiting["spec"]["suspend"] is True, "still queued"
        sys.stdout.write(f"\nSIGKILL -> every pod runs generation 1: {took:.1f} s ({entry})\n")

        wait_for("the job to succeed",
                 lambda: drills.status(api, JOB).get("phase") == "Succeeded", 600, 1.0)  # fmt: skip
        status = drills.status(api, JOB)
        assert status["attempt"] == 1 and len(status["attempts"]) == 1, status["attempts"]
        assert status["trainerGeneration"] == 1
        now = {p["metadata"]["uid"] for p in drills.pods(api, JOB, 1)}
        assert now == set(pods), "no pod was re-created"
        restored: list[tuple[int, str]] = []
        got = {}
        for rank, pod in ((0, drills.rank_pod(list(pods.values()), 0)), (1, victim)):
            text = drills.rank_log(opts, pod, rank).read_text().splitlines()
            restores = [json.loads(x) for x in text if '"restore"' in x]
            restored += [(r["step"], r["source"]) for r in restores[1:]]
            got[rank] = drills.losses(text)
        # the fast tier: newer than the durable step, at most FAST_EVERY steps trained again
        fast = entry.get("resumedFromFastStep")
        assert fast is not None and fast > entry["resumedFromStep"], entry
        assert restored == [(fast, "fast-tier")] * 2, restored
        lost = trained_before_kill - fast
        # one fast step may still have been in its background write when the rank died
        assert 0 <= lost <= 2 * FAST_EVERY + 1, (trained_before_kill, fast)
        sys.stdout.write(f"resumed from fast-tier step {fast} ({lost} steps trained again; "
                         f"durable step {entry['resumedFromStep']})\n")  # fmt: skip
        want = drills.no_fault_losses(tmp_path, STEPS, SAVE_EVERY)
        for rank in (0, 1):
            diff = sorted(s for s in want[rank] if got[rank].get(s) != want[rank][s])
            assert not diff, f"rank {rank}: {len(diff)} steps differ (first {diff[:5]})"
        _ledger_agrees_with_the_trainers(status, fast, trained_before_kill, [
            drills.rank_log(opts, drills.rank_pod(list(pods.values()), 0), 0),
            drills.rank_log(opts, victim, 1)])  # fmt: skip
        events = api.list_events(story.NAMESPACE, "reason=RestartedInPlace")
        assert events, "the restart is an Event"
        admitted = wait_for("the waiting job admitted once the first one finished", lambda: (
            (js := drills.jobset(api, WAITING)) is not None and js["spec"]["suspend"] is False
        ), 120, 0.5)  # fmt: skip
        assert admitted
        api.delete_rtj(story.NAMESPACE, WAITING)


LEDGER_EPSILON = 2.0
"""Seconds the ledger's first step may follow the last rank's own log line of it: the
trainer logs a step, then reports it at the step's boundary (the fast tier's save and the
agreement's collective run between), and the milestone is placed on the operator's clock
through one report's timestamp."""


def _ledger_agrees_with_the_trainers(
    status: dict[str, Any], fast: int, trained: int, logs: list[Path]
) -> None:
    """The recovery ledger (issue 48): one in-place record, complete, resumed where the
    trainers' logs say they resumed, its phases summing to its wall time, and its first
    step within LEDGER_EPSILON after the last rank logged its first step of generation 1."""
    (ledger,) = status["recoveries"]
    assert (ledger["path"], ledger["generation"], ledger["replacement"]) == ("InPlace", 1, "None")
    assert ledger["resumedStep"] == fast, ledger
    assert ledger["stepsRetrained"] == ledger["stepAtFailure"] - fast >= 0, ledger
    assert ledger["stepAtFailure"] <= trained, (ledger, trained)
    phases = dict(drills.assert_ledger_sums(ledger))
    assert {"rendezvous", "restored", "firstStep"} <= {p.value for p in phases}, phases
    firsts = [drills.first_step_time(log, 1) for log in logs]
    assert None not in firsts, firsts
    first = datetime.fromisoformat(ledger["firstStepAt"].replace("Z", "+00:00")).timestamp()
    lag = first - max(t for t in firsts if t is not None)
    assert -0.05 <= lag <= LEDGER_EPSILON, (lag, ledger)
    sys.stdout.write(f"ledger: {', '.join(f'{p.value} {s:.2f}s' for p, s in phases.items())}; "
                     f"its first step {lag:.3f} s after the trainers' log\n")  # fmt: skip


REPLACED = "drill-replace"


def _of(pods: list[dict[str, Any]], replicated_job: str, index: int) -> dict[str, Any]:
    """The pod of `replicated_job` (worker, spare) with completion index `index`."""
    return next(
        p for p in pods
        if p["metadata"]["labels"].get(keys.REPLICATED_JOB_LABEL) == replicated_job
        and p["metadata"]["labels"][drills.RANK_LABEL] == str(index)
    )  # fmt: skip


def test_a_gpu_fault_is_replaced_by_a_warm_spare_and_the_other_restarts_in_place(
    tmp_path: Path,
) -> None:
    """A GPU fault on one node (the health agent's XID condition, the rank's process killed
    with it): the node is quarantined, its pod deleted, and the warm spare (spec.spares: 1,
    admitted and idle on a third node) takes its rank at once, with no wait for its Job to
    create the pod again; the other pod restarts in place. One attempt, one JobSet. With the
    fast tier's peer replica (issue 16), the spare copies the pinned fast step of the rank
    back from the other pod's copy and both resume from it, not from the durable step. The
    pod the Job creates again for the index is a spare itself, held, and finishes when the
    world does, so the JobSet completes; the finished model equals the no-fault run bit for
    bit. Every pod keeps a warm standby interpreter (spec.recovery.inPlacePreload, the
    trainer under python directly): the spare and the survivor start generation 1 in theirs,
    torch already imported. The fault is on rank 0's node: the spare becomes rank 0, and the
    run orders move the rendezvous host to it (its pod IP), where the survivor finds it."""
    with drills.controlling_platform(tmp_path, "rtj-replace", 4) as platform:
        opts, kube, api = platform.opts, platform.kube, platform.api
        body = drills.preloaded(replicated_job(REPLACED))
        body["spec"]["spares"] = 1
        body["spec"]["recovery"]["inPlaceMaxReplacedPods"] = 1
        api.create_rtj(story.NAMESPACE, body)
        wait_for("both pods and the spare running", lambda: (
            len(ps := drills.pods(api, REPLACED, 1)) == 3
            and all(p.get("status", {}).get("phase") == "Running" for p in ps)
        ), 300, 0.5)  # fmt: skip
        before = drills.pods(api, REPLACED, 1)
        survivor, victim = _of(before, "worker", 1), _of(before, "worker", 0)
        spare = _of(before, "spare", 0)
        jobset_uid = (drills.jobset(api, REPLACED) or {})["metadata"]["uid"]

        def step_now() -> int:
            log = drills.rank_log(opts, survivor, 1)
            try:
                return max(drills.losses(log.read_text().splitlines()), default=0)
            except FileNotFoundError:
                return 0

        # the survivor holds a copy of the victim's fast step past the last durable save
        wait_for("a replicated fast step past the durable one", lambda: (
            replica_ahead(opts, survivor, step_now())
        ), 300, 0.05)  # fmt: skip
        bad = victim["spec"]["nodeName"]
        pid = drills.trainer_pid(opts, victim)
        faults.gpu_xid(kube, bad, 79)
        os.kill(pid, signal.SIGKILL)
        hit = time.monotonic()
        victim_log = drills.rank_log(opts, victim, 0)
        trained_before = max(drills.losses(victim_log.read_text().splitlines()))

        def restarted() -> dict[str, Any] | None:
            return drills.first_restart(api, REPLACED)

        entry = wait_for("the spare's takeover and the in-place restart", restarted, 240, 0.2)
        took = time.monotonic() - hit
        sys.stdout.write(f"\nXID + SIGKILL -> every pod runs generation 1, the spare as rank "
                         f"0: {took:.1f} s ({entry})\n")  # fmt: skip
        assert entry["outcome"] == "Running", entry
        assert entry["failureClass"] == "GPUFault", entry
        assert entry["replaced"] == [f"{victim['metadata']['name']} on {bad}"], entry
        assert entry["spares"] == [
            f"{spare['metadata']['name']} on {spare['spec']['nodeName']} took rank 0 of "
            f"{victim['metadata']['name']}"
        ], entry
        assert entry["stoppedAt"] <= entry["startedAt"]
        status = drills.status(api, REPLACED)
        assert [q["node"] for q in status["quarantinedNodes"]] == [bad]
        assert status["attempts"][0]["spareRanks"] == {spare["metadata"]["name"]: 0}

        def succeeded() -> bool:
            return drills.status(api, REPLACED).get("phase") == "Succeeded"

        wait_for("the job to succeed", succeeded, 600, 1.0)
        status = drills.status(api, REPLACED)
        assert status["attempt"] == 1 and len(status["attempts"]) == 1, status["attempts"]
        assert (drills.jobset(api, REPLACED) or {}).get("metadata", {}).get("uid") == jobset_uid
        after = drills.pods(api, REPLACED, 1)
        assert _of(after, "worker", 1)["metadata"]["uid"] == survivor["metadata"]["uid"]
        assert _of(after, "spare", 0)["metadata"]["uid"] == spare["metadata"]["uid"]
        again = _of(after, "worker", 0)  # created again by its Job: a spare, it finished
        assert again["metadata"]["uid"] != victim["metadata"]["uid"]
        assert again["spec"]["nodeName"] not in (bad, spare["spec"]["nodeName"])
        assert again["metadata"]["annotations"][keys.JOB_INDEX_FAILURE_COUNT] == "1"
        assert again["status"]["phase"] == "Succeeded"
        assert not drills.rank_log(opts, again, 0).exists(), "it never trained"

        survivor_log = drills.rank_log(opts, survivor, 1).read_text().splitlines()
        replaced_log = drills.rank_log(opts, spare, 0).read_text().splitlines()
        fast = resumed_from_the_buddys_copy(
            entry, survivor_log, replaced_log, trained_before, replaced_rank=0
        )
        got = {1: drills.losses(survivor_log), 0: drills.losses(replaced_log)}
        want = drills.no_fault_losses(tmp_path, REPLACE_STEPS, SAVE_EVERY)
        for rank in (0, 1):
            diff = sorted(s for s in got[rank] if got[rank][s] != want[rank][s])
            assert not diff, f"rank {rank}: {len(diff)} steps differ (first {diff[:5]})"
        assert max(got[0]) == REPLACE_STEPS and min(got[0]) == fast + 1
        # rank 0 moved: both pods' run orders named the spare's pod IP as the rendezvous host
        spare_ip = spare["status"]["podIP"]
        for pod in (survivor, spare):
            order = last_order(opts, pod)
            assert (order["action"], order["generation"]) == ("run", 1), order
            assert order.get("master_addr") == spare_ip, order
        for pod in (survivor, spare):  # generation 1 began in the pod's warm standby
            report = drills.supervisor_report(opts, pod)
            assert (report["generation"], report["preloaded"]) == (1, True), report
