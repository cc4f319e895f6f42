"""Replace only what is broken (issue 15), decided without a cluster: a GPU fault under a
supervised trainer's exit quarantines the node, replaces the one pod on it (deleted; its
Job creates it again, held until ordered) and restarts the others in place; the barrier
waits for the old pod to be gone and the replacement to report."""

from __future__ import annotations

import copy
from dataclasses import replace as dc_replace
from datetime import timedelta
from typing import Any

from rtj_test_support import NOW, make_job, supervisor_reports
from rtj_world import (
    jobset,
    node,
    nodes_for,
    reading,
    rtj_raw,
    snapshot,
    tainted_by,
    target,
    with_status,
)
from test_in_place import IN_PLACE, KEY, RUNNING, T, plan, supervised_pods

from rtj_operator import reconcile as rc
from rtj_operator.api import FailureClass, keys
from rtj_operator.policy import in_place
from rtj_operator.policy.classify import Classification
from rtj_operator.policy.liveness import NodeLease
from rtj_operator.policy.render import render_jobset
from rtj_shim.wire.supervisor_report import SupervisorReport

XID = 79


def replaceable_pods(n: int = 2) -> list[dict[str, Any]]:
    pods = supervised_pods(n)
    for p in pods:  # the Job controller's annotation with backoffLimitPerIndex
        p["metadata"]["annotations"][keys.JOB_INDEX_FAILURE_COUNT] = "0"
    return pods


def supervisors(reports: dict[str, tuple[int, str, int | None]]) -> rc.RankReadings:
    body = {
        pod: {"generation": g, "state": s, "exit_code": c, "updated_wall_time": T - 5}
        for pod, (g, s, c) in reports.items()
    }
    return rc.RankReadings(
        attempt=1,
        reports=(),
        polled_at=T,
        supervisors=supervisor_reports(body),
    )


def test_a_replaceable_world_is_rendered_with_a_per_index_backoff_and_the_failure_count() -> None:
    job = make_job(**IN_PLACE)
    template = render_jobset(job, 1, None, KEY)["spec"]["replicatedJobs"][0]["template"]
    spec = template["spec"]
    assert "backoffLimit" not in spec
    budget = job.spec.failure_policy.max_restarts
    assert (spec["backoffLimitPerIndex"], spec["maxFailedIndexes"]) == (budget, 0)
    trainer = spec["template"]["spec"]["containers"][0]
    failures = next(e for e in trainer["env"] if e["name"] == keys.ENV_INDEX_FAILURES)
    assert failures["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.annotations['batch.kubernetes.io/job-index-failure-count']"
    )
    # replacement off, or no supervisor: the first failed pod fails the Job, as before
    off = make_job(**{**IN_PLACE, "recovery": {"inPlace": True, "inPlaceMaxReplacedPods": 0}})
    plain = render_jobset(off, 1, None, KEY)["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert plain["backoffLimit"] == 0 and "backoffLimitPerIndex" not in plain
    unsupervised = render_jobset(job, 1, None, None)["spec"]["replicatedJobs"][0]["template"]
    assert unsupervised["spec"]["backoffLimit"] == 0


def _gpu_fault(pods: list[dict[str, Any]]) -> Classification:
    return Classification(
        FailureClass.GPU_FAULT, None, (pods[1]["spec"]["nodeName"],), ("xid 79",), None
    )


def test_which_pods_are_replaced_and_when_the_whole_world_goes_instead() -> None:
    pods = replaceable_pods(3)
    job = make_job(**{**IN_PLACE, "replicas": 3})
    reports = {p["metadata"]["name"]: {"generation": 0, "state": "running"} for p in pods}
    bad = pods[1]["spec"]["nodeName"]
    found = _gpu_fault(pods)
    waiting = in_place.choose(job, found, pods, reports)
    assert waiting.refused == f"nodes {bad} are not quarantined yet"
    chosen = in_place.choose(job, found, pods, reports, [bad])
    assert chosen == in_place.InPlaceChoice(None, (pods[1]["metadata"]["name"],))
    # the pod being replaced need not answer (a lost node); the others must
    quiet = {k: v for k, v in reports.items() if k != pods[1]["metadata"]["name"]}
    assert in_place.choose(job, found, pods, quiet, [bad]).refused is None
    quiet.pop(pods[0]["metadata"]["name"])
    assert "has not reported" in (in_place.choose(job, found, pods, quiet, [bad]).refused or "")
    # two implicated pods with a limit of one; replacement turned off
    two = Classification(FailureClass.NODE_LOST, None, (bad, pods[2]["spec"]["nodeName"]), ())
    refused = in_place.choose(job, two, pods, reports, [bad, pods[2]["spec"]["nodeName"]])
    assert "with 2 pods on them; spec.recovery.inPlaceMaxReplacedPods is 1" in (
        refused.refused or ""
    )
    off = make_job(**{**IN_PLACE, "replicas": 3,
                      "recovery": {"inPlace": True, "inPlaceMaxReplacedPods": 0}})  # fmt: skip
    assert "inPlaceMaxReplacedPods is 0" in (in_place.choose(off, found, pods, reports, [bad])
                                              .refused or "")  # fmt: skip
    # a pod whose Job would not create it again (rendered before this feature)
    old = copy.deepcopy(pods)
    del old[1]["metadata"]["annotations"][keys.JOB_INDEX_FAILURE_COUNT]
    assert "cannot be replaced by its Job" in (
        in_place.choose(job, found, old, reports, [bad]).refused or ""
    )
    # a user error never replaces anything
    user = Classification(FailureClass.USER_ERROR, None, (bad,), ())
    assert "needs more than a restart" in (in_place.choose(job, user, pods, reports, [bad])
                                           .refused or "")  # fmt: skip


def gpu_fault() -> tuple[list[dict[str, Any]], list[str], str, dict[str, Any], rc.RankReadings]:
    """Two replaceable pods; pod 1's trainer exited and its node shows an XID: the pods,
    their names, the bad node, every node, the supervisors' reports."""
    pods = replaceable_pods()
    names = [p["metadata"]["name"] for p in pods]
    bad = pods[1]["spec"]["nodeName"]
    nodes = {**nodes_for(pods), bad: node(bad, xid=XID)}
    exited = supervisors({names[0]: (0, "running", None), names[1]: (0, "exited", 1)})
    return pods, names, bad, nodes, exited


def test_a_gpu_fault_under_a_trainers_exit_replaces_that_pod_and_restarts_the_other() -> None:
    pods, names, bad, nodes, exited = gpu_fault()
    raw = rtj_raw(RUNNING, **IN_PLACE)

    # 1. one plan: the node is quarantined (recorded, then tainted) and the restart begins:
    # the pod on it is to be replaced, the other restarts in place; no JobSet touched
    first = plan(raw, pods, exited, nodes=nodes)
    raw = with_status(raw, first)
    assert [q["node"] for q in raw["status"]["quarantinedNodes"]] == [bad]
    state = raw["status"]["inPlace"]
    assert (state["phase"], state["replacing"]) == ("Stopping", [names[1]])
    entry = raw["status"]["attempts"][0]["inPlaceRestarts"][0]
    assert entry["failureClass"] == "GPUFault" and entry["replaced"] == [f"{names[1]} on {bad}"]
    assert any("exited with code 1" in line for line in entry["evidence"])
    assert entry["firstFailed"]["container"] == "trainer", entry["firstFailed"]
    assert [a.node for a in first.actions if isinstance(a, rc.TaintNode)] == [bad]
    assert not [a for a in first.actions if isinstance(a, (rc.DeleteJobSet, rc.DeletePod))], (
        "the pod on the node is deleted only once its taint holds: else its replacement "
        "could be scheduled back onto it"
    )
    assert raw["status"]["attempt"] == 1

    # 2. the taint holds: the pod on the node is deleted, briefly
    nodes = tainted_by(nodes, first)
    second = plan(raw, pods, exited, nodes=nodes)
    deletes = [a for a in second.actions if isinstance(a, rc.DeletePod)]
    assert [(d.name, d.grace_seconds) for d in deletes] == [(names[1], 2)]
    assert not [a for a in second.actions if isinstance(a, rc.DeleteJobSet)]

    # 3. the old pod still terminating: the barrier holds even with the survivor stopped
    going = copy.deepcopy(pods)
    going[1]["metadata"]["deletionTimestamp"] = "2025-03-14T12:00:30Z"
    stopped = supervisors({names[0]: (1, "stopped", None)})
    held = plan(raw, going, stopped, nodes=nodes)
    assert held.status_patch is None
    assert not [a for a in held.actions if isinstance(a, rc.DeleteJobSet)]

    # 4. the old pod gone, its Job's replacement (same index, another node) held and
    # stopped for generation 1 with the survivor: pinned, Starting
    new = copy.deepcopy(pods[1])
    new["metadata"]["name"] = names[1].replace("abcde", "fghij")
    new["metadata"]["annotations"][keys.JOB_INDEX_FAILURE_COUNT] = "1"
    new["spec"]["nodeName"] = "gpu-node-009"
    world = [pods[0], new]
    fresh = new["metadata"]["name"]
    both = supervisors({names[0]: (1, "stopped", None), fresh: (1, "stopped", None)})
    at_nine = {**nodes, "gpu-node-009": node("gpu-node-009")}
    unread = plan(raw, world, both, nodes=at_nine)
    assert unread.needs_store, "the step is pinned from a reading begun after the failure"
    assert plan(
        raw, world, both, nodes=at_nine, store=reading(1160, NOW - timedelta(seconds=5))
    ).needs_store
    starting = plan(raw, world, both, nodes=at_nine, store=reading(1200, NOW))
    raw = with_status(raw, starting)
    assert (raw["status"]["inPlace"]["phase"], raw["status"]["inPlace"]["step"]) == (
        "Starting", 1200,
    )  # fmt: skip
    order = rc.restart_order(snapshot(raw, pods=world))
    assert order is not None and (order.action, order.generation, order.step) == ("run", 1, 1200)

    # 5. both run generation 1: done, one attempt, the replacement recorded
    running = supervisors({names[0]: (1, "running", None), fresh: (1, "running", None)})
    done = plan(raw, world, running, nodes={**nodes, "gpu-node-009": node("gpu-node-009")})
    raw = with_status(raw, done)
    assert "inPlace" not in raw["status"] and raw["status"]["phase"] == "Running"
    entry = raw["status"]["attempts"][0]["inPlaceRestarts"][0]
    assert entry["outcome"] == "Running" and raw["status"]["attempt"] == 1

    # 6. the replaced pod, still there a while (failed, terminating: the Job's tracking
    # finalizer) or seen deleted, is no evidence afterwards: no second failure
    victim = copy.deepcopy(pods[1])
    victim["metadata"]["deletionTimestamp"] = "2025-03-14T12:00:02Z"
    victim["status"]["phase"] = "Failed"
    victim["status"]["containerStatuses"] = [{"name": "trainer", "state": {"terminated": {
        "exitCode": 137, "reason": "Error", "finishedAt": "2025-03-14T12:00:01Z"}}}]  # fmt: skip
    healthy = {**nodes, "gpu-node-009": node("gpu-node-009")}
    for pods_now, gone in (([*world, victim], []), (world, [victim])):
        later = plan(raw, pods_now, running, nodes=healthy, gone=gone)
        acted = [a for a in later.actions if isinstance(a, (rc.DeleteJobSet, rc.DeletePod))]
        assert not acted, later.summary


def _two_lost(spec: dict[str, Any]) -> tuple[Any, ...]:
    """Three replaceable pods; the machines of index 1 and 2 die at NOW. Their kubelets had
    renewed their Leases 1 s and 10 s before (40 s Leases: overdue 11 s after a renewal),
    so index 2's node is judged lost 1 s after the death, index 1's 10 s after."""
    pods = replaceable_pods(3)
    names = [p["metadata"]["name"] for p in pods]
    late, early = pods[1]["spec"]["nodeName"], pods[2]["spec"]["nodeName"]
    leases = {p["spec"]["nodeName"]: NodeLease(NOW) for p in pods}
    leases[late], leases[early] = (
        NodeLease(NOW - timedelta(seconds=1)),
        NodeLease(NOW - timedelta(seconds=10)),
    )
    cluster = {"nodes": nodes_for(pods)}  # tainted as each plan's claims are placed

    def step(
        raw: dict[str, Any], seconds: float, late_renews: bool = False
    ) -> tuple[rc.Plan, dict[str, Any]]:
        """The plan `seconds` after the death, and the job after it. `late_renews`: index
        1's kubelet renews on time (only its pod is silent)."""
        now = NOW + timedelta(seconds=seconds)
        dead = (early,) if late_renews else (late, early)
        alive = {n: lease if n in dead else NodeLease(now) for n, lease in leases.items()}
        ranks = rc.RankReadings(
            attempt=1, reports=(), polled_at=now.timestamp(),
            quiet_since={names[1]: NOW.timestamp(), names[2]: NOW.timestamp()},
            supervisors={names[0]: SupervisorReport.parse({
                "generation": 0, "state": "running", "updated_wall_time": now.timestamp() - 1,
            })},
        )  # fmt: skip
        snap = snapshot(raw, jobsets=[jobset(1)], pods=pods, now=now, nodes=cluster["nodes"])
        p = rc.plan(dc_replace(snap, ranks=ranks, control_key=KEY, node_leases=alive))
        cluster["nodes"] = tainted_by(cluster["nodes"], p)
        return p, (raw if p.status_patch is None else with_status(raw, p))

    return rtj_raw(RUNNING, **spec), names, late, early, step


def test_two_nodes_lost_together_are_both_replaced_not_the_whole_world() -> None:
    """Two machines die at one instant: one node is judged lost first while the other's pod
    is only silent. The first verdict waits for the second (the silent pod may be on such a
    node); then both nodes are quarantined, both pods replaced and the third pod restarted
    in place (spec.recovery.inPlaceMaxReplacedPods: 2)."""
    spec = {**IN_PLACE, "replicas": 3,
            "recovery": {"inPlace": True, "inPlaceMaxReplacedPods": 2}}  # fmt: skip
    raw, names, late, early, step = _two_lost(spec)
    # 2 s after: the early node is judged lost and quarantined, then its verdict waits
    _, raw = step(raw, 2)
    assert [q["node"] for q in raw["status"]["quarantinedNodes"]] == [early]
    held, raw = step(raw, 2.5)
    assert held.status_patch is None and "inPlace" not in raw["status"], held.summary
    assert not [a for a in held.actions if isinstance(a, (rc.DeleteJobSet, rc.DeletePod))]
    assert f"{names[1]} silent after NodeLost; waiting up to 24 s" in held.summary
    # 12 s after: the late node's verdict; in one plan it is quarantined and both pods are
    # to be replaced: the one on the early node (tainted by now) is deleted at once, the
    # one on the late node once its taint holds
    begun, raw = step(raw, 12)
    assert [q["node"] for q in raw["status"]["quarantinedNodes"]] == [early, late]
    state = raw["status"]["inPlace"]
    assert (state["phase"], sorted(state["replacing"])) == ("Stopping", names[1:]), state
    entry = raw["status"]["attempts"][0]["inPlaceRestarts"][0]
    assert entry["failureClass"] == "NodeLost"
    assert sorted(entry["replaced"]) == [f"{names[1]} on {late}", f"{names[2]} on {early}"]
    assert [a.name for a in begun.actions if isinstance(a, rc.DeletePod)] == [names[2]]
    assert not [a for a in begun.actions if isinstance(a, rc.DeleteJobSet)]
    assert raw["status"]["attempt"] == 1
    tainted, raw = step(raw, 12.5)
    assert names[1] in [a.name for a in tainted.actions if isinstance(a, rc.DeletePod)]
    assert not [a for a in tainted.actions if isinstance(a, rc.DeleteJobSet)]


def test_a_second_silent_pod_past_the_wait_or_the_limit_recreates_the_whole_world() -> None:
    # the default limit (one pod replaced): two lost nodes are the whole world's to redo
    raw, _, late, early, step = _two_lost({**IN_PLACE, "replicas": 3})
    _, raw = step(raw, 2)
    _, raw = step(raw, 2.5)
    over, raw = step(raw, 12)
    assert [q["node"] for q in raw["status"]["quarantinedNodes"]] == [early, late]
    assert raw["status"]["phase"] == "Restarting", over.summary
    assert "inPlaceMaxReplacedPods is 1" in over.summary
    # no second verdict within 24 s of the first node's last renewal (10 s before the
    # death): the silent pod is not on a lost node after all (its kubelet renews), and the
    # first verdict goes by the whole world
    spec = {**IN_PLACE, "replicas": 3,
            "recovery": {"inPlace": True, "inPlaceMaxReplacedPods": 2}}  # fmt: skip
    raw, _, _, early, step = _two_lost(spec)
    _, raw = step(raw, 2, late_renews=True)
    waited, raw = step(raw, 13.5, late_renews=True)
    assert "waiting up to 24 s" in waited.summary and "inPlace" not in raw["status"]
    late_plan, raw = step(raw, 14.5, late_renews=True)
    assert raw["status"]["phase"] == "Restarting", late_plan.summary
    assert [q["node"] for q in raw["status"]["quarantinedNodes"]] == [early]


def test_two_gpu_faults_at_once_quarantine_both_nodes() -> None:
    """Two ranks exit together, each over an XID on its own node: both nodes are
    quarantined (not only the first exit's, which would restart the second rank in place on
    its faulty GPU), then both pods are replaced within the limit, else the whole world."""
    pods = replaceable_pods(3)
    names = [p["metadata"]["name"] for p in pods]
    bad = [pods[i]["spec"]["nodeName"] for i in (1, 2)]
    nodes = {**nodes_for(pods), **{n: node(n, xid=XID) for n in bad}}
    exited = supervisors({names[0]: (0, "running", None), names[1]: (0, "exited", 1),
                          names[2]: (0, "exited", 1)})  # fmt: skip
    for limit, replaced in ((2, True), (1, False)):
        spec = {**IN_PLACE, "replicas": 3,
                "recovery": {"inPlace": True, "inPlaceMaxReplacedPods": limit}}  # fmt: skip
        raw = rtj_raw(RUNNING, **spec)
        second = plan(raw, pods, exited, nodes=nodes)  # one plan: quarantine and recovery
        raw = with_status(raw, second)
        assert sorted(q["node"] for q in raw["status"]["quarantinedNodes"]) == sorted(bad)
        if replaced:
            assert sorted(raw["status"]["inPlace"]["replacing"]) == names[1:], second.summary
            entry = raw["status"]["attempts"][0]["inPlaceRestarts"][0]
            assert entry["failureClass"] == "GPUFault" and len(entry["replaced"]) == 2
        else:
            assert raw["status"]["phase"] == "Restarting", second.summary
            assert "inPlaceMaxReplacedPods is 1" in second.summary


def _evicted(pod: dict[str, Any]) -> dict[str, Any]:
    """`pod` as the Eviction API leaves it: deleting, with the DisruptionTarget condition the
    API server adds (kubernetes pkg/registry/core/pod/storage/eviction.go, v1.26+: reason
    EvictionByEvictionAPI, message "Eviction API: evicting"; seen from a real API server in
    tests/integration/cluster/test_cluster_faults.py)."""
    out = copy.deepcopy(pod)
    out["metadata"]["deletionTimestamp"] = "2025-03-14T12:00:00Z"
    out["status"].setdefault("conditions", []).append({
        "type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
        "message": "Eviction API: evicting", "lastTransitionTime": "2025-03-14T11:59:59Z",
    })  # fmt: skip
    return out


def test_an_evicted_pod_is_replaced_and_the_others_restart_in_place() -> None:
    """A node drain evicts one pod of the world: that pod is replaced (no node quarantined:
    the drain cordons its node itself), the other restarts in place in the same attempt,
    whether the evicted pod is still terminating or already gone when the operator looks."""
    pods = replaceable_pods()
    names = [p["metadata"]["name"] for p in pods]
    running = supervisors({names[0]: (0, "running", None), names[1]: (0, "running", None)})
    for world, gone in (([pods[0], _evicted(pods[1])], []), ([pods[0]], [_evicted(pods[1])])):
        raw = rtj_raw(RUNNING, **IN_PLACE)
        first = plan(raw, world, running, gone=gone)
        raw = with_status(raw, first)
        state = raw["status"].get("inPlace")
        assert state is not None, first.summary
        assert (state["phase"], state["replacing"]) == ("Stopping", [names[1]])
        entry = raw["status"]["attempts"][0]["inPlaceRestarts"][0]
        assert entry["failureClass"] == "Evicted", entry
        assert entry["replaced"] == [f"{names[1]} on {pods[1]['spec']['nodeName']}"]
        assert "quarantinedNodes" not in raw["status"] or not raw["status"]["quarantinedNodes"]
        assert not [a for a in first.actions if isinstance(a, rc.DeleteJobSet)]
        # already being deleted: not deleted again (its trainer ends with the world's stop)
        assert not [a for a in first.actions if isinstance(a, rc.DeletePod)]
        assert raw["status"]["attempt"] == 1
        # every rank is alive to join the emergency save the evicted trainer's SIGTERM began:
        # the survivor's stop gives it the save's deadline (half the in-place one at most)
        stop = rc.restart_order(snapshot(raw, pods=world), target(pods[0], raw))
        assert stop is not None and (stop.action, stop.save_seconds) == ("stop", 30), stop
        # the evicted pod, still terminating or gone, is no second failure: the barrier holds
        stopped = supervisors({names[0]: (1, "stopped", None)})
        held = plan(raw, world, stopped, gone=gone)
        assert not [a for a in held.actions if isinstance(a, rc.DeleteJobSet)], held.summary
        assert "in place: replacing" in held.summary
        if held.status_patch is not None:  # its one write: the old world's trainers all gone
            assert not gone or [pods[0]] == world  # only once the evicted pod has ended
            assert held.status_patch.status["recoveries"][0]["stoppedAt"], held.status_patch
            raw = with_status(raw, held)
        assert plan(raw, world, stopped, gone=gone).status_patch is None  # then it holds
        # gone, and its Job's new pod (same index, another node) stopped for generation 1
        # beside the survivor: pinned, Starting, still attempt 1
        new = copy.deepcopy(pods[1])
        new["metadata"]["name"] = names[1].replace("abcde", "fghij")
        new["metadata"]["annotations"][keys.JOB_INDEX_FAILURE_COUNT] = "1"
        new["spec"]["nodeName"] = "gpu-node-009"
        fresh = new["metadata"]["name"]
        both = supervisors({names[0]: (1, "stopped", None), fresh: (1, "stopped", None)})
        starting = plan(raw, [pods[0], new], both, gone=[_evicted(pods[1])],
                        store=reading(1200, NOW))  # fmt: skip
        raw = with_status(raw, starting)
        assert (raw["status"]["inPlace"]["phase"], raw["status"]["inPlace"]["step"]) == (
            "Starting", 1200,
        )  # fmt: skip
        assert raw["status"]["attempt"] == 1


def test_an_eviction_goes_whole_world_when_in_place_cannot_cover_it() -> None:
    pods = replaceable_pods(3)
    names = [p["metadata"]["name"] for p in pods]
    job = make_job(**{**IN_PLACE, "replicas": 3})
    reports = {n: {"generation": 0, "state": "running"} for n in names}
    found = Classification(FailureClass.EVICTED, None, (), ("evicted",))
    one = [pods[0], _evicted(pods[1]), pods[2]]
    assert in_place.choose(job, found, one, reports) == in_place.InPlaceChoice(None, (names[1],))
    assert in_place.choose(job, found, [pods[0], pods[2]], reports, gone=[_evicted(pods[1])]) == (
        in_place.InPlaceChoice(None, (names[1],))
    )
    # a drain of two pods' nodes with a limit of one; replacement off; an old pod
    two = [pods[0], _evicted(pods[1]), _evicted(pods[2])]
    assert "it evicts 2 pods; spec.recovery.inPlaceMaxReplacedPods is 1" in (
        in_place.choose(job, found, two, reports).refused or ""
    )
    off = make_job(**{**IN_PLACE, "replicas": 3,
                      "recovery": {"inPlace": True, "inPlaceMaxReplacedPods": 0}})  # fmt: skip
    assert "inPlaceMaxReplacedPods is 0" in (in_place.choose(off, found, one, reports).refused
                                              or "")  # fmt: skip
    old = copy.deepcopy(one)
    del old[1]["metadata"]["annotations"][keys.JOB_INDEX_FAILURE_COUNT]
    assert "cannot be replaced by its Job" in (in_place.choose(job, found, old, reports).refused
                                               or "")  # fmt: skip
    # marked for eviction, not yet deleted (the API server adds the condition first)
    marked = copy.deepcopy(one)
    del marked[1]["metadata"]["deletionTimestamp"]
    assert in_place.choose(job, found, marked, reports).refused is None
    # the evidence names an eviction but no pod of the world is going: nothing to replace
    assert "no evicted pod" in (in_place.choose(job, found, pods, reports).refused or "")
    # the Job already made the evicted index's pod again: not the world the restart knows
    again = copy.deepcopy(pods[1])
    again["metadata"]["name"] = names[1] + "-new"
    assert "4 of 3 pods are there" in (
        in_place.choose(job, found, [*one, again], reports).refused or ""
    )
    # a kubelet's eviction for the pod's own limit is the user's: never in place
    user = Classification(FailureClass.USER_ERROR, None, (), ("evicted for its own limit",))
    assert "needs more than a restart" in (in_place.choose(job, user, one, reports).refused
                                           or "")  # fmt: skip
