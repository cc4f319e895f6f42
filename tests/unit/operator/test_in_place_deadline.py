"""An in-place restart past spec.recovery.inPlaceDeadlineSeconds (issue 15), decided without
a cluster: it falls back to re-creating the whole world without spending a second restart,
deletes the pods with the hung world's brief grace, and says what held it (the first pods
that had not stopped or started, a replaced pod not gone, a replacement not there, the
store not read); a restart whose every pod already runs the new generation finishes."""

from __future__ import annotations

import copy
from datetime import timedelta
from typing import Any

from rtj_test_support import NOW
from rtj_world import node, reading, rtj_raw, with_status
from test_in_place import IN_PLACE, RUNNING, plan, readings, stopping, supervised_pods
from test_in_place_replace import gpu_fault, supervisors

from rtj_operator import reconcile as rc
from rtj_operator.reconcile.converge import HANG_TEARDOWN_GRACE

LATE = NOW + timedelta(seconds=61)
"""Past the 60 s deadline of IN_PLACE."""


def _fell_back(raw: dict[str, Any], p: rc.Plan) -> str:
    """The reason the fallback recorded (the attempt's first evidence line)."""
    assert [a for a in p.actions if isinstance(a, rc.DeleteJobSet)], p.summary
    record = with_status(raw, p)["status"]["attempts"][0]
    assert record["inPlaceRestarts"][0]["outcome"] == "FellBack"
    line: str = record["evidence"][0]
    prefix = "in-place restart fell back: "
    assert line.startswith(prefix), line
    return line[len(prefix) :]


def test_an_in_place_restart_past_its_deadline_recreates_the_world_without_paying_twice() -> None:
    pods = supervised_pods()
    raw = rtj_raw(RUNNING, **IN_PLACE)
    raw = stopping(raw, pods)
    stuck = readings(pods, (1, "stopped", None), (0, "stopping", None))
    late = plan(raw, pods, stuck, now=LATE)
    assert _fell_back(raw, late) == (
        f"{pods[1]['metadata']['name']} had not stopped generation 1 within 60s"
    ), "the reason names the pod that held the barrier"
    deletes = [a for a in late.actions if isinstance(a, rc.DeletePod)]
    assert sorted(d.name for d in deletes) == sorted(p["metadata"]["name"] for p in pods)
    assert {d.grace_seconds for d in deletes} == {HANG_TEARDOWN_GRACE}, "a hung world: briefly"
    raw = with_status(raw, late)
    status = raw["status"]
    assert status["phase"] == "Restarting" and "inPlace" not in status
    assert status["restarts"]["infrastructure"] == 1, "the fallback spends no second restart"
    record = status["attempts"][0]
    assert record["inPlaceRestarts"][0]["outcome"] == "FellBack"
    restarting = next(c for c in status["conditions"] if c["type"] == "Restarting")
    assert (restarting["status"], restarting["reason"]) == ("True", "InPlaceRestartFellBack")


def test_past_its_deadline_the_reason_names_the_first_pods_that_did_not_start() -> None:
    pods = supervised_pods(8)
    raw = rtj_raw(RUNNING, **{**IN_PLACE, "replicas": 8})
    raw = with_status(raw, plan(raw, pods, readings(
        pods, *[(0, "running", None)] * 7, (0, "exited", 1))))  # fmt: skip
    raw = with_status(raw, plan(raw, pods, readings(pods, *[(1, "stopped", None)] * 8),
                                store=reading(1200)))  # fmt: skip
    assert raw["status"]["inPlace"]["phase"] == "Starting"
    one_started = readings(pods, (1, "running", None), *[(1, "stopped", None)] * 7)
    first = ", ".join(p["metadata"]["name"] for p in pods[1:6])
    assert _fell_back(raw, plan(raw, pods, one_started, now=LATE)) == (
        f"{first} and 2 more had not started generation 1 within 60s"
    )


def test_a_restart_whose_every_pod_already_runs_past_the_deadline_finishes() -> None:
    pods = supervised_pods()
    raw = rtj_raw(RUNNING, **IN_PLACE)
    raw = stopping(raw, pods)
    stopped = readings(pods, (1, "stopped", None), (1, "stopped", None))
    raw = with_status(raw, plan(raw, pods, stopped, store=reading(1200)))
    both = readings(pods, (1, "running", None), (1, "running", None))
    done = plan(raw, pods, both, now=LATE)
    assert not [a for a in done.actions if isinstance(a, (rc.DeleteJobSet, rc.DeletePod))]
    entry = with_status(raw, done)["status"]["attempts"][0]["inPlaceRestarts"][0]
    assert entry["outcome"] == "Running"


def test_past_the_deadline_the_reason_says_what_held_the_stop() -> None:
    pods, names, _, nodes, exited = gpu_fault()
    raw = rtj_raw(RUNNING, **IN_PLACE)
    raw = with_status(raw, plan(raw, pods, exited, nodes=nodes))  # quarantined, replacing
    assert raw["status"]["inPlace"]["replacing"] == [names[1]]
    survivor = supervisors({names[0]: (1, "stopped", None)})

    # the replaced pod still terminating (a kubelet that does not end it)
    going = copy.deepcopy(pods)
    going[1]["metadata"]["deletionTimestamp"] = "2025-03-14T12:00:30Z"
    held = plan(raw, going, survivor, nodes=nodes, now=LATE)
    assert _fell_back(raw, held) == f"{names[1]} being replaced had not ended within 60s"
    # gone, and its Job has not created it again (back-off, no room)
    alone = plan(raw, pods[:1], survivor, nodes=nodes, now=LATE)
    assert _fell_back(raw, alone) == "1 of 2 pods were there within 60s"
    # every pod there and stopped, but the store not read since the failure
    new = copy.deepcopy(pods[1])
    new["metadata"]["name"] = names[1].replace("abcde", "fghij")
    new["spec"]["nodeName"] = "gpu-node-009"
    world = [pods[0], new]
    both = supervisors(
        {names[0]: (1, "stopped", None), new["metadata"]["name"]: (1, "stopped", None)}
    )
    unread = plan(raw, world, both, nodes={**nodes, "gpu-node-009": node("gpu-node-009")}, now=LATE)
    assert _fell_back(raw, unread) == (
        "every pod stopped generation 1, but the checkpoint store was not read within 60s"
    )
    read = plan(raw, world, both, nodes={**nodes, "gpu-node-009": node("gpu-node-009")},
                now=LATE, store=reading(1200, LATE))  # fmt: skip
    assert _fell_back(raw, read) == (
        "every pod stopped generation 1 only as the deadline passed (within 60s)"
    )
