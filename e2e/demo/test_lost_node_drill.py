"""Drills on real training through the pod runner (issues 15, 16, 45): nodes lost under a
job that restarts in place, with the fast tier's peer replica. One lost node: only its pod
replaced (while no free node can take it, a job that may not shrink waits whole), the other
restarted in place, the replaced rank resuming from its buddy's copy. A node and its buddy
lost at one instant: no fast step held for every rank, every rank from the durable step,
with the reason.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from e2e.demo import drills, story
from e2e.demo.replicated import (
    REPLACE_STEPS,
    SAVE_EVERY,
    began_in_standbys,
    replica_ahead,
    replicated_job,
    resumed_from_the_buddys_copy,
)
from e2e.operator_proc import wait_for

pytestmark = [pytest.mark.demo, pytest.mark.timeout(900)]


LOST = "drill-lost"
NO_SHRINK_WINDOW_S = 20.0
"""How long past the lost node's quarantine the drill checks that a job that may not shrink
did not (its `waitForReplacementSeconds` is 5)."""


def _no_shrink_while_no_node(api: Any, name: str, free: str, kube: Any) -> None:
    """With the replacement unschedulable, the world stays whole for `NO_SHRINK_WINDOW_S`
    past the quarantine (an elastic job would have shrunk 5 s after it); then `free` is
    uncordoned."""
    wait_for("the lost node's pod being replaced", lambda: (
        (drills.status(api, name).get("inPlace") or {}).get("replacing")), 180, 0.2)  # fmt: skip
    until = time.monotonic() + NO_SHRINK_WINDOW_S
    while time.monotonic() < until:
        status = drills.status(api, name)
        record = status["attempts"][-1]
        assert record.get("worldSize") in (None, 2), record
        conditions = [c for c in status.get("conditions", []) if c["type"] == "Elastic"]
        assert not conditions or conditions[0]["status"] != "True", conditions
        time.sleep(0.5)
    kube.core.patch_node(free, {"spec": {"unschedulable": False}})


def test_a_lost_node_replaces_only_its_pod_and_restarts_the_other_in_place(
    tmp_path: Path,
) -> None:
    """A node goes silent with its processes frozen (the pod runner's cut-off file): judged
    lost from its Lease and its quiet pod, quarantined, its pod force-deleted once fenced and
    created again elsewhere by its Job, the other pod restarted in place; one attempt, and
    the finished model equals the no-fault run bit for bit. The lost pod's fast step comes
    from the survivor's copy of it (the peer replica, issue 16). Preloaded: the survivor's
    generation 1 and the replacement's first start (a held pod) begin in warm standbys.

    Shrinking not allowed (issue 45: `spec.elastic.minReplicas` = `replicas`): the free node
    is cordoned when the node is lost, so the replacement cannot be scheduled; well past
    `waitForReplacementSeconds` the world is still the whole one (no resize, no `Elastic`
    condition), and once the node is uncordoned the recovery is as without spec.elastic."""
    with drills.controlling_platform(tmp_path, "rtj-lost", 3) as platform:
        opts, api, kube = platform.opts, platform.api, platform.kube
        body = drills.preloaded(replicated_job(LOST))
        body["spec"]["elastic"] = {"minReplicas": 2, "waitForReplacementSeconds": 5}
        api.create_rtj(story.NAMESPACE, body)
        before = drills.scheduled(api, LOST, 2)
        survivor, victim = drills.rank_pod(before, 0), drills.rank_pod(before, 1)
        used = {p["spec"]["nodeName"] for p in before}
        (free,) = [n.metadata.name for n in kube.core.list_node().items
                   if n.metadata.name not in used]  # fmt: skip
        kube.core.patch_node(free, {"spec": {"unschedulable": True}})
        log0 = drills.rank_log(opts, survivor, 0)
        wait_for("a replicated fast step past the durable one", lambda: (
            replica_ahead(opts, survivor, drills.trained(log0))
        ), 300, 0.05)  # fmt: skip
        lost = victim["spec"]["nodeName"]
        (cut,) = drills.cut_off(opts, [victim])  # frozen at this step, then cut off
        frozen = time.monotonic()
        victim_log = drills.rank_log(opts, victim, 1)
        try:
            _no_shrink_while_no_node(api, LOST, free, kube)
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
        fast = resumed_from_the_buddys_copy(entry, survivor_log, replaced_log, trained_before)
        got = {0: drills.losses(survivor_log), 1: drills.losses(replaced_log)}
        want = drills.no_fault_losses(tmp_path, REPLACE_STEPS, SAVE_EVERY)
        for rank in (0, 1):
            diff = sorted(s for s in got[rank] if got[rank][s] != want[rank][s])
            assert not diff, f"rank {rank}: {len(diff)} steps differ (first {diff[:5]})"
        assert max(got[1]) == REPLACE_STEPS and min(got[1]) == fast + 1
        began_in_standbys(opts, [survivor, replacement], generation=1)


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
        body = drills.preloaded(replicated_job(BUDDY, BUDDY_STEPS))
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
            replica_ahead(opts, survivor, drills.trained(log0))
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
        began_in_standbys(opts, [survivor, *replacements], generation=1)
