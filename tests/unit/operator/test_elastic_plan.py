"""Elastic N-k (spec.elastic, issue 45), decided without a cluster: a GPU fault replaces a
pod whose replacement cannot be scheduled; after waitForReplacementSeconds the two other
pods restart in place as a world of 2 (ranks renumbered, orders naming rank, world size and
rendezvous host; the pending pod idle); once the replacement runs and is held, the world
grows back to 3 at the pods' own ranks, no restart budget spent."""

from __future__ import annotations

import copy
from datetime import timedelta
from typing import Any

from prometheus_client import CollectorRegistry
from rtj_test_support import NOW, supervisor_reports
from rtj_world import node, reading, rtj_raw, snapshot, tainted_by, target, with_status
from test_in_place import RUNNING, T, plan
from test_in_place_replace import XID, replaceable_pods

from rtj_operator import reconcile as rc
from rtj_operator.api import keys
from rtj_operator.api.resource import ResilientTrainingJob
from rtj_operator.metrics import Metrics, sample

ELASTIC = {
    "replicas": 3,
    "recovery": {"inPlace": True, "inPlaceDeadlineSeconds": 60},
    "elastic": {"minReplicas": 2, "waitForReplacementSeconds": 30},
}


def reports(at: dict[str, tuple[int, str]]) -> rc.RankReadings:
    body = {pod: {"generation": g, "state": s, "exit_code": 1 if s == "exited" else None,
                  "updated_wall_time": T - 5} for pod, (g, s) in at.items()}  # fmt: skip
    return rc.RankReadings(attempt=1, reports=(), polled_at=T,
                           supervisors=supervisor_reports(body))  # fmt: skip


def events(p: rc.Plan) -> list[str]:
    return [a.reason for a in p.actions if isinstance(a, rc.PostEvent)]


def test_a_replacement_that_cannot_be_scheduled_shrinks_the_world_then_it_grows_back() -> None:
    pods = replaceable_pods(3)
    names = [p["metadata"]["name"] for p in pods]
    bad = pods[1]["spec"]["nodeName"]
    nodes = {**{p["spec"]["nodeName"]: node(p["spec"]["nodeName"]) for p in pods},
             bad: node(bad, xid=XID)}  # fmt: skip
    raw = rtj_raw(RUNNING, **ELASTIC)
    exited = reports({names[0]: (0, "running"), names[1]: (0, "exited"), names[2]: (0, "running")})

    # the GPU fault: quarantine, then the pod on the node is deleted (as without elastic)
    first = plan(raw, pods, exited, nodes=nodes)
    raw = with_status(raw, first)
    nodes = tainted_by(nodes, first)
    plan(raw, pods, exited, nodes=nodes)
    assert raw["status"]["inPlace"]["replacedRanks"] == [1]
    assert raw["status"]["workers"] == "3/3", "kubectl get's WORKERS: the whole world"
    failed = rc.restart_order(snapshot(raw, pods=pods, nodes=nodes), target(pods[0], raw))
    assert failed is not None and (failed.action, failed.save_seconds) == ("stop", None)
    budget = raw["status"]["restarts"]

    # its Job's pod for index 1 again, unschedulable (no free node); the others stopped
    pending = copy.deepcopy(pods[1])
    pending["metadata"]["name"] = fresh = names[1].replace("abcde", "fghij")
    pending["metadata"]["annotations"][keys.JOB_INDEX_FAILURE_COUNT] = "1"
    pending["spec"].pop("nodeName")
    pending["status"] = {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/3 nodes are available: 1 node(s) had untolerated taint"}]}  # fmt: skip
    world = [pods[0], pods[2], pending]
    stopped = reports({names[0]: (1, "stopped"), names[2]: (1, "stopped")})
    since = NOW  # the restart began at the snapshot's clock
    early = plan(raw, world, stopped, nodes=nodes, now=since + timedelta(seconds=10))
    assert (
        early.status_patch is None and "waiting for a replacement for 10s of 30s" in early.summary
    )

    # 30 s on: the two that stopped are the world; pod 2 takes rank 1
    shrunk = plan(raw, world, stopped, nodes=nodes, now=since + timedelta(seconds=31))
    raw = with_status(raw, shrunk)
    record = raw["status"]["attempts"][0]
    assert (record["worldSize"], record["spareRanks"]) == (2, {names[2]: 1})
    assert raw["status"]["inPlace"]["worldSize"] == 2 and "Shrunk" in events(shrunk)
    assert _condition(raw) == ("True", "Shrunk")
    assert raw["status"]["workers"] == "2/3"
    assert raw["status"]["restarts"] == budget, "the shrink spends nothing more"

    # the barrier now holds for the world of 2: pinned (durable only: the ranks change)
    starting = plan(raw, world, stopped, nodes=nodes, now=since + timedelta(seconds=32),
                    store=reading(1200, since + timedelta(seconds=32)))  # fmt: skip
    raw = with_status(raw, starting)
    state = raw["status"]["inPlace"]
    assert (state["phase"], state["step"], state.get("fastStep")) == ("Starting", 1200, None)
    snap = snapshot(raw, pods=world, nodes=nodes)
    zero, one = (rc.restart_order(snap, target(p, raw)) for p in (pods[0], pods[2]))
    assert zero is not None and one is not None
    assert (zero.action, zero.rank, zero.world_size) == ("run", 0, 2)
    assert (one.rank, one.world_size, one.master_addr) == (1, 2, zero.master_addr)
    assert zero.master_addr == pods[0]["status"]["podIP"]
    assert target(pending, raw).idle, "the pod for the rank the world lacks serves none"

    running = reports({names[0]: (1, "running"), names[2]: (1, "running")})
    done = plan(raw, world, running, nodes=nodes, now=since + timedelta(seconds=40))
    raw = with_status(raw, done)
    assert "inPlace" not in raw["status"] and raw["status"]["phase"] == "Running"
    assert "of a world of 2" in " ".join(
        a.message for a in done.actions if isinstance(a, rc.PostEvent)
    )
    # from when the smaller world ran (the restart done at +40 s)
    assert _world_gauges(raw) == (2.0, 3.0, (since + timedelta(seconds=40)).timestamp())
    # shrunk and healthy: nothing to do while the replacement cannot run
    calm = plan(raw, world, running, nodes=nodes, now=since + timedelta(seconds=60))
    assert calm.status_patch is None or "inPlace" not in with_status(raw, calm)["status"]

    # a node frees up: the replacement runs, held by its supervisor -> grow back to 3
    back = copy.deepcopy(pending)
    back["spec"]["nodeName"] = "gpu-node-009"
    back["status"] = {"phase": "Running", "podIP": "10.0.0.9"}
    world = [pods[0], pods[2], back]
    nodes = {**nodes, "gpu-node-009": node("gpu-node-009")}
    held = reports({names[0]: (1, "running"), names[2]: (1, "running"), fresh: (1, "stopped")})
    growing = plan(raw, world, held, nodes=nodes, now=since + timedelta(seconds=90))
    raw = with_status(raw, growing)
    state, record = raw["status"]["inPlace"], raw["status"]["attempts"][0]
    assert (state["phase"], state["generation"], state["worldSize"]) == ("Stopping", 2, 3)
    assert (record["worldSize"], record.get("spareRanks", {})) == (3, {})
    assert raw["status"]["workers"] == "3/3"
    # a healthy world stopped to grow back: its trainers may save at their next boundary
    snap = snapshot(raw, pods=world, nodes=nodes)
    stop = rc.restart_order(snap, target(pods[0], raw))
    assert stop is not None and (stop.action, stop.save_seconds) == ("stop", 30)
    entry = record["inPlaceRestarts"][-1]
    assert entry.get("failureClass") is None and entry["worldSize"] == 3
    assert "GrowingBack" in events(growing) and raw["status"]["restarts"] == budget
    assert _condition(raw) == ("False", "GrowingBack")

    all_stopped = reports({n: (2, "stopped") for n in (names[0], names[2], fresh)})
    again = plan(raw, world, all_stopped, nodes=nodes, now=since + timedelta(seconds=92),
                 store=reading(1300, since + timedelta(seconds=92)))  # fmt: skip
    raw = with_status(raw, again)
    # the healthy world saved until it stopped, after the reading: no pin, the trainers
    # resolve the newest verified step (a drill's grow once pinned 38 with 39 published)
    assert (raw["status"]["inPlace"]["phase"], raw["status"]["inPlace"].get("step")) == (
        "Starting", None,
    )  # fmt: skip
    snap = snapshot(raw, pods=world, nodes=nodes)
    orders = {p["metadata"]["name"]: rc.restart_order(snap, target(p, raw)) for p in world}
    assert {n: (o.rank, o.world_size) for n, o in orders.items() if o} == {
        names[0]: (0, 3),
        fresh: (1, 3),
        names[2]: (2, 3),
    }, "every pod at its own rank again, each order naming it (the supervisors kept 1 of 2)"
    assert {o.master_addr for o in orders.values() if o} == {pods[0]["status"]["podIP"]}
    final = plan(raw, world, reports({n: (2, "running") for n in (names[0], names[2], fresh)}),
                 nodes=nodes, now=since + timedelta(seconds=95))  # fmt: skip
    raw = with_status(raw, final)
    assert "inPlace" not in raw["status"] and raw["status"]["restarts"] == budget
    assert _world_gauges(raw) == (3.0, 3.0, 0.0), "whole again: no shrunk-since sample"


def _condition(raw: dict[str, Any]) -> tuple[str, str]:
    (found,) = [c for c in raw["status"]["conditions"] if c["type"] == "Elastic"]
    return found["status"], found["reason"]


def _world_gauges(raw: dict[str, Any]) -> tuple[float, float, float]:
    """rtj_world_size, rtj_world_size_desired and rtj_world_shrunk_since_timestamp_seconds
    as /metrics shows them for the job (0.0: no sample)."""
    registry = CollectorRegistry()
    Metrics(registry).observe_job(ResilientTrainingJob.from_object(raw))
    labels = {"namespace": raw["metadata"]["namespace"], "name": raw["metadata"]["name"]}
    names = ("rtj_world_size", "rtj_world_size_desired", "rtj_world_shrunk_since_timestamp_seconds")
    size, desired, since = (sample(registry, n, labels) for n in names)
    return size, desired, since
