"""Restart in place across attempts and over a bad pinned step (found by the goodput soak):
a later attempt's pods start at generation 0 whatever the job's counter reached, and a
pinned step the restarted trainers refuse is marked bad, not pinned again."""

from __future__ import annotations

from typing import Any

from rtj_test_support import supervisor_reports
from rtj_world import pod, rtj_raw, with_status
from test_in_place import IN_PLACE, STARTED, T, plan, supervised_pods
from test_rank_progress import with_sidecar

from rtj_operator import reconcile as rc
from rtj_operator.api import keys
from rtj_shim.wire.supervisor_report import SupervisorReport


def reports(pods: list[dict[str, Any]], *states: dict[str, Any]) -> rc.RankReadings:
    body = {p["metadata"]["name"]: {"updated_wall_time": T - 5, **s}
            for p, s in zip(pods, states, strict=True)}  # fmt: skip
    return rc.RankReadings(
        attempt=2,
        reports=(),
        polled_at=T,
        supervisors=supervisor_reports(body),
    )


def test_an_exit_in_a_later_attempt_is_seen_at_generation_0() -> None:
    pods = [with_sidecar(pod(2, i)) for i in range(2)]  # the second attempt's pods
    for i, p in enumerate(pods):
        p["status"]["podIP"] = f"10.0.0.{i + 1}"
        p["metadata"]["annotations"][keys.SUPERVISED_ANNOTATION] = "true"
    raw = rtj_raw(
        {"phase": "Running", "attempt": 2, "trainerGeneration": 3,
         "attempts": [{**STARTED, "endedAt": "2025-03-14T11:30:00Z", "failureClass": "NodeLost"},
                      {"attempt": 2, "jobSet": "llm-a2", "startedAt": "2025-03-14T11:31:00Z"}]},
        **IN_PLACE,
    )  # fmt: skip
    exited = reports(pods, {"generation": 0, "state": "running"},
                     {"generation": 0, "state": "exited", "exit_code": 1})  # fmt: skip
    from dataclasses import replace as dc_replace

    from rtj_world import jobset, snapshot

    snap = snapshot(raw, jobsets=[jobset(2)], pods=pods)
    p = rc.plan(dc_replace(snap, ranks=exited, control_key="k" * 64))
    assert p.status_patch is not None, p.summary
    raw = with_status(raw, p)
    assert "inPlace" in raw["status"], (p.summary, raw["status"])
    assert raw["status"]["inPlace"]["phase"] == "Stopping"
    assert raw["status"]["trainerGeneration"] == 4
    entry = raw["status"]["attempts"][1]["inPlaceRestarts"][0]
    assert entry["firstFailed"]["pod"] == pods[1]["metadata"]["name"]


def test_a_pinned_step_the_restarted_trainers_refuse_is_marked_bad() -> None:
    pods = supervised_pods()
    entry = {"generation": 1, "failureClass": "Unknown", "failureCategory": "unknown",
             "detectedAt": "2025-03-14T11:50:00Z", "resumedFromStep": 1200,
             "outcome": "Running"}  # fmt: skip
    raw = rtj_raw(
        {"phase": "Running", "attempt": 1, "trainerGeneration": 1,
         "attempts": [{**STARTED, "inPlaceRestarts": [entry]}]},
        **IN_PLACE,
    )  # fmt: skip
    refused = {"step": 1200, "reason": "file 'common/shard-00000.pt' has sha256 2576..."}
    readings = reports(pods, {"generation": 1, "state": "exited", "exit_code": 1,
                              "rejected": refused},
                       {"generation": 1, "state": "exited", "exit_code": 1})  # fmt: skip
    readings = rc.RankReadings(attempt=1, reports=(), polled_at=T,
                               supervisors=readings.supervisors)  # fmt: skip
    p = plan(raw, pods, readings)
    raw = with_status(raw, p)
    status = raw["status"]
    assert status["badSteps"] == [1200]
    assert status["inPlace"]["phase"] == "Stopping" and status["trainerGeneration"] == 2
    second = status["attempts"][0]["inPlaceRestarts"][1]
    assert second["failureClass"] == "CheckpointCorrupt"
    assert "refused pinned step 1200" in second["evidence"][0]


def test_a_survivors_exit_waits_briefly_for_a_silent_peers_node_before_the_whole_world() -> None:
    """The soak's silent node loss: the surviving rank exits first (its peer's socket
    closed) while the lost pod answers nothing; re-creating the world at once would pre-empt
    the node's verdict, which replaces only the lost pod."""
    from datetime import timedelta

    from rtj_test_support import NOW

    pods = supervised_pods()
    raw = rtj_raw({"phase": "Running", "attempt": 1, "attempts": [STARTED]}, **IN_PLACE)
    survivor = pods[0]["metadata"]["name"]
    quiet = rc.RankReadings(attempt=1, reports=(), polled_at=T, supervisors={
        survivor: SupervisorReport.parse({"generation": 0, "state": "exited", "exit_code": 1,
                                          "updated_wall_time": T - 5})})  # fmt: skip
    held = plan(raw, pods, quiet)
    assert held.status_patch is None, held.summary
    assert not [a for a in held.actions if isinstance(a, (rc.DeleteJobSet, rc.DeletePod))]
    assert "waiting up to 12 s for its node's verdict" in held.summary
    # no verdict in time: the whole world, as before
    late = plan(raw, pods, quiet, now=NOW + timedelta(seconds=10))
    assert late.status_patch is not None
    assert late.status_patch.status["phase"] == "Restarting"
    assert any(isinstance(a, rc.DeleteJobSet) for a in late.actions)
