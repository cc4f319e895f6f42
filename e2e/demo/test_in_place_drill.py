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
from e2e.operator_proc import wait_for
from rtj_operator.api import keys
from rtj_shim.fast import fast_tier
from rtj_shim.fast.peer_replica import PEER_DIR
from rtj_shim.wire.control import ORDER_FILE

pytestmark = [pytest.mark.demo, pytest.mark.timeout(900)]

JOB = "drill-in-place"
WAITING = "drill-waiting"
STEPS, SAVE_EVERY, FAST_EVERY = 300, 40, 5
"""The killed-rank drill strikes by step ~130 (after the attempt's first fast step shows in
status.progress, written at once, then a few fast steps past a durable one); the GPU-fault
and lost-node drills by step ~90 (the first fast step past the durable one that the peer
replica holds): 300 steps leave over 150 to train after the resume (every one compared with
the no-fault run: a state restored wrong differs at its first step), and one no-fault run
serves all three and the fallback drill."""
REPLACE_STEPS = STEPS


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
        body = drills.preloaded(_replicated_job(REPLACED))
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
            _replica_ahead(opts, survivor, step_now())
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
        fast = _resumed_from_the_buddys_copy(
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
            order = _last_order(opts, pod)
            assert (order["action"], order["generation"]) == ("run", 1), order
            assert order.get("master_addr") == spare_ip, order
        for pod in (survivor, spare):  # generation 1 began in the pod's warm standby
            report = drills.supervisor_report(opts, pod)
            assert (report["generation"], report["preloaded"]) == (1, True), report


def _last_order(opts: story.Options, pod: dict[str, Any]) -> dict[str, Any]:
    """The last order the pod's progress sidecar accepted (its control volume's order file)."""
    path = story._pod_dir(opts, pod) / "volumes" / keys.CONTROL_VOLUME / ORDER_FILE
    order: dict[str, Any] = json.loads(path.read_text())
    return order


def _replicated_job(name: str, steps: int = REPLACE_STEPS) -> dict[str, Any]:
    """Restart in place with the fast tier and its peer replica (the default, one copy)."""
    body = drills.in_place_job(name, SAVE_EVERY, steps)
    body["spec"]["checkpoint"]["fastTier"] = {"everySteps": FAST_EVERY, "keep": 4}
    return body


def _replica_ahead(opts: story.Options, holder: dict[str, Any], trained: int) -> bool:
    """Training is between durable saves, at least 5 steps before the next one, and the
    holder's copy of the other pod's fast tier (its peer replica, on its fast-tier volume)
    already has a step past the last durable one: the moment a drill's fault can only be
    recovered with less lost work through the buddy's copy. (Waiting for a step count
    alone raced the copy, a second behind its source, and the next durable save.)"""
    durable = trained - trained % SAVE_EVERY
    if trained <= SAVE_EVERY or trained % SAVE_EVERY > SAVE_EVERY - 5:
        return False
    replica = story._pod_dir(opts, holder) / "volumes" / keys.FAST_TIER_VOLUME / PEER_DIR
    return max(fast_tier.holdings(replica), default=0) > durable


def _resumed_from_the_buddys_copy(
    entry: dict[str, Any],
    survivor_log: list[str],
    replaced_log: list[str],
    trained: int,
    replaced_rank: int = 1,
) -> int:
    """Both ranks resumed from the pinned fast step, newer than the durable one; the
    replacement (a new pod on another node: its own fast tier began empty) could only have
    it from the survivor's copy of its rank. The pinned step, after checks."""
    fast = entry.get("resumedFromFastStep")
    assert fast is not None and fast > entry["resumedFromStep"], entry
    # the replaced rank's pod copies it back
    assert list(entry.get("fastSources") or {}) == [str(replaced_rank)], entry
    replaced = [json.loads(x) for x in replaced_log if '"restore"' in x]
    assert [(r["step"], r["source"]) for r in replaced] == [(fast, "fast-tier")], replaced
    survived = [json.loads(x) for x in survivor_log if '"restore"' in x][1:]
    assert [(r["step"], r["source"]) for r in survived] == [(fast, "fast-tier")], survived
    # the copy lags its source by about one pull (1 s, up to 20 steps here): fewer steps
    # trained again than from the durable save before it
    assert 0 <= trained - fast < SAVE_EVERY, (trained, fast)
    sys.stdout.write(f"both ranks resumed from fast-tier step {fast} (the replaced rank's "
                     f"from its buddy's copy; durable {entry['resumedFromStep']}; "
                     f"{trained - fast} steps trained again)\n")  # fmt: skip
    return int(fast)


LOST = "drill-lost"


def test_a_lost_node_replaces_only_its_pod_and_restarts_the_other_in_place(
    tmp_path: Path,
) -> None:
    """A node goes silent with its processes frozen (the pod runner's cut-off file): judged
    lost from its Lease and its quiet pod, quarantined, its pod force-deleted once fenced and
    created again elsewhere by its Job, the other pod restarted in place; one attempt, and
    the finished model equals the no-fault run bit for bit. The lost pod's fast step comes
    from the survivor's copy of it (the peer replica, issue 16). Preloaded: the survivor's
    generation 1 and the replacement's first start (a held pod) begin in warm standbys."""
    with drills.controlling_platform(tmp_path, "rtj-lost", 3) as platform:
        opts, api = platform.opts, platform.api
        api.create_rtj(story.NAMESPACE, drills.preloaded(_replicated_job(LOST)))
        before = drills.scheduled(api, LOST, 2)
        survivor, victim = drills.rank_pod(before, 0), drills.rank_pod(before, 1)
        log0 = drills.rank_log(opts, survivor, 0)
        wait_for("a replicated fast step past the durable one", lambda: (
            _replica_ahead(opts, survivor, drills.trained(log0))
        ), 300, 0.05)  # fmt: skip
        lost = victim["spec"]["nodeName"]
        (cut,) = drills.cut_off(opts, [victim])  # frozen at this step, then cut off
        frozen = time.monotonic()
        victim_log = drills.rank_log(opts, victim, 1)
        try:
            entry = drills.first_restart_after(
                api, LOST, frozen, "the replacement and the in-place restart"
            )
            assert entry["outcome"] == "Running", entry
            assert entry["failureClass"] == "NodeLost", entry
            assert entry["replaced"] == [f"{victim['metadata']['name']} on {lost}"], entry

            def succeeded() -> bool:
                return drills.status(api, LOST).get("phase") == "Succeeded"

            wait_for("the job to succeed", succeeded, 600, 1.0)
        finally:
            cut.unlink(missing_ok=True)  # contact back: the runner ends what is left there
        status = drills.status(api, LOST)
        assert status["attempt"] == 1 and len(status["attempts"]) == 1, status["attempts"]
        assert [q["node"] for q in status["quarantinedNodes"]] == [lost]
        after = drills.pods(api, LOST, 1)
        assert drills.rank_pod(after, 0)["metadata"]["uid"] == survivor["metadata"]["uid"]
        replacement = drills.rank_pod(after, 1)
        assert replacement["spec"]["nodeName"] not in (lost, survivor["spec"]["nodeName"])
        survivor_log = log0.read_text().splitlines()
        replaced_log = drills.rank_log(opts, replacement, 1).read_text().splitlines()
        trained_before = max(drills.losses(victim_log.read_text().splitlines()))
        fast = _resumed_from_the_buddys_copy(entry, survivor_log, replaced_log, trained_before)
        got = {0: drills.losses(survivor_log), 1: drills.losses(replaced_log)}
        want = drills.no_fault_losses(tmp_path, REPLACE_STEPS, SAVE_EVERY)
        for rank in (0, 1):
            diff = sorted(s for s in got[rank] if got[rank][s] != want[rank][s])
            assert not diff, f"rank {rank}: {len(diff)} steps differ (first {diff[:5]})"
        assert max(got[1]) == REPLACE_STEPS and min(got[1]) == fast + 1
        _began_in_standbys(opts, [survivor, replacement], generation=1)


def _began_in_standbys(opts: story.Options, pods: list[dict[str, Any]], generation: int) -> None:
    """Each pod ran ``generation`` last, and it began in the pod's warm standby."""
    for pod in pods:
        report = drills.supervisor_report(opts, pod)
        assert (report["generation"], report["preloaded"]) == (generation, True), report


BUDDY, BUDDY_STEPS = "drill-buddy", 240  # strikes by step ~90: 150 steps after the resume


def test_a_lost_node_and_its_buddy_fall_back_to_the_durable_step_with_the_reason(
    tmp_path: Path,
) -> None:
    """Three pods on five nodes, each pod's fast steps copied to the next index's pod (the
    ring: 0 holds 2, 1 holds 0, 2 holds 1). The nodes of index 1 and of its buddy, index 2,
    die at one instant: both judged lost (the first verdict waits for the second), both
    quarantined, both pods replaced (inPlaceMaxReplacedPods: 2), index 0 restarted in
    place. Index 2's copy survives on index 0, but index 1's was on the lost index 2: no
    fast step is held for every rank, so every rank resumes from the newest durable step,
    with that reason recorded; the finished model equals the no-fault run bit for bit.
    Preloaded: three trainers and their standbys on two cores."""
    with drills.controlling_platform(tmp_path, "rtj-buddy", 5) as platform:
        opts, api = platform.opts, platform.api
        body = drills.preloaded(_replicated_job(BUDDY, BUDDY_STEPS))
        body["spec"]["replicas"] = 3
        body["spec"]["recovery"]["inPlaceMaxReplacedPods"] = 2
        api.create_rtj(story.NAMESPACE, body)
        before = drills.scheduled(api, BUDDY, 3)
        survivor = drills.rank_pod(before, 0)
        victims = [drills.rank_pod(before, r) for r in (1, 2)]
        log0 = drills.rank_log(opts, survivor, 0)
        # index 0 holds a copy of index 2's fast steps past the durable one: the fallback
        # below is for want of index 1's copy, not for want of any
        wait_for("a replicated fast step past the durable one", lambda: (
            _replica_ahead(opts, survivor, drills.trained(log0))
        ), 300, 0.05)  # fmt: skip
        lost = [v["spec"]["nodeName"] for v in victims]
        cuts = drills.cut_off(opts, victims)  # both at one instant
        frozen = time.monotonic()
        try:
            entry = drills.first_restart_after(
                api, BUDDY, frozen, "the replacements and the in-place restart"
            )
            assert entry["outcome"] == "Running" and entry["failureClass"] == "NodeLost", entry
            assert sorted(entry["replaced"]) == sorted(
                f"{v['metadata']['name']} on {n}" for v, n in zip(victims, lost, strict=True)
            ), entry

            def succeeded() -> bool:
                return drills.status(api, BUDDY).get("phase") == "Succeeded"

            wait_for("the job to succeed", succeeded, 600, 1.0)
        finally:
            for cut in cuts:
                cut.unlink(missing_ok=True)
        status = drills.status(api, BUDDY)
        assert status["attempt"] == 1 and len(status["attempts"]) == 1, status["attempts"]
        assert sorted(q["node"] for q in status["quarantinedNodes"]) == sorted(lost)

        # no fast step for index 1: its only copy was on index 2's lost node
        assert entry.get("resumedFromFastStep") is None, entry
        why = entry.get("fastTierFallback") or ""
        assert why.startswith("pod index 1 (") and "holds no fast step" in why, why
        assert "(its holder, pod index 2, was replaced too)" in why, why
        resumed = entry["resumedFromStep"]
        assert resumed is not None and resumed % SAVE_EVERY == 0, entry
        sys.stdout.write(f"every rank resumed from durable step {resumed}: {why}\n")

        after = drills.pods(api, BUDDY, 1)
        assert drills.rank_pod(after, 0)["metadata"]["uid"] == survivor["metadata"]["uid"]
        logs = {0: log0.read_text().splitlines()}
        for rank in (1, 2):
            replacement = drills.rank_pod(after, rank)
            assert replacement["spec"]["nodeName"] not in (*lost, survivor["spec"]["nodeName"])
            path = drills.rank_log(opts, replacement, rank)
            logs[rank] = path.read_text().splitlines()
        for rank, lines in logs.items():
            restores = [json.loads(x) for x in lines if '"restore"' in x]
            last = restores[-1]
            assert last["step"] == resumed and last["source"] != "fast-tier", (rank, restores)
        got = {rank: drills.losses(lines) for rank, lines in logs.items()}
        want = drills.no_fault_losses(tmp_path, BUDDY_STEPS, SAVE_EVERY, ranks=3)
        for rank in (0, 1, 2):
            diff = sorted(s for s in got[rank] if got[rank][s] != want[rank][s])
            assert not diff, f"rank {rank}: {len(diff)} steps differ (first {diff[:5]})"
            assert max(got[rank]) == BUDDY_STEPS
        assert min(got[1]) == min(got[2]) == resumed + 1
        replacements = [drills.rank_pod(after, rank) for rank in (1, 2)]
        _began_in_standbys(opts, [survivor, *replacements], generation=1)
