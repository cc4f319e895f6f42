"""Node liveness (issue 12): a silent node is judged lost from its Lease within seconds, a
Ready flicker causes nothing, a partition holds everything, a silent node is fenced."""

from __future__ import annotations

import copy
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

from rtj_test_support import NOW
from rtj_world import iso, jobset, node, nodes_for, pod, rtj_raw, snapshot, with_status

from rtj_operator import reconcile as rc
from rtj_operator.policy.liveness import (
    Liveness,
    NodeLease,
    classifier_view,
    judge_node,
    lease_of,
    partitioned,
)
from rtj_operator.reconcile.liveness import fenced_nodes, pods_quiet_by_node

RUNNING = {"phase": "Running", "attempt": 1, "attempts": [{"attempt": 1, "jobSet": "llm-a1"}]}


def fresh(seconds_ago: float = 1, duration: int = 40) -> NodeLease:
    return NodeLease(NOW - timedelta(seconds=seconds_ago), duration)


def flickering(name: str, seconds: float) -> dict[str, Any]:
    """Ready=False since `seconds` ago, as the kubelet posts it (KubeletNotReady)."""
    body = node(name, ready=False)
    body["status"]["conditions"][0]["lastTransitionTime"] = iso(NOW - timedelta(seconds=seconds))
    body["status"]["conditions"][0]["reason"] = "KubeletNotReady"
    return body


def test_a_lease_not_renewed_for_two_intervals_means_a_silent_node() -> None:
    up = node("n1")
    assert judge_node(up, fresh(19), NOW).liveness is Liveness.ALIVE  # kubelet: every 10 s
    gone = judge_node(up, fresh(21), NOW)
    assert gone.liveness is Liveness.SILENT and gone.since == NOW - timedelta(seconds=1)
    # KWOK and short leases: 20 s lease, renewed every 5 s -> silent after 10 s
    assert judge_node(up, fresh(11, duration=20), NOW).liveness is Liveness.SILENT
    assert judge_node(up, fresh(9, duration=20), NOW).liveness is Liveness.ALIVE
    # overdue (the next renewal late) long before silent
    assert fresh(11.5).overdue(NOW) and not fresh(10.5).overdue(NOW)
    # no lease seen: only the control plane's word counts
    assert judge_node(up, None, NOW).liveness is Liveness.ALIVE


def test_pods_gone_quiet_with_an_overdue_lease_make_a_node_silent_sooner() -> None:
    """A machine that dies stops its kubelet's renewals and its pods' answers at once: with
    both, the node is silent when the Lease is overdue (11 s), not two intervals (20 s)."""
    up = node("n1")
    quiet = NOW - timedelta(seconds=9)  # the first unanswered poll, after the last renewal
    early = judge_node(up, fresh(12), NOW, quiet)
    assert early.liveness is Liveness.SILENT and early.since == NOW - timedelta(seconds=1)
    # the Lease on time: the pods alone are no verdict (a stalled progress server)
    on_time = judge_node(up, fresh(9), NOW, NOW - timedelta(seconds=8))
    assert on_time.liveness is Liveness.ALIVE
    assert on_time.recheck_at == NOW + timedelta(seconds=2), "looked at again when overdue"
    # the Lease overdue but the pods answer: a restarting kubelet, silent only at 20 s
    assert judge_node(up, fresh(12), NOW).liveness is Liveness.ALIVE
    # pods quiet since long before the last renewal: two unrelated troubles, Lease alone
    assert judge_node(up, fresh(12), NOW, NOW - timedelta(seconds=60)).liveness is Liveness.ALIVE
    assert judge_node(up, fresh(21), NOW, NOW - timedelta(seconds=60)).liveness is Liveness.SILENT
    # the message says both signals
    lease = fresh(12)
    view = classifier_view(up, early, lease)
    (ready,) = [c for c in view["status"]["conditions"] if c["type"] == "Ready"]
    assert ready["reason"] == "NodeLeaseExpired" and "pods on it answers" in ready["message"]


def test_a_short_ready_flicker_with_a_renewed_lease_is_ignored_then_counts() -> None:
    assert judge_node(flickering("n1", 3), fresh(), NOW).liveness is Liveness.FLICKER
    assert judge_node(flickering("n1", 3), fresh(), NOW).recheck_at == NOW + timedelta(seconds=7)
    assert judge_node(flickering("n1", 12), fresh(), NOW).liveness is Liveness.LOST
    assert judge_node(flickering("n1", 3), None, NOW).liveness is Liveness.LOST, "no lease"


def unknown_since(name: str, seconds: float) -> dict[str, Any]:
    """Ready=Unknown since `seconds` ago, as the node lifecycle controller writes it when
    the kubelet's heartbeats stop (reason NodeStatusUnknown, "Kubelet stopped posting node
    status."; kubernetes v1.35 pkg/controller/nodelifecycle/node_lifecycle_controller.go)."""
    body = node(name, ready=False)
    ready = body["status"]["conditions"][0]
    ready.update(status="Unknown", reason="NodeStatusUnknown",
                 message="Kubelet stopped posting node status.",
                 lastTransitionTime=iso(NOW - timedelta(seconds=seconds)))  # fmt: skip
    return body


def test_a_kubelet_back_from_a_partition_is_not_lost_before_it_posts_its_status() -> None:
    """Found by the partition drill: contact returns, the kubelet renews its Lease, and for
    a moment the controller's Unknown from the partition is still on the Node."""
    back = judge_node(unknown_since("n1", 15), fresh(0.5), NOW)
    assert back.liveness is Liveness.FLICKER and back.recheck_at is not None
    view = classifier_view(unknown_since("n1", 15), back, fresh(0.5))
    (ready,) = [c for c in view["status"]["conditions"] if c["type"] == "Ready"]
    assert ready["status"] == "True", "the classifier does not read the stale Unknown"
    # no renewal since the controller's verdict: lost (and silent, by the Lease)
    assert judge_node(unknown_since("n1", 15), fresh(25), NOW).liveness is Liveness.SILENT
    # the kubelet's own NotReady (status False) after the window is a loss, renewed or not
    assert judge_node(flickering("n1", 15), fresh(0.5), NOW).liveness is Liveness.LOST
    pods = [pod(1, i) for i in range(2)]
    nodes = {**nodes_for(pods), "gpu-node-001": unknown_since("gpu-node-001", 15)}
    leases = {n: fresh(0.5) for n in nodes}
    snap = replace(snapshot(rtj_raw(RUNNING), jobsets=[jobset(1)], pods=pods, nodes=nodes),
                   node_leases=leases)  # fmt: skip
    plan = rc.plan(snap)
    assert plan.status_patch is None and not plan.actions, plan.summary


def test_most_nodes_overdue_at_once_is_a_partition() -> None:
    assert partitioned(3, 4) and partitioned(50, 100)
    assert not partitioned(1, 4) and not partitioned(2, 2) and not partitioned(40, 100)


def test_the_classifier_reads_a_silent_node_as_unknown_since_its_last_renewal() -> None:
    lease = fresh(25)
    view = classifier_view(node("n1"), judge_node(node("n1"), lease, NOW), lease)
    (ready,) = [c for c in view["status"]["conditions"] if c["type"] == "Ready"]
    assert (ready["status"], ready["reason"]) == ("Unknown", "NodeLeaseExpired")
    assert ready["lastHeartbeatTime"] == iso(NOW - timedelta(seconds=25))
    assert node("n1")["status"]["conditions"][0]["status"] == "True", "input untouched"


def test_a_node_read_as_it_is_is_the_input_itself_and_no_view_edits_its_input() -> None:
    """At 1,000+ nodes a copy per node per plan cost the operator ~0.1 s a plan: a view
    that changes nothing is the node object itself; one that changes it is a new object."""
    up = node("n1")
    assert classifier_view(up, judge_node(up, fresh(1), NOW), fresh(1)) is up
    assert classifier_view(up, judge_node(up, None, NOW), None) is up
    tainted = node("n1", taints=[{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute",
                                  "timeAdded": iso(NOW - timedelta(seconds=30))}])  # fmt: skip
    before = copy.deepcopy(tainted)
    alive = classifier_view(tainted, judge_node(tainted, fresh(1), NOW), fresh(1))
    assert alive is not tainted and alive["spec"]["taints"] == [] and tainted == before
    silent = classifier_view(tainted, judge_node(tainted, fresh(25), NOW), fresh(25))
    assert silent["status"]["conditions"][-1]["reason"] == "NodeLeaseExpired"
    assert tainted == before, "the watch cache's object is never edited"


def test_a_kubelets_lease_reads_as_what_it_says() -> None:
    # coordination.k8s.io/v1 Lease as the kubelet writes it (pkg/kubelet/nodelease, v1.35):
    # holderIdentity the node name, leaseDurationSeconds 40, renewTime in MicroTime format
    body = {"metadata": {"name": "gpu-node-007", "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": "gpu-node-007", "leaseDurationSeconds": 40,
                     "renewTime": "2025-03-14T11:59:50.123456Z"}}  # fmt: skip
    name, lease = lease_of(body) or ("", None)
    assert name == "gpu-node-007" and lease is not None
    assert lease.duration_seconds == 40 and lease.silent_after == timedelta(seconds=20)
    assert lease_of({"metadata": {"name": "x"}, "spec": {}}) is None


def _plan(pods: list[dict[str, Any]], **extra: Any) -> rc.Plan:
    raw = extra.pop("raw", rtj_raw(RUNNING))
    snap = snapshot(raw, jobsets=[jobset(1)], pods=pods, nodes=nodes_for(pods))
    return rc.plan(replace(snap, **extra))


def test_a_silent_node_restarts_the_group_at_once_naming_its_rank() -> None:
    pods = [pod(1, i) for i in range(4)]
    leases = {p["spec"]["nodeName"]: fresh() for p in pods}
    assert not _plan(pods, node_leases=leases).actions, "all alive: nothing to do"
    leases["gpu-node-002"] = fresh(21)  # its kubelet has not renewed for 21 s
    quarantine = _plan(pods, node_leases=leases)
    raw = with_status(rtj_raw(RUNNING), quarantine)
    assert [q["node"] for q in raw["status"]["quarantinedNodes"]] == ["gpu-node-002"]
    assert "NodeLeaseExpired" in raw["status"]["quarantinedNodes"][0]["evidence"]
    restart = _plan(pods, raw=raw, node_leases=leases)
    patch = restart.status_patch
    assert patch is not None and patch.status["phase"] == "Restarting"
    record = patch.status["attempts"][0]
    assert record["failureClass"] == "NodeLost"
    assert record["firstFailed"]["node"] == "gpu-node-002"
    # detected from the lease: the failure dates from the last renewal, 21 s ago
    assert record["detectionSeconds"] == 21.0


def test_a_node_whose_pods_went_quiet_with_its_lease_is_lost_at_the_overdue_instant() -> None:
    pods = [pod(1, i) for i in range(2)]
    lost = pods[1]["spec"]["nodeName"]
    leases = {p["spec"]["nodeName"]: fresh() for p in pods}
    leases[lost] = fresh(12)  # overdue by 1 s
    quiet = rc.RankReadings(
        attempt=1, reports=(), polled_at=NOW.timestamp(),
        quiet_since={pods[1]["metadata"]["name"]: (NOW - timedelta(seconds=8)).timestamp()},
    )  # fmt: skip
    assert not _plan(pods, node_leases=leases).actions, "the Lease alone: not yet"
    quarantine = _plan(pods, node_leases=leases, ranks=quiet)
    raw = with_status(rtj_raw(RUNNING), quarantine)
    assert [q["node"] for q in raw["status"]["quarantinedNodes"]] == [lost]
    restart = _plan(pods, raw=raw, node_leases=leases, ranks=quiet)
    assert restart.status_patch is not None
    record = restart.status_patch.status["attempts"][0]
    assert (record["failureClass"], record["firstFailed"]["node"]) == ("NodeLost", lost)
    assert any("answers the progress poll" in line for line in record["evidence"]), record
    # a quiet pod of another attempt's readings proves nothing
    stale = replace(quiet, attempt=2)
    assert not _plan(pods, node_leases=leases, ranks=stale).actions


def test_a_node_recorded_lost_is_fenced_from_the_record_while_its_lease_stays_stale() -> None:
    """Once the attempt ended, nobody polls its pods: the record of the node's loss (written
    from both signals) dates the fence, as long as the kubelet has not renewed since."""
    ended = NOW - timedelta(seconds=11)
    record = {"attempt": 1, "jobSet": "llm-a1", "endedAt": iso(ended), "failureClass": "NodeLost",
              "failureCategory": "infrastructure",
              "firstFailed": {"pod": "llm-a1-worker-0-1", "node": "gpu-node-001"}}  # fmt: skip
    raw = rtj_raw({**RUNNING, "phase": "Restarting", "attempts": [record]})
    pods = [pod(1, 0, deleting=True), pod(1, 1, deleting=True)]
    snap = snapshot(raw, jobsets=[], pods=pods, nodes=nodes_for(pods))
    leases = {"gpu-node-000": fresh(), "gpu-node-001": fresh(19)}  # overdue, not yet silent

    def deleted(leases: dict[str, NodeLease], at: Any = NOW) -> list[tuple[str, int | None]]:
        plan = rc.plan(replace(snap, node_leases=leases, now=at))
        return [(a.name, a.grace_seconds) for a in plan.actions if isinstance(a, rc.DeletePod)]

    assert deleted(leases) == [(pods[1]["metadata"]["name"], 0)]
    assert deleted(leases, NOW - timedelta(seconds=2)) == [], "recorded 9 s ago: not yet"
    leases["gpu-node-001"] = fresh(5)  # renewed since the record: alive after all
    assert deleted(leases) == []


def test_a_node_lost_under_a_restart_in_place_is_fenced_from_its_verdict() -> None:
    """A restart in place that replaced a lost node's pod dates the fence from its verdict
    (`detectedAt`), as an attempt's record does: the barrier waited for the node's Lease
    silence to be judged first, 9 s later in the soak, and then 10 s more."""
    replaced = pod(1, 1, deleting=True)
    name = replaced["metadata"]["name"]

    def fenced(detected_ago: float, lease: NodeLease) -> frozenset[str]:
        entry = {"generation": 1, "failureClass": "NodeLost", "failureCategory": "infrastructure",
                 "detectedAt": iso(NOW - timedelta(seconds=detected_ago)),
                 "replaced": [f"{name} on gpu-node-001"]}  # fmt: skip
        record = {"attempt": 1, "jobSet": "llm-a1", "inPlaceRestarts": [entry]}
        raw = rtj_raw({**RUNNING, "attempts": [record]})
        pods = [pod(1, 0), replaced]
        snap = snapshot(raw, jobsets=[jobset(1)], pods=pods, nodes=nodes_for(pods))
        leases = {"gpu-node-000": fresh(), "gpu-node-001": lease}
        return fenced_nodes(replace(snap, node_leases=leases))

    assert fenced(11, fresh(19)) == {"gpu-node-001"}, "overdue, the verdict 11 s old"
    assert fenced(9, fresh(19)) == frozenset(), "the verdict 9 s old: not yet"
    assert fenced(11, fresh(5)) == frozenset(), "renewed since: alive after all"
    # the Lease's silence judged since (after the verdict): the verdict still dates it
    assert fenced(11, fresh(21)) == {"gpu-node-001"}, "silent for 1 s, the verdict 11 s"


def test_a_ready_flicker_causes_no_restart_and_no_taint() -> None:
    pods = [pod(1, i) for i in range(2)]
    flicker = flickering("gpu-node-001", 3)
    # the node lifecycle controller taints it within a second (the e2e drill caught this)
    flicker["spec"]["taints"] = [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule",
                                  "timeAdded": iso(NOW - timedelta(seconds=2))}]  # fmt: skip
    nodes = {**nodes_for(pods), "gpu-node-001": flicker}
    leases = {n: fresh() for n in nodes}
    snap = replace(snapshot(rtj_raw(RUNNING), jobsets=[jobset(1)], pods=pods, nodes=nodes),
                   node_leases=leases)  # fmt: skip
    plan = rc.plan(snap)
    assert plan.status_patch is None and not plan.actions
    assert plan.requeue_after is not None and plan.requeue_after <= 7.5
    # without the lease (no proof the kubelet is alive) the same condition is a loss
    assert rc.plan(replace(snap, node_leases={})).status_patch is not None


def test_a_partition_holds_everything_and_says_why_until_contact_returns() -> None:
    pods = [pod(1, i) for i in range(4)]
    silent = {p["spec"]["nodeName"]: fresh(30) for p in pods}
    plan = _plan(pods, node_leases=silent, partition=True)
    patch = plan.status_patch
    assert patch is not None and patch.status["phase"] == "Running"
    held = next(c for c in patch.status["conditions"] if c["type"] == "NodesUnreachable")
    assert held["status"] == "True" and "holding" in held["message"]
    assert not [a for a in plan.actions if isinstance(a, (rc.TaintNode, rc.DeleteJobSet))]
    # contact returns: the condition clears, nothing else happened
    raw = rtj_raw({**RUNNING, "conditions": patch.status["conditions"]})
    back = _plan(pods, raw=raw, node_leases={n: fresh() for n in silent})
    assert back.status_patch is not None
    cleared = next(c for c in back.status_patch.status["conditions"]
                   if c["type"] == "NodesUnreachable")  # fmt: skip
    assert cleared["status"] == "False"


def test_pods_on_a_node_silent_past_the_fence_window_are_force_deleted() -> None:
    raw = rtj_raw({**RUNNING, "phase": "Restarting"})
    pods = [pod(1, 0, deleting=True), pod(1, 1, deleting=True)]
    nodes = nodes_for(pods)
    snap = snapshot(raw, jobsets=[], pods=pods, nodes=nodes)
    leases = {"gpu-node-000": fresh(), "gpu-node-001": fresh(21)}  # silent for 1 s: not yet
    assert not [a for a in rc.plan(replace(snap, node_leases=leases)).actions
                if isinstance(a, rc.DeletePod)]  # fmt: skip
    leases["gpu-node-001"] = fresh(31)  # silent for 11 s: fenced
    deletes = [a for a in rc.plan(replace(snap, node_leases=leases)).actions
               if isinstance(a, rc.DeletePod)]  # fmt: skip
    assert [(d.name, d.grace_seconds) for d in deletes] == [(pods[1]["metadata"]["name"], 0)]
    # never during a partition
    fenced = rc.plan(replace(snap, node_leases=leases, partition=True))
    assert not [a for a in fenced.actions if isinstance(a, rc.DeletePod)]


def test_the_lease_watcher_wakes_the_jobs_of_a_node_that_goes_silent_and_spots_a_partition() -> (
    None
):
    from rtj_operator.node_leases import NodeLeases

    clock = [NOW]
    touched: list[str] = []
    everyone: list[bool] = []
    leases = NodeLeases(touched.append, lambda: everyone.append(True), lambda: clock[0])

    def renew(name: str, at: Any) -> None:
        spec = {"leaseDurationSeconds": 40, "renewTime": iso(at)}
        leases.apply("MODIFIED", {"metadata": {"name": name}, "spec": spec})

    for i in range(4):
        renew(f"n{i}", NOW)
    leases.scan()
    assert touched == [] and not leases.partition
    clock[0] = NOW + timedelta(seconds=21)  # n0 stops renewing; the others go on
    for i in (1, 2, 3):
        renew(f"n{i}", clock[0])
    leases.scan()
    assert touched == ["n0"] and leases.silent == {"n0"} and not leases.partition
    assert set(leases.of(["n0", "n9"])) == {"n0"}
    clock[0] = NOW + timedelta(seconds=40)  # nobody renews: contact is lost, not the fleet
    leases.scan()
    assert leases.partition and everyone == [True]
    for i in range(4):
        renew(f"n{i}", clock[0])
    leases.scan()
    assert not leases.partition and not leases.silent and everyone == [True, True]


def test_a_partition_shows_before_the_first_node_turns_silent() -> None:
    """Contact is lost at T; the nodes' last renewals are spread over one interval (10 s).
    Whenever the first node turns silent, the partition is already known."""
    from rtj_operator.node_leases import NodeLeases

    clock = [NOW]
    first_silent_seen_with: list[bool] = []
    leases = NodeLeases(lambda name: first_silent_seen_with.append(leases.partition),
                        lambda: None, lambda: clock[0])  # fmt: skip
    for i in range(8):
        spec = {"leaseDurationSeconds": 40, "renewTime": iso(NOW - timedelta(seconds=i * 1.25))}
        leases.apply("MODIFIED", {"metadata": {"name": f"n{i}"}, "spec": spec})
    for tick in range(1, 40):  # scanned every second after T
        clock[0] = NOW + timedelta(seconds=tick)
        leases.scan()
    assert first_silent_seen_with and all(first_silent_seen_with), first_silent_seen_with


def test_a_partition_the_watch_shows_is_declared_only_once_a_fresh_list_agrees() -> None:
    """A watch that stopped delivering looks exactly like a partition: a fresh LIST says
    which it is. Renewals in the LIST: the watch is behind, no partition (and a late event
    from it moves no renewal back). The LIST as stale as the watch: a partition."""
    from rtj_operator.node_leases import NodeLeases

    clock = [NOW]
    leases = NodeLeases(lambda name: None, lambda: None, lambda: clock[0])

    def bodies(at: Any) -> list[dict[str, Any]]:
        spec = {"leaseDurationSeconds": 40, "renewTime": iso(at)}
        return [{"metadata": {"name": f"n{i}"}, "spec": spec} for i in range(4)]

    leases.refresh(bodies(NOW))
    assert not leases.confirm_due()
    clock[0] = NOW + timedelta(seconds=12)  # one interval (10 s) and the slack past: overdue
    assert leases.looks_partitioned() and leases.confirm_due()
    leases.confirmed(bodies(clock[0]))  # the kubelets renewed: the watch is behind
    leases.scan()
    assert not leases.partition and leases.confirmations == 1 and not leases.confirm_due()
    leases.apply("MODIFIED", bodies(NOW)[0])  # the stale watch delivers at last
    assert leases.of(["n0"])["n0"].renewed_at == clock[0]

    clock[0] = NOW + timedelta(seconds=30)  # now contact is lost for real
    assert leases.confirm_due()
    leases.confirmed(bodies(NOW + timedelta(seconds=12)))  # the LIST agrees
    leases.scan()
    assert leases.partition and leases.confirmations == 1
    clock[0] = NOW + timedelta(seconds=32)
    assert not leases.confirm_due(), "one confirming LIST per 5 s while it holds"


def test_leases_of_nodes_that_no_longer_exist_never_make_a_partition() -> None:
    """A Lease its Node outlived (the node deleted, a Lease nobody owns) is no kubelet the
    control plane lost: three such Leases beside two live nodes are not "most nodes"."""
    from rtj_operator.node_leases import NodeLeases

    clock = [NOW]
    nodes = {"live-0", "live-1"}
    leases = NodeLeases(
        lambda n: None, lambda: None, lambda: clock[0], node_exists=nodes.__contains__
    )
    for name in ("live-0", "live-1", "gone-0", "gone-1", "gone-2"):
        spec = {"leaseDurationSeconds": 20, "renewTime": iso(NOW)}
        leases.apply("MODIFIED", {"metadata": {"name": name}, "spec": spec})
    clock[0] = NOW + timedelta(seconds=60)
    for name in ("live-0", "live-1"):
        spec = {"leaseDurationSeconds": 20, "renewTime": iso(clock[0])}
        leases.apply("MODIFIED", {"metadata": {"name": name}, "spec": spec})
    leases.scan()
    assert not leases.partition
    everything = NodeLeases(lambda n: None, lambda: None, lambda: clock[0])
    for name, at in (("live-0", clock[0]), ("live-1", clock[0]), ("gone-0", NOW),
                     ("gone-1", NOW), ("gone-2", NOW)):  # fmt: skip
        spec = {"leaseDurationSeconds": 20, "renewTime": iso(at)}
        everything.apply("MODIFIED", {"metadata": {"name": name}, "spec": spec})
    everything.scan()
    assert everything.partition, "counting them all, it would have held every job"


def test_a_failed_attempts_node_whose_pods_went_quiet_is_fenced_before_its_lease_says() -> None:
    """The attempt failed for another reason (the surviving rank saw its peer's socket close):
    its pods are still read while it is torn down, so the dead node's pods, quiet with the
    Lease overdue, are force-deleted without waiting for the Lease alone."""
    raw = rtj_raw({**RUNNING, "phase": "Restarting"})
    pods = [pod(1, 0, deleting=True), pod(1, 1, deleting=True)]
    snap = snapshot(raw, jobsets=[], pods=pods, nodes=nodes_for(pods))
    leases = {"gpu-node-000": fresh(), "gpu-node-001": fresh(22)}  # overdue 11 s ago
    quiet = rc.RankReadings(
        attempt=1, reports=(), polled_at=NOW.timestamp(),
        quiet_since={pods[1]["metadata"]["name"]: (NOW - timedelta(seconds=20)).timestamp()},
    )  # fmt: skip

    def deleted(ranks: rc.RankReadings | None) -> list[str]:
        plan = rc.plan(replace(snap, node_leases=leases, ranks=ranks))
        return [a.name for a in plan.actions if isinstance(a, rc.DeletePod)]

    assert deleted(quiet) == [pods[1]["metadata"]["name"]]
    assert deleted(None) == [], "the Lease alone: silent 2 s ago, fenced only at 10 s"


def test_quiet_pods_are_read_per_node_in_one_pass() -> None:
    """Each node's quiet time from its own running pods of this attempt: all quiet (the
    latest), one answering (None), or no reading for the attempt at all (empty)."""
    pods = [pod(1, i, node=f"n{i // 2}") for i in range(6)]  # two pods on each of 3 nodes
    pods.append(pod(1, 6, node="n3", phase="Pending"))
    name = [p["metadata"]["name"] for p in pods]
    ago = zip(name[:3], [9, 7, 5], strict=True)
    at = {n: (NOW - timedelta(seconds=s)).timestamp() for n, s in ago}
    readings = rc.RankReadings(
        attempt=1, reports=(), polled_at=NOW.timestamp(),
        quiet_since={name[0]: at[name[0]], name[1]: at[name[1]], name[2]: at[name[2]],
                     name[6]: NOW.timestamp()},
    )  # fmt: skip
    snap = replace(snapshot(rtj_raw(RUNNING), jobsets=[jobset(1)], pods=pods,
                            nodes=nodes_for(pods)), ranks=readings)  # fmt: skip
    assert pods_quiet_by_node(snap) == {
        "n0": datetime.fromtimestamp(at[name[1]], timezone.utc),  # both quiet: the later
        "n1": None,  # one answers
        "n2": None,  # neither is quiet
    }, "a pod not running (n3) proves nothing"
    assert pods_quiet_by_node(replace(snap, ranks=replace(readings, attempt=2))) == {}
