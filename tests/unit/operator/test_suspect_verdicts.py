"""The trainers' verdict on a suspect state (issue 43, silent data corruption), decided
without a cluster: a supervised world whose trainers refuse a suspect state is not restarted
in the same pods but as a whole world, the suspect pod named as the first failed, its node
avoided by the job's later attempts and tainted for no one."""

from __future__ import annotations

from typing import Any

from rtj_test_support import supervisor_reports
from rtj_world import rtj_raw, with_status
from test_in_place import IN_PLACE, RUNNING, T, plan, supervised_pods

from rtj_operator import reconcile as rc
from rtj_operator.api.resource import ResilientTrainingJob
from rtj_operator.policy.render import MAX_SUSPECT_NODES, avoided_nodes

SUSPECTS_POD_0 = {"step": 40, "kind": "diverged", "ranks": [0], "pods": [0]}


def _exits(pods: list[dict[str, Any]], verdict: dict[str, Any] | None) -> rc.RankReadings:
    """Both trainers exited with the same verdict, pod 1 first (it is not the suspect)."""
    reports = {
        p["metadata"]["name"]: {"generation": 0, "state": "exited", "exit_code": 1,
                                "updated_wall_time": T - 5 + (1 - i), "rank": i,
                                "suspect": verdict}
        for i, p in enumerate(pods)
    }  # fmt: skip
    return rc.RankReadings(attempt=1, reports=(), polled_at=T,
                           supervisors=supervisor_reports(reports))  # fmt: skip


def test_a_suspect_state_restarts_the_whole_world_naming_the_suspect_pod() -> None:
    pods = supervised_pods()
    failed = plan(rtj_raw(RUNNING, **IN_PLACE), pods, _exits(pods, SUSPECTS_POD_0))
    assert any(isinstance(a, rc.DeleteJobSet) for a in failed.actions), failed.summary
    raw = with_status(rtj_raw(RUNNING, **IN_PLACE), failed)
    record = raw["status"]["attempts"][0]
    assert record["failureClass"] == "SilentDataCorruption"
    assert not record.get("inPlaceRestarts"), "never restarted in the same pods"
    first = record["firstFailed"]
    suspect = pods[0]
    assert first["pod"] == suspect["metadata"]["name"] and first["suspect"] is True
    assert first["node"] == suspect["spec"]["nodeName"] and first["rank"] == 0
    assert "they suspect rank 0" in record["evidence"][0]
    assert not raw["status"].get("quarantinedNodes"), "the trainers' word taints nothing"
    job = ResilientTrainingJob.from_object(raw)
    assert avoided_nodes(job, 2) == [suspect["spec"]["nodeName"]]


def test_a_verdict_without_a_majority_names_no_pod_and_avoids_no_node() -> None:
    pods = supervised_pods()
    tie = {"step": 40, "kind": "diverged", "ranks": [], "pods": []}
    raw = with_status(rtj_raw(RUNNING, **IN_PLACE), plan(
        rtj_raw(RUNNING, **IN_PLACE), pods, _exits(pods, tie)))  # fmt: skip
    record = raw["status"]["attempts"][0]
    assert record["failureClass"] == "SilentDataCorruption"
    assert record["firstFailed"]["pod"] == pods[1]["metadata"]["name"], "the first to exit"
    assert not record["firstFailed"].get("suspect")
    assert "no rank (no majority" in record["evidence"][0]
    assert avoided_nodes(ResilientTrainingJob.from_object(raw), 2) == []


def test_a_trainer_exit_without_a_verdict_still_restarts_in_place() -> None:
    pods = supervised_pods()
    raw = with_status(rtj_raw(RUNNING, **IN_PLACE), plan(
        rtj_raw(RUNNING, **IN_PLACE), pods, _exits(pods, None)))  # fmt: skip
    entry = raw["status"]["attempts"][0]["inPlaceRestarts"][0]
    assert entry["failureClass"] == "Unknown"


def test_every_earlier_suspect_node_is_avoided_up_to_the_newest_few() -> None:
    def attempt(n: int, node: str, suspect: bool = True) -> dict[str, Any]:
        return {"attempt": n, "jobSet": f"llm-a{n}", "failureClass": "SilentDataCorruption",
                "firstFailed": {"pod": f"llm-a{n}-worker-0-1-x", "node": node,
                                "suspect": suspect}}  # fmt: skip

    attempts = [attempt(1, "gpu-node-001"), attempt(2, "gpu-node-002", suspect=False),
                attempt(3, "gpu-node-003")]  # fmt: skip
    job = ResilientTrainingJob.from_object(rtj_raw({"attempt": 3, "attempts": attempts}))
    assert avoided_nodes(job, 4) == ["gpu-node-001", "gpu-node-003"]
    assert avoided_nodes(job, 2) == ["gpu-node-001"], "only attempts before it"
    many = [attempt(n, f"gpu-node-{n:03d}") for n in range(1, MAX_SUSPECT_NODES + 3)]
    job = ResilientTrainingJob.from_object(rtj_raw({"attempt": len(many), "attempts": many}))
    avoided = avoided_nodes(job, len(many) + 1)
    assert len(avoided) == MAX_SUSPECT_NODES and "gpu-node-001" not in avoided
