"""The peer replica in the operator's loop (issue 16): the assignments and per-pod restart
orders the poller posts, what it keeps of the sidecars' ``replica`` reports, and an
in-place restart that replaces a pod resuming it from the copy its holder keeps."""

from __future__ import annotations

import asyncio
import copy
import json
from dataclasses import replace
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from rtj_test_support import NOW, supervisor_reports
from rtj_world import jobset, node, nodes_for, reading, rtj_raw, snapshot, with_status
from test_in_place import KEY, RUNNING, T, plan
from test_in_place_replace import XID, replaceable_pods, supervisors

from rtj_operator import reconcile as rc
from rtj_operator.api import keys
from rtj_operator.metrics import Metrics, sample
from rtj_operator.pod_http import PollFailed
from rtj_operator.rank_polls import JobTargets, RankPolls
from rtj_shim.fast.peer_replica import accept_assignment
from rtj_shim.wire.control import parse_order, verify

FAST = {
    "replicas": 3,
    "recovery": {"inPlace": True, "inPlaceDeadlineSeconds": 60},
    "checkpoint": {"uri": "s3://ckpt/team-a/llm", "fastTier": {"everySteps": 20}},
}
UID = "6f1c-uid"


def replica_pods(n: int = 3) -> list[dict[str, Any]]:
    pods = replaceable_pods(n)
    for p in pods:
        p["metadata"]["annotations"][keys.PEER_REPLICA_ANNOTATION] = "true"
    return pods


def names(pods: list[dict[str, Any]]) -> list[str]:
    return [p["metadata"]["name"] for p in pods]


def address(p: dict[str, Any]) -> str:
    return f"{p['status']['podIP']}:9478"


def running_snap(raw: dict[str, Any], pods: list[dict[str, Any]], **ranks: Any) -> rc.Snapshot:
    snap = snapshot(raw, jobsets=[jobset(1)], pods=pods)
    readings = rc.RankReadings(attempt=1, reports=(), polled_at=T, **ranks)
    return replace(snap, ranks=readings, control_key=KEY)


# --- assignments --------------------------------------------------------------------------


def test_each_holder_is_sent_its_signed_assignment_until_its_report_shows_it() -> None:
    pods = replica_pods()
    raw = rtj_raw(RUNNING, **FAST)
    snap = running_snap(raw, pods)
    targets = rc.poll_targets(snap)
    assert [(t.index, t.node) for t in targets] == [(0, "gpu-node-000"), (1, "gpu-node-001"),
                                                    (2, "gpu-node-002")]  # fmt: skip
    sent = rc.pod_messages(snap, targets)
    assert sent.ring_note is None
    p0, p1, p2 = names(pods)
    assert set(sent.messages) == {p0, p1, p2}
    (message,) = sent.messages[p2]
    assert message.path == "/replica" and verify(KEY, message.body, message.signature)
    assignment = accept_assignment(message.body, message.signature, key=KEY, job_uid=UID)
    assert (assignment.source_index, assignment.source) == (1, address(pods[1]))
    # once the holders report their assignments, nothing more is sent
    shown = {
        holder: {"source_index": i, "source": address(pods[i]), "steps": [], "error": None}
        for i, holder in enumerate((p1, p2, p0))
    }
    assert rc.pod_messages(running_snap(raw, pods, replicas=shown), targets).messages == {}
    # a source re-created elsewhere (a new address): its holder is told again
    moved = copy.deepcopy(pods)
    moved[1]["status"]["podIP"] = "10.0.0.9"
    again = rc.pod_messages(running_snap(raw, moved, replicas=shown), rc.poll_targets(
        running_snap(raw, moved)))  # fmt: skip
    assert list(again.messages) == [p2] and b"10.0.0.9:9478" in again.messages[p2][0].body


def test_no_assignment_without_a_key_a_replica_pods_rendered_for_it_or_while_restarting() -> None:
    pods = replica_pods()
    raw = rtj_raw(RUNNING, **FAST)
    targets = rc.poll_targets(running_snap(raw, pods))
    keyless = replace(running_snap(raw, pods), control_key=None)
    assert rc.pod_messages(keyless, targets).messages == {}
    off = rtj_raw(RUNNING, **{**FAST, "checkpoint": {"uri": "s3://ckpt/team-a/llm",
                                                    "fastTier": {"everySteps": 20,
                                                                 "peerReplicas": 0}}})  # fmt: skip
    assert rc.pod_messages(running_snap(off, pods), targets).messages == {}
    old = replaceable_pods()  # rendered before: a read-only fast tier in the sidecar
    assert rc.pod_messages(running_snap(raw, old), rc.poll_targets(
        running_snap(raw, old))).messages == {}  # fmt: skip
    # while an in-place restart runs, only its orders go out (the holders keep their copies)
    phase = {"generation": 1, "phase": "Stopping", "since": "2025-03-14T12:00:00Z"}
    stopping = rtj_raw({**RUNNING, "trainerGeneration": 1, "inPlace": phase}, **FAST)
    sent = rc.pod_messages(running_snap(stopping, pods), targets)
    assert {m.path for ms in sent.messages.values() for m in ms} == {"/control"}


def test_the_ring_note_when_the_placement_puts_every_pod_on_one_node() -> None:
    pods = replica_pods()
    for p in pods:
        p["spec"]["nodeName"] = "gpu-node-000"
    snap = running_snap(rtj_raw(RUNNING, **FAST), pods)
    sent = rc.pod_messages(snap, rc.poll_targets(snap))
    assert sent.ring_note is not None and "on 1 nodes" in sent.ring_note
    assert len(sent.messages) == 3, (
        "assigned all the same: a copy on the same node still survives a process dying"
    )


# --- the poller ---------------------------------------------------------------------------


def test_the_poller_posts_each_pods_own_messages_and_keeps_its_replica_report() -> None:
    posted: list[tuple[str, str]] = []
    answers: dict[str, Any] = {
        "10.0.0.1": {"schema": 1, "ranks": [], "replica": {"source_index": 2, "steps": [40]}},
        "10.0.0.2": {"schema": 1, "ranks": [], "replica": None},
    }

    def send(ip: str, port: int, timeout: float, message: rc.PollMessage) -> None:
        posted.append((ip, message.path))
        if ip == "10.0.0.2":
            raise PollFailed("/replica: refused: HTTP 404")  # an old sidecar: read anyway

    def fetch(ip: str, port: int, timeout: float, key: str | None) -> Any:
        if ip not in answers:
            raise PollFailed("ConnectionRefusedError")
        return answers[ip]

    polls = RankPolls(lambda: NOW, lambda key: None, fetch=fetch, send=send)
    key = ("team-a", "llm")
    targets = (rc.PollTarget("p0", "10.0.0.1", 9478, 1, 0, "a"),
               rc.PollTarget("p1", "10.0.0.2", 9478, 1, 1, "b"))  # fmt: skip
    assign = (rc.PollMessage("/replica", b"{}", "sha256=ab"),)
    job = JobTargets(key, targets, messages={"p1": assign})
    assert not job.ordering, "assignments alone do not make the rounds come closely"
    asyncio.run(polls.poll_once([job]))
    assert posted == [("10.0.0.2", "/replica")]
    got = polls.reading(key)
    assert got is not None
    assert got.replicas == {"p0": {"source_index": 2, "steps": [40]}, "p1": None}
    assert got.indexes == {"p0": 0, "p1": 1}
    # p0 stops answering: its last replica report is kept with its last progress report
    del answers["10.0.0.1"]
    asyncio.run(polls.poll_once([JobTargets(key, targets)]))
    later = polls.reading(key)
    assert later is not None and later.replicas["p0"] == {"source_index": 2, "steps": [40]}
    polls.close()


# --- an in-place restart that replaces a pod ----------------------------------------------


def _replace_pod_1(pods: list[dict[str, Any]]) -> tuple[dict[str, Any], list[Any], Any, Any]:
    """A GPU fault under pod 1's trainer: quarantined, replaced, the others stopping. The
    status, the world with the replacement (index 1 on gpu-node-009, a new IP), its nodes."""
    bad = pods[1]["spec"]["nodeName"]
    nodes = {**nodes_for(pods), bad: node(bad, xid=XID)}
    raw = rtj_raw(RUNNING, **FAST)
    p0, p1, p2 = names(pods)
    exited = supervisors({p0: (0, "running", None), p1: (0, "exited", 1),
                          p2: (0, "running", None)})  # fmt: skip
    raw = with_status(raw, plan(raw, pods, exited, nodes=nodes))  # quarantined, replacing
    assert raw["status"]["inPlace"]["replacing"] == [p1]
    new = copy.deepcopy(pods[1])
    new["metadata"]["name"] = p1.replace("abcde", "fghij")
    new["metadata"]["annotations"][keys.JOB_INDEX_FAILURE_COUNT] = "1"
    new["spec"]["nodeName"] = "gpu-node-009"
    new["status"]["podIP"] = "10.0.0.9"
    return raw, [pods[0], new, pods[2]], {**nodes, "gpu-node-009": node("gpu-node-009")}, new


def _barrier(world: list[Any], held: list[list[int]], replicas: dict[str, Any]) -> rc.RankReadings:
    body = {
        p["metadata"]["name"]: {"generation": 1, "state": "stopped", "exit_code": None,
                                "updated_wall_time": T, "fast_steps": h,
                                "fast_held": [f"0123456789abcdef@{s}" for s in h]}
        for p, h in zip(world, held, strict=True)
    }  # fmt: skip
    return rc.RankReadings(attempt=1, reports=(), polled_at=T, supervisors=supervisor_reports(body),
                           replicas=replicas)  # fmt: skip


def test_a_replaced_pod_resumes_from_the_fast_step_its_holder_keeps() -> None:
    pods = replica_pods()
    raw, world, nodes, new = _replace_pod_1(pods)
    p0, _, p2 = names(pods)
    # the ring: index 1's copy is on pod 2, index 2's on pod 0; the new pod holds nothing
    replicas = {
        p2: {"source_index": 1, "source": address(pods[1]), "steps": [1240, 1260]},
        p0: {"source_index": 2, "source": address(pods[2]), "steps": [1240, 1260]},
    }
    ranks = _barrier(world, [[1240, 1260], [], [1240, 1260]], replicas)
    starting = plan(raw, world, ranks, nodes=nodes, store=reading(1200))
    raw = with_status(raw, starting)
    state = raw["status"]["inPlace"]
    assert (state["phase"], state["step"], state["fastStep"]) == ("Starting", 1200, 1260)
    assert state["fastSources"] == {"1": address(pods[2])}
    entry = raw["status"]["attempts"][0]["inPlaceRestarts"][0]
    assert entry["fastSources"] == {"1": address(pods[2])} and "fastTierFallback" not in entry
    # the replacement's run order names its holder; the others' do not
    snap = running_snap(raw, world)
    sent = rc.pod_messages(snap, rc.poll_targets(snap))
    orders = {pod: parse_order(ms[0].body) for pod, ms in sent.messages.items()}
    assert orders[new["metadata"]["name"]].fast_source == address(pods[2])
    assert orders[p0].fast_source is None and orders[p2].fast_source is None
    assert {o.fast_step for o in orders.values()} == {1260}
    assert all(len(ms) == 1 for ms in sent.messages.values()), "no assignment meanwhile"
    running = supervisors({p["metadata"]["name"]: (1, "running", None) for p in world})
    done = plan(raw, world, running, nodes=nodes)
    (event,) = [a for a in done.actions
                if isinstance(a, rc.PostEvent) and a.reason == "RestartedInPlace"]  # fmt: skip
    assert (f"from fast-tier step 1260 (durable step 1200 as fallback; pod index 1 copies it "
            f"from the peer replica on {address(pods[2])})") in event.message  # fmt: skip


def test_without_a_copy_the_durable_step_is_pinned_and_the_reason_recorded() -> None:
    pods = replica_pods()
    raw, world, nodes, new = _replace_pod_1(pods)
    p0, _, p2 = names(pods)
    replicas = {
        p2: {"source_index": 1, "source": address(pods[1]), "steps": [], "error": "refused"},
        p0: {"source_index": 2, "source": address(pods[2]), "steps": [1240, 1260]},
    }
    ranks = _barrier(world, [[1240, 1260], [], [1240, 1260]], replicas)
    starting = plan(raw, world, ranks, nodes=nodes, store=reading(1200))
    raw = with_status(raw, starting)
    state = raw["status"]["inPlace"]
    assert state["step"] == 1200 and "fastStep" not in state and state["fastSources"] == {}
    why = (f"pod index 1 ({new['metadata']['name']}) holds no fast step and its replica on "
           f"pod index 2 ({p2}) holds none")  # fmt: skip
    entry = raw["status"]["attempts"][0]["inPlaceRestarts"][0]
    assert entry["fastTierFallback"] == why
    assert why in starting.summary
    snap = running_snap(raw, world)
    for ms in rc.pod_messages(snap, rc.poll_targets(snap)).messages.values():
        order = parse_order(ms[0].body)
        assert order.fast_step is None and order.fast_source is None
        assert "fast_source" not in json.loads(ms[0].body)
    running = supervisors({p["metadata"]["name"]: (1, "running", None) for p in world})
    done = plan(raw, world, running, nodes=nodes)
    (event,) = [a for a in done.actions
                if isinstance(a, rc.PostEvent) and a.reason == "RestartedInPlace"]  # fmt: skip
    assert event.message.endswith(f"from step 1200 (no fast-tier step: {why})")


def test_the_replicated_step_is_exported_after_each_poll_round() -> None:
    replicas: dict[str, Any] = {
        "p1": {"source_index": 0, "steps": [40, 50]},
        "p0": {"source_index": 1, "steps": [40]},
    }
    readings = rc.RankReadings(attempt=1, reports=(), polled_at=T, replicas=replicas,
                               indexes={"p0": 0, "p1": 1})  # fmt: skip
    facts = rc.progress_facts(readings, NOW)
    assert facts.fast_replicated_step == 40
    reg = CollectorRegistry()
    metrics = Metrics(reg)
    metrics.observe_progress("team-a", "llm", facts)
    per_job = {"namespace": "team-a", "name": "llm"}
    assert sample(reg, "rtj_checkpoint_fast_replicated_step", per_job) == 40
    none = rc.progress_facts(replace(readings, replicas={}), NOW)
    metrics.observe_progress("team-a", "llm", none)
    assert "rtj_checkpoint_fast_replicated_step{" not in generate_latest(reg).decode()
