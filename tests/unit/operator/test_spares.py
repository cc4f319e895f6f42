"""Warm spares (spec.spares, issue 15), decided without a cluster: how they are rendered and
admitted, which pod serves which rank, and a GPU fault whose pod a ready spare replaces at
once (no wait for the Job controller to create it again), the pod created again becoming a
spare, and every idle pod told to finish once the world has."""

from __future__ import annotations

import copy
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from pydantic import ValidationError
from rtj_test_support import NOW, make_job, supervisor_reports
from rtj_world import (
    jobset,
    node,
    nodes_for,
    pod,
    reading,
    rtj_raw,
    snapshot,
    tainted_by,
    with_status,
)
from test_in_place import IN_PLACE, KEY, RUNNING, plan
from test_in_place_replace import XID, replaceable_pods, supervisors

from rtj_operator import reconcile as rc
from rtj_operator.api import keys
from rtj_operator.api.spec import MODULE_PATTERN
from rtj_operator.policy import spares
from rtj_operator.policy.render import render_jobset
from rtj_operator.rank_polls import JobTargets
from rtj_operator.reconcile.in_place import restart_orders
from rtj_operator.reconcile.world import PollTarget
from rtj_shim.agent import preload

JOB_KEY = ("team-a", "llm")

SPARES = {**IN_PLACE, "spares": 1, "recovery": {"inPlace": True, "inPlaceMaxReplacedPods": 1}}


def spare_pod(index: int = 0, node_name: str = "gpu-node-005") -> dict[str, Any]:
    """A pod of the spares' replicated Job as the JobSet and Job controllers create it."""
    pod = copy.deepcopy(replaceable_pods(1)[0])
    meta = pod["metadata"]
    meta["name"] = f"llm-a1-spare-0-{index}-zzzzz"
    meta["labels"][keys.REPLICATED_JOB_LABEL] = keys.SPARE_REPLICATED_JOB
    meta["labels"][keys.JOB_COMPLETION_INDEX] = str(index)
    meta["annotations"][keys.JOB_COMPLETION_INDEX] = str(index)
    del meta["annotations"][keys.JOB_INDEX_FAILURE_COUNT]  # a plain backoffLimit Job
    meta["ownerReferences"][0].update(name="llm-a1-spare-0", uid="job-uid-llm-a1-spare-0")
    pod["spec"].update(nodeName=node_name, hostname=f"llm-a1-spare-0-{index}",
                       subdomain="llm-a1")  # fmt: skip
    pod["status"]["podIP"] = "10.0.0.9"
    return pod


def test_spares_are_rendered_as_a_second_replicated_job_held_by_their_supervisor() -> None:
    job = make_job(**SPARES)
    replicated = render_jobset(job, 1, 40, KEY)["spec"]["replicatedJobs"]
    assert [r["name"] for r in replicated] == ["worker", "spare"]
    spare = replicated[1]["template"]["spec"]
    assert (spare["parallelism"], spare["completions"], spare["completionMode"]) == (
        1, 1, "Indexed",
    )  # fmt: skip
    assert spare["backoffLimit"] == 2**31 - 1, "a failed spare is created again, never fails"
    pod = spare["template"]["spec"]
    trainer = pod["containers"][0]
    assert {"name": keys.ENV_SPARE, "value": "1"} in trainer["env"]
    assert trainer["command"][:2] == ["rtj-shim", "supervise"]
    init = [c["name"] for c in pod["initContainers"]]
    assert keys.RESUME_INIT_CONTAINER not in init and keys.PROGRESS_SIDECAR in init
    # on distinct nodes from every pod of the JobSet, workers and spares alike
    rule = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert rule[0]["labelSelector"]["matchLabels"] == {keys.JOBSET_NAME_LABEL: "llm-a1"}
    worker = replicated[0]["template"]["spec"]["template"]["spec"]["containers"][0]
    assert all(e["name"] != keys.ENV_SPARE for e in worker["env"])
    # no control key (the operator cannot order them): no spares
    assert len(render_jobset(job, 1, 40, None)["spec"]["replicatedJobs"]) == 1


def test_spares_need_in_place_restarts_that_replace_pods() -> None:
    for recovery in ({"inPlace": False}, {"inPlace": True, "inPlaceMaxReplacedPods": 0}):
        with pytest.raises(ValidationError, match=r"spec\.spares needs spec\.recovery\.inPlace"):
            make_job(**{**SPARES, "recovery": recovery})
    assert make_job(**SPARES).spec.spares == 1
    with pytest.raises(ValidationError, match="spares"):
        make_job(**{**SPARES, "spares": -1})


def test_which_pod_serves_which_rank() -> None:
    w0, w1 = replaceable_pods(2)
    spare = spare_pod()
    names = [w0["metadata"]["name"], w1["metadata"]["name"], spare["metadata"]["name"]]
    assert [spares.rank_of(p, {}) for p in (w0, w1, spare)] == [0, 1, None]
    assert spares.serving([w0, w1, spare], {}) == [w0, w1]
    # the spare took rank 1: the worker created again for index 1 is idle, a spare itself
    again = copy.deepcopy(w1)
    again["metadata"]["name"] = "llm-a1-worker-0-1-fghij"
    assigned = spares.assign({}, spare, 1)
    assert assigned == {names[2]: 1}
    assert [spares.rank_of(p, assigned) for p in (w0, again, spare)] == [0, None, 1]
    assert spares.idle([w0, again, spare], assigned) == [again]
    view = spares.as_serving(spare, assigned)
    assert view["metadata"]["annotations"][keys.JOB_COMPLETION_INDEX] == "1"
    assert spare["metadata"]["annotations"][keys.JOB_COMPLETION_INDEX] == "0", "not changed"
    # the worker given its own index back needs no entry; a rank has one holder at a time
    assert spares.assign(assigned, again, 1) == {}
    other = spare_pod(1, "gpu-node-006")
    assert spares.assign(assigned, other, 1) == {other["metadata"]["name"]: 1}
    # rank 0 on a spare moves the rendezvous host to the spare's DNS name
    assert spares.moved_master([w0, spare], assigned) is None
    assert spares.moved_master([w0, spare], {names[2]: 0}) == "10.0.0.9", "its pod IP"
    no_ip = copy.deepcopy(spare)
    del no_ip["status"]["podIP"]
    assert spares.moved_master([w0, no_ip], {names[2]: 0}) == "llm-a1-spare-0-0.llm-a1"
    only_v6 = copy.deepcopy(no_ip)
    only_v6["status"]["podIP"] = "fd00::9"
    del only_v6["spec"]["hostname"]
    assert spares.moved_master([w0, only_v6], {names[2]: 0}) == "fd00::9"


def test_a_spare_is_picked_only_ready_and_off_the_bad_nodes() -> None:
    held = {"generation": 0, "state": "stopped"}
    a, b = spare_pod(0, "gpu-node-005"), spare_pod(1, "gpu-node-006")
    na, nb = a["metadata"]["name"], b["metadata"]["name"]
    reports = supervisor_reports({na: held, nb: held})
    assert spares.pick([b, a], reports, {"victim": 1}, ()) == {na: 1}
    assert spares.pick([a, b], reports, {"victim": 1}, {"gpu-node-005"}) == {nb: 1}
    assert spares.pick([a, b], reports, {"v1": 1, "v2": 3}, ()) == {na: 1, nb: 3}
    assert spares.pick([a], reports, {"v1": 1, "v2": 3}, ()) is None, "not enough: none"
    running = supervisor_reports({na: {"generation": 0, "state": "running"}})
    assert spares.pick([a], running, {"victim": 1}, ()) is None
    assert spares.pick([a], {}, {"victim": 1}, ()) is None, "never reported"
    going = copy.deepcopy(a)
    going["metadata"]["deletionTimestamp"] = "2025-03-14T12:00:30Z"
    assert spares.pick([going], reports, {"victim": 1}, ()) is None
    same_node = spare_pod(1, "gpu-node-005")
    both = {**reports, **supervisor_reports({same_node["metadata"]["name"]: held})}
    assert len(spares.pick([a, same_node], both, {"v1": 1, "v2": 2}, ()) or {}) == 0


def _target(pod: dict[str, Any], raw: dict[str, Any]) -> PollTarget:
    assigned = with_assigned(raw)
    return PollTarget(pod["metadata"]["name"], "10.0.0.1", 9478, 1,
                      spares.rank_of(pod, assigned), pod["spec"]["nodeName"],
                      spares.is_idle(pod, assigned))  # fmt: skip


def with_assigned(raw: dict[str, Any]) -> dict[str, int]:
    attempts = raw["status"].get("attempts") or [{}]
    return dict(attempts[-1].get("spareRanks") or {})


def test_a_gpu_fault_is_replaced_by_a_ready_spare_at_once() -> None:
    pods = replaceable_pods()
    spare = spare_pod()
    names = [p["metadata"]["name"] for p in pods]
    sname = spare["metadata"]["name"]
    bad = pods[1]["spec"]["nodeName"]
    nodes = {**nodes_for([*pods, spare]), bad: node(bad, xid=XID)}
    raw = rtj_raw(RUNNING, **SPARES)
    exited = supervisors({names[0]: (0, "running", None), names[1]: (0, "exited", 1),
                          sname: (0, "stopped", None)})  # fmt: skip
    world = [*pods, spare]

    # an idle spare's own state is no failure of the world: nothing happens while all run
    calm = supervisors({names[0]: (0, "running", None), names[1]: (0, "running", None),
                        sname: (0, "stopped", None)})  # fmt: skip
    quiet = plan(raw, world, calm, nodes=nodes_for(world))
    assert not [a for a in quiet.actions if isinstance(a, (rc.DeleteJobSet, rc.DeletePod))]
    assert quiet.status_patch is None or "inPlace" not in with_status(raw, quiet)["status"]

    # 1. one plan: the bad node is quarantined, its pod is to be replaced and the spare
    # takes its rank; 2. the pod is deleted once the node's taint holds
    first = plan(raw, world, exited, nodes=nodes)
    raw = stopping_raw = with_status(raw, first)
    assert [q["node"] for q in raw["status"]["quarantinedNodes"]] == [bad]
    assert not [a for a in first.actions if isinstance(a, rc.DeletePod)]
    nodes = tainted_by(nodes, first)
    second = plan(raw, world, exited, nodes=nodes)
    state = raw["status"]["inPlace"]
    assert (state["phase"], state["replacing"], state["replacedRanks"]) == (
        "Stopping", [names[1]], [1],
    )  # fmt: skip
    record = raw["status"]["attempts"][0]
    assert record["spareRanks"] == {sname: 1}
    entry = record["inPlaceRestarts"][0]
    assert entry["spares"] == [f"{sname} on gpu-node-005 took rank 1 of {names[1]}"]
    assert [a.name for a in second.actions if isinstance(a, rc.DeletePod)] == [names[1]]

    # every pod of the world is ordered to stop, the spare too
    snap = snapshot(raw, pods=world)
    for member in (pods[0], spare):
        order = rc.restart_order(snap, _target(member, raw))
        assert order is not None and (order.action, order.generation) == ("stop", 1)

    # 3. the old pod still there, being deleted: the barrier holds while it runs; once its
    # kubelet reports the terminal phase (every container stopped) it is gone for the
    # barrier, though its Job's tracking finalizer keeps the object a while. The Job's pod
    # for index 1 not even created yet: the survivor and the spare stopped for generation 1
    # are the world, pinned, Starting
    both = supervisors({names[0]: (1, "stopped", None), sname: (1, "stopped", None)})
    going = copy.deepcopy(pods[1])
    going["metadata"]["deletionTimestamp"] = "2025-03-14T12:00:02Z"
    held = plan(raw, [pods[0], spare, going], both, nodes=nodes)
    assert held.status_patch is None and "still there" in held.summary, held.summary
    going["status"]["phase"] = "Failed"
    now = [pods[0], spare, going]
    starting = plan(raw, now, both, nodes=nodes, store=reading(1200))
    raw = with_status(raw, starting)
    assert raw["status"]["inPlace"]["phase"] == "Starting", starting.summary
    snap = snapshot(raw, pods=now)
    run_spare = rc.restart_order(snap, _target(spare, raw))
    run_worker = rc.restart_order(snap, _target(pods[0], raw))
    assert run_spare is not None and (run_spare.action, run_spare.rank) == ("run", 1)
    assert run_worker is not None and run_worker.rank is None
    # a run order stands once the pod reports running (or already exited) at generation 1,
    # not while it still reports the stop it carried out
    world_now = tuple(_target(p, raw) for p in (pods[0], spare))
    for shown, standing in (((1, "stopped", None), False), ((1, "running", None), True),
                            ((1, "exited", 1), True), ((0, "running", None), False)):  # fmt: skip
        heard = replace(snap, ranks=supervisors({names[0]: shown}), control_key=KEY)
        told = rc.pod_messages(heard, world_now).messages[names[0]]
        assert [(m.path, m.standing) for m in told] == [("/control", standing)], shown
    assert run_spare.master_addr is None and run_worker.master_addr is None, "rank 0 stayed"

    # 4. the Job creates index 1 again: an idle spare, held by the current generation
    again = copy.deepcopy(pods[1])
    again["metadata"]["name"] = names[1].replace("abcde", "fghij")
    again["metadata"]["annotations"][keys.JOB_INDEX_FAILURE_COUNT] = "1"
    again["spec"]["nodeName"] = "gpu-node-009"
    later = [pods[0], spare, again]
    running = supervisors({names[0]: (1, "running", None), sname: (1, "running", None),
                           again["metadata"]["name"]: (0, "stopped", None)})  # fmt: skip
    healthy = {**nodes, "gpu-node-009": node("gpu-node-009")}
    done = plan(raw, later, running, nodes=healthy)
    raw = with_status(raw, done)
    assert "inPlace" not in raw["status"] and raw["status"]["attempt"] == 1, done.summary
    hold = rc.restart_order(snapshot(raw, pods=later), _target(again, raw))
    assert hold is not None and (hold.action, hold.generation) == ("stop", 1)
    # the idle pod's hold is a standing order: it does not keep the poller's rounds close
    # together (every pod read every 0.25 s, for as long as the job keeps a spare)
    steady = replace(snapshot(raw, pods=later), control_key=KEY)
    targets = tuple(_target(p, raw) for p in later)
    sent = rc.pod_messages(steady, targets).messages
    assert [(m.path, m.standing) for m in sent[again["metadata"]["name"]]] == [("/control", True)]
    assert not JobTargets(JOB_KEY, targets, messages=sent).ordering
    # ... once it shows it: the new pod answers held at generation 0 until the hold reaches
    # it, and until then its order goes out in close rounds (a held pod that gets no order
    # in time exits, and fails its index)
    aname = again["metadata"]["name"]
    for shown, standing in (((0, "stopped", None), False), ((1, "stopped", None), True)):
        heard = replace(steady, ranks=supervisors({aname: shown}))
        idle = rc.pod_messages(heard, targets).messages[aname]
        assert [m.standing for m in idle] == [standing], shown
    # while a restart is under way its orders do
    stopping = replace(snapshot(stopping_raw, pods=world), control_key=KEY)
    world_targets = tuple(_target(p, stopping_raw) for p in world)
    under_way = rc.pod_messages(stopping, world_targets).messages
    for member in (pods[0], spare):  # the world's stop orders (the replaced pod is idle)
        assert [m.standing for m in under_way[member["metadata"]["name"]]] == [False]
    assert JobTargets(JOB_KEY, world_targets, messages=under_way).ordering
    # ... until each pod's report shows its order carried out: then it stands, and the
    # close rounds read only the pods still to move
    generation = stopping_raw["status"]["inPlace"]["generation"]
    first, second = names[0], spare["metadata"]["name"]
    for shown, still in (({first: (generation, "stopped", None)}, {second}),
                         ({first: (generation, "stopped", None),
                           second: (generation, "stopped", None)}, set())):  # fmt: skip
        heard = replace(stopping, ranks=supervisors(shown))
        told = rc.pod_messages(heard, world_targets).messages
        pressing = JobTargets(JOB_KEY, world_targets, messages=told)
        assert {p for p in (first, second) if pressing.pressing(p)} == still, shown
        assert pressing.ordering == bool(still)
    ran = replace(stopping, ranks=supervisors({first: (generation, "running", None)}))
    assert rc.pod_messages(ran, world_targets).messages[first][0].standing is False, (
        "a run state does not show a stop order carried out"
    )

    # 5. the world's trainers finish: the idle pod is told to finish (its Job completes)
    finished = copy.deepcopy(later)
    for member in finished[:2]:
        member["status"]["phase"] = "Succeeded"
    end = rc.restart_order(snapshot(raw, pods=finished), _target(again, raw))
    assert end is not None and end.action == "finish"
    for shown, standing in (((1, "stopped", None), False), ((1, "finished", 0), True)):
        heard = replace(snapshot(raw, pods=finished), ranks=supervisors({aname: shown}),
                        control_key=KEY)  # fmt: skip
        told = rc.pod_messages(heard, [_target(again, raw)]).messages[aname]
        assert [m.standing for m in told] == [standing], shown


def test_a_spare_that_takes_rank_0_moves_the_rendezvous_host() -> None:
    pods = replaceable_pods()
    spare = spare_pod()
    sname = spare["metadata"]["name"]
    raw = rtj_raw(
        {**RUNNING, "inPlace": {"generation": 1, "phase": "Starting",
                                "since": "2025-03-14T12:00:00Z", "step": 40},
         "attempts": [{"attempt": 1, "jobSet": "llm-a1", "spareRanks": {sname: 0},
                       "inPlaceRestarts": [{"generation": 1, "failureClass": "GPUFault",
                                            "failureCategory": "infrastructure",
                                            "detectedAt": "2025-03-14T12:00:00Z"}]}]},
        **SPARES,
    )  # fmt: skip
    snap = snapshot(raw, pods=[pods[1], spare])
    to_spare = rc.restart_order(snap, _target(spare, raw))
    to_worker = rc.restart_order(snap, _target(pods[1], raw))
    assert to_spare is not None and (to_spare.rank, to_spare.master_addr) == (0, "10.0.0.9")
    assert to_worker is not None and to_worker.master_addr == "10.0.0.9"
    assert to_worker.rank is None
    # a round's orders, the world read once for all targets: the same as one by one
    targets = [_target(spare, raw), _target(pods[1], raw)]
    assert restart_orders(snap, targets) == {t.pod: rc.restart_order(snap, t) for t in targets}
    # the same from the watch cache's trimmed pods, down to the DNS name for a pod without
    # an IPv4 address (the cache once dropped it: no order would have moved the host); a
    # bare IPv6 address only without a DNS name (commands build "host:port" from it)
    dns = "llm-a1-spare-0-0.llm-a1"
    for ip, want in (("10.0.0.9", "10.0.0.9"), (None, dns), ("fd00::9", dns)):
        holder = copy.deepcopy(spare)
        holder["status"]["podIP"] = ip
        snap = snapshot(raw, pods=[rc.trim_pod(pods[1]), rc.trim_pod(holder)])
        order = rc.restart_order(snap, _target(rc.trim_pod(pods[1]), raw))
        assert order is not None and order.master_addr == want


def test_the_job_succeeds_without_an_idle_pod_that_cannot_finish() -> None:
    """The world succeeded; the pod its Job created again for the rank a spare took found no
    node (Pending), so it cannot be told to finish and the JobSet cannot complete. The
    operator waits 30 s for the idle pods, then records the success and deletes the JobSet,
    which would otherwise hold its quota for ever."""
    w0 = pod(1, 0, exit_code=0, finished=NOW - timedelta(seconds=5))
    spare = spare_pod()
    spare["status"]["phase"] = "Succeeded"
    spare["status"]["containerStatuses"] = w0["status"]["containerStatuses"]
    again = pod(1, 1, phase="Pending")
    again["metadata"]["name"] = "llm-a1-worker-0-1-fghij"
    sname = spare["metadata"]["name"]
    status = {**RUNNING, "attempts": [{**RUNNING["attempts"][0], "spareRanks": {sname: 1}}]}
    raw = rtj_raw(status, **SPARES)
    world = [w0, spare, again]
    calm = supervisors({})

    early = plan(raw, world, calm)
    assert early.status_patch is None, early.summary
    assert "waiting for the idle pods to finish" in early.summary
    assert not [a for a in early.actions if isinstance(a, rc.DeleteJobSet)]
    late = rc.plan(snapshot(raw, jobsets=[jobset(1)], pods=world, now=NOW + timedelta(seconds=30)))
    raw = with_status(raw, late)
    assert raw["status"]["phase"] == "Succeeded", late.summary
    assert [a.name for a in late.actions if isinstance(a, rc.DeleteJobSet)] == ["llm-a1"]
    # without spares in the world, a succeeded pod waits for the JobSet as ever
    plain = rtj_raw(RUNNING, **SPARES)
    waiting = plan(plain, [w0, pod(1, 1, exit_code=0)], calm)
    assert "idle pods" not in waiting.summary


def test_a_preload_is_passed_to_the_supervisor_and_needs_in_place() -> None:
    """spec.recovery.inPlacePreload: the supervisor's --preload, on workers and spares."""
    warm = {**SPARES, "recovery": {**SPARES["recovery"], "inPlacePreload": ["torch", "a.b"]}}
    replicated = render_jobset(make_job(**warm), 1, 40, KEY)["spec"]["replicatedJobs"]
    for job in replicated:
        command = job["template"]["spec"]["template"]["spec"]["containers"][0]["command"]
        at = command.index("--preload")
        assert command[at + 1] == "torch,a.b" and command.index("--") > at + 1
    plain = render_jobset(make_job(**SPARES), 1, 40, KEY)["spec"]["replicatedJobs"][0]
    assert (
        "--preload" not in plain["template"]["spec"]["template"]["spec"]["containers"][0]["command"]
    )
    with pytest.raises(ValidationError, match=r"inPlacePreload needs spec\.recovery\.inPlace"):
        make_job(**{**IN_PLACE, "recovery": {"inPlacePreload": ["torch"]}})
    with pytest.raises(ValidationError, match="inPlacePreload"):
        make_job(**{**IN_PLACE, "recovery": {"inPlace": True, "inPlacePreload": ["os; rm"]}})
    assert MODULE_PATTERN.strip("^$") == preload.MODULE_NAME.pattern, "the API's copy is the shim's"
