"""classify_failure over the recorded-style fixture corpus (tests/fixtures/classify)."""

from __future__ import annotations

import copy
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from rtj_test_support import FIXTURES, NOW, load_json

from rtj_operator.api import FailureCategory, FailureClass, ResilientTrainingJob
from rtj_operator.api.spec import NodeHealth
from rtj_operator.policy.classify import CONFIG_ERROR_GRACE, Classification, classify_failure

CASES = FIXTURES / "classify"
C = FailureClass

# case -> (class, first failed pod's node rank, reported rank, exit code, nodes to quarantine)
EXPECTED: dict[str, tuple[FailureClass | None, int | None, int | None, int | None, list[str]]] = {
    "node_lost_not_ready": (C.NODE_LOST, 2, 2, None, ["gpu-node-012"]),
    "node_deleted": (C.NODE_LOST, 1, 1, None, []),
    "gpu_xid_condition_then_exit_1": (C.GPU_FAULT, 1, 11, 1, ["gpu-node-011"]),
    "gpu_xid_label": (C.GPU_FAULT, 0, 0, 134, ["gpu-node-010"]),
    "gpu_unhealthy_device": (C.GPU_FAULT, 3, 3, 1, ["gpu-node-013"]),
    "gpu_xid_in_message": (C.GPU_FAULT, 2, 2, 1, ["gpu-node-012"]),
    "hung_rank_on_xid_node": (C.GPU_FAULT, 3, 3, None, ["gpu-node-013"]),
    "network_fault": (C.NETWORK_FAULT, 3, 3, 134, []),
    "evicted_memory_pressure": (C.EVICTED, 0, 0, 137, []),
    "preempted_pod_then_timeouts": (C.PREEMPTED, 1, 1, 143, []),
    "preempted_by_kueue": (C.PREEMPTED, 0, 0, 143, []),
    "oom_killed_then_nccl": (C.OUT_OF_MEMORY, 1, 1, 137, []),
    "cuda_oom": (C.OUT_OF_MEMORY, 1, 13, 1, []),
    "user_error": (C.USER_ERROR, 0, 5, 1, []),
    "xid_not_configured_user_error": (C.USER_ERROR, 3, 24, 1, []),
    "config_error_image": (C.CONFIG_ERROR, 0, 0, None, []),
    "config_error_secret": (C.CONFIG_ERROR, 0, 0, None, []),
    "checkpoint_corrupt": (C.CHECKPOINT_CORRUPT, 0, 0, 1, []),
    "unknown_segfault": (C.UNKNOWN, 2, 2, 139, []),
    "healthy": (None, None, None, None, []),
    "succeeded": (None, None, None, None, []),
}


def _case(name: str) -> dict[str, Any]:
    folder = CASES / name
    data = {
        kind: load_json(folder / f"{kind}.json")["items"] for kind in ("pods", "nodes", "events")
    }
    rtj = folder / "rtj.json"
    data["health"] = (
        ResilientTrainingJob.from_object(load_json(rtj)).spec.node_health
        if rtj.exists()
        else NodeHealth()
    )
    return data


def _classify(data: dict[str, Any], **overrides: Any) -> Classification | None:
    merged = {**data, **overrides}
    return classify_failure(
        merged["pods"], merged["nodes"], merged["events"], NOW, node_health=merged["health"]
    )


def test_every_fixture_case_has_an_expectation() -> None:
    cases = {p.name for p in CASES.iterdir() if p.is_dir()}
    assert cases == set(EXPECTED)
    assert {e[0] for e in EXPECTED.values()} - {None} == set(FailureClass)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_case(name: str) -> None:
    cls, node_rank, rank, exit_code, quarantine = EXPECTED[name]
    result = _classify(_case(name))
    if cls is None:
        assert result is None
        return
    assert result is not None
    assert result.failure_class is cls, result.evidence
    assert result.first_failed is not None
    assert result.first_failed.node_rank == node_rank
    assert result.first_failed.rank == rank
    assert result.first_failed.exit_code == exit_code
    assert list(result.nodes_to_quarantine) == quarantine
    assert result.evidence, "a classification always explains itself"


@pytest.mark.parametrize("name", [n for n, e in EXPECTED.items() if e[0] is not None])
def test_user_category_never_quarantines(name: str) -> None:
    result = _classify(_case(name))
    assert result is not None
    if result.category is FailureCategory.USER:
        assert result.nodes_to_quarantine == ()
        assert not result.retryable


def test_mixed_oom_then_timeouts_names_the_oom_rank_not_the_timeouts() -> None:
    result = _classify(_case("oom_killed_then_nccl"))
    assert result is not None and result.first_failed is not None
    assert result.first_failed.pod.startswith("llm-a1-worker-0-1-")
    assert any("Watchdog caught collective operation timeout" in e for e in result.evidence)


def test_input_order_does_not_matter() -> None:
    data = _case("gpu_xid_condition_then_exit_1")
    forward = _classify(data)
    backward = _classify(data, pods=list(reversed(data["pods"])), nodes=data["nodes"][::-1])
    assert forward == backward


def test_inputs_are_not_mutated() -> None:
    data = _case("node_lost_not_ready")
    before = copy.deepcopy(data)
    _classify(data)
    assert data == before


def test_unknown_nodes_prove_nothing_about_a_missing_node() -> None:
    data = _case("node_deleted")
    result = _classify(data, nodes=None)
    assert result is not None and result.failure_class is C.NODE_LOST  # pod evidence still says so
    assert result.nodes_to_quarantine == ("gpu-node-011",)  # cannot tell it is gone


def test_image_pull_errors_get_a_grace_period() -> None:
    data = _case("config_error_image")
    scheduled = NOW - CONFIG_ERROR_GRACE + timedelta(seconds=10)
    pods = copy.deepcopy(data["pods"])
    for pod in pods:
        pod["status"]["startTime"] = scheduled.isoformat()
        for cond in pod["status"]["conditions"]:
            cond["lastTransitionTime"] = scheduled.isoformat()
    assert _classify(data, pods=pods) is None


def test_xid_not_in_the_configured_list_is_only_a_note() -> None:
    result = _classify(_case("xid_not_configured_user_error"))
    assert result is not None
    assert any(e.startswith("note:") and "13" in e for e in result.evidence)


def test_configuring_the_xid_makes_it_a_gpu_fault() -> None:
    data = _case("xid_not_configured_user_error")
    result = _classify(data, health=NodeHealth(xid_codes=[13, 79]))
    assert result is not None and result.failure_class is C.GPU_FAULT
    assert result.nodes_to_quarantine == ("gpu-node-013",)


def test_a_hung_rank_on_an_xid_node_explains_the_timeouts() -> None:
    result = _classify(_case("hung_rank_on_xid_node"))
    assert result is not None
    assert result.evidence[0].startswith("root cause before the first failure")


def test_json_contract() -> None:
    result = _classify(_case("cuda_oom"))
    assert result is not None
    body = result.to_json()
    assert set(body) == {
        "class", "category", "retryable", "first_failed", "nodes_to_quarantine", "evidence",
    }  # fmt: skip
    assert body["class"] == "OutOfMemory" and body["category"] == "user"
    assert body["retryable"] is False
    assert {"pod", "rank", "node", "container", "exit_code", "finished_at"} <= set(
        body["first_failed"]
    )
    assert body["first_failed"]["finished_at"] == "2025-03-14T11:20:00Z"


def test_fixture_folder_is_where_the_tests_look() -> None:
    assert Path(CASES / "generate.py").exists()
