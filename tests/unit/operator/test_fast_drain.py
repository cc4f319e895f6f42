"""The fast tier's drain in the operator (issue 16): the field, the sidecar's rendering, the
signed order to the pod holding rank 0 until its report shows it, and what status and the
metrics show of the drained step."""

from __future__ import annotations

import copy

import pytest
from pydantic import ValidationError
from rtj_world import rtj_raw, snapshot
from test_in_place import KEY, RUNNING, T
from test_in_place_peer_replica import address, names, running_snap
from test_in_place_replace import replaceable_pods

from rtj_operator import reconcile as rc
from rtj_operator.api import keys
from rtj_operator.api.checkpoint_spec import DRAIN_MULTIPLE, FastTier
from rtj_operator.api.resource import ResilientTrainingJob
from rtj_operator.policy import fast_drain
from rtj_operator.policy.render import pod_template
from rtj_operator.reconcile.ranks import progress_facts
from rtj_shim.wire.drain_order import accept_drain_order, peers_digest

UID = "6f1c-uid"
DRAIN = {
    "replicas": 3,
    "recovery": {"inPlace": True, "inPlaceDeadlineSeconds": 60},
    "checkpoint": {
        "uri": "s3://ckpt/team-a/llm",
        "credentialsSecret": "team-a-s3",
        "fastTier": {"everySteps": 20, "drainEverySteps": 100},
    },
}


def drain_messages(snap: rc.Snapshot) -> dict[str, list[rc.PollMessage]]:
    sent = rc.pod_messages(snap, rc.poll_targets(snap)).messages
    return {pod: [m for m in ms if m.path == "/drain"] for pod, ms in sent.items()
            if any(m.path == "/drain" for m in ms)}  # fmt: skip


def test_drain_every_steps_is_a_multiple_of_the_fast_interval() -> None:
    assert FastTier(every_steps=20, drain_every_steps=100).drain_every_steps == 100
    with pytest.raises(ValidationError, match="drainEverySteps must be a multiple"):
        FastTier(every_steps=20, drain_every_steps=50)
    assert "only fast steps can be drained" in DRAIN_MULTIPLE


def test_the_sidecar_gets_the_store_its_credentials_and_room_for_the_uploads() -> None:
    rtj = ResilientTrainingJob.model_validate(rtj_raw(RUNNING, **DRAIN))
    template = pod_template(rtj, 1, 40, "llm-a1", KEY)
    (sidecar,) = [c for c in template["spec"]["initContainers"]
                  if c["name"] == keys.PROGRESS_SIDECAR]  # fmt: skip
    env = {e["name"]: e.get("value") for e in sidecar["env"]}
    assert env[keys.ENV_CHECKPOINT_URI] == "s3://ckpt/team-a/llm"
    assert env[keys.ENV_RUN_ID] == rtj.run_id
    assert env[keys.ENV_PROTECT_STEP] == "40"  # the attempt's resume step survives retention
    assert keys.ENV_ATTEMPT not in env  # the order names the writer attempt
    assert sidecar["envFrom"] == [{"secretRef": {"name": "team-a-s3"}}]
    assert sidecar["resources"]["limits"]["memory"] == fast_drain.DRAIN_MEMORY_LIMIT
    # without a drain: none of it
    plain = copy.deepcopy(DRAIN)
    del plain["checkpoint"]["fastTier"]["drainEverySteps"]
    rtj = ResilientTrainingJob.model_validate(rtj_raw(RUNNING, **plain))
    (sidecar,) = [c for c in pod_template(rtj, 1, 40, "llm-a1", KEY)["spec"]["initContainers"]
                  if c["name"] == keys.PROGRESS_SIDECAR]  # fmt: skip
    assert "envFrom" not in sidecar
    assert keys.ENV_CHECKPOINT_URI not in {e["name"] for e in sidecar["env"]}


def test_index_0s_sidecar_is_sent_the_signed_order_until_its_report_shows_it() -> None:
    pods = replaceable_pods(3)
    raw = rtj_raw(RUNNING, **DRAIN)
    p0, _, _ = names(pods)
    sent = drain_messages(running_snap(raw, pods))
    assert list(sent) == [p0]
    (message,) = sent[p0]
    order = accept_drain_order(message.body, message.signature, key=KEY, job_uid=UID)
    assert (order.attempt, order.every_steps) == ("1", 100)
    assert order.peers == (address(pods[1]), address(pods[2]))
    shown = {p0: {"attempt": "1", "every_steps": 100, "peers": 2,
                  "peers_digest": peers_digest(order.peers), "step": 200}}  # fmt: skip
    assert drain_messages(running_snap(raw, pods, drains=shown)) == {}
    # pod 2 re-created at a new address: the order goes again, with it
    moved = copy.deepcopy(pods)
    moved[2]["status"]["podIP"] = "10.0.0.9"
    again = drain_messages(running_snap(raw, moved, drains=shown))
    (message,) = again[p0]
    assert b"10.0.0.9:9478" in message.body


def test_after_an_in_place_restart_the_order_names_the_new_writer_attempt() -> None:
    pods = replaceable_pods(3)
    record = {
        **RUNNING["attempts"][0],
        "inPlaceRestarts": [
            {
                "generation": 2,
                "outcome": "Running",
                "startedAt": "2025-03-14T12:00:00Z",
                "failureClass": "Unknown",
                "failureCategory": "infrastructure",
                "detectedAt": "2025-03-14T11:59:58Z",
            }
        ],
    }
    raw = rtj_raw({**RUNNING, "attempts": [record], "trainerGeneration": 2}, **DRAIN)
    (message,) = drain_messages(running_snap(raw, pods))[names(pods)[0]]
    order = accept_drain_order(message.body, message.signature, key=KEY, job_uid=UID)
    # as the trainers of generation 2 write (rtj_shim.agent.supervisor)
    assert order.attempt == "1.2"


def test_no_order_while_restarting_without_every_pod_or_without_a_drain() -> None:
    pods = replaceable_pods(3)
    phase = {"generation": 1, "phase": "Stopping", "since": "2025-03-14T12:00:00Z"}
    stopping = rtj_raw({**RUNNING, "trainerGeneration": 1, "inPlace": phase}, **DRAIN)
    assert drain_messages(running_snap(stopping, pods)) == {}
    unplaced = copy.deepcopy(pods)
    del unplaced[1]["status"]["podIP"]  # index 1 has no address yet: its file is needed
    assert drain_messages(running_snap(rtj_raw(RUNNING, **DRAIN), unplaced)) == {}
    plain = copy.deepcopy(DRAIN)
    del plain["checkpoint"]["fastTier"]["drainEverySteps"]
    assert drain_messages(running_snap(rtj_raw(RUNNING, **plain), pods)) == {}


def test_the_drained_step_in_status_and_the_metric() -> None:
    pods = replaceable_pods(3)
    p0, p1, _ = names(pods)
    drains = {p0: {"attempt": "1", "step": 300, "error": None}, p1: None}
    readings = rc.RankReadings(attempt=1, reports=(), polled_at=T, drains=drains)
    assert progress_facts(readings, snapshot(rtj_raw(RUNNING, **DRAIN)).now).drained_step == 300
    assert fast_drain.drained_step({p0: {"step": True}, p1: None}) is None
