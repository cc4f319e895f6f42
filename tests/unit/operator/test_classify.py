"""classify_failure over the real-format fixture corpus (tests/fixtures/classify).

Every folder there is one shape; its case.json holds the expected class, first failed rank
and quarantine decision, and the sources of its strings. This test reads them all.
"""

from __future__ import annotations

import copy
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from rtj_test_support import FIXTURES, NOW, load_json

from rtj_operator.api import FailureCategory, FailureClass, ResilientTrainingJob
from rtj_operator.api.detection_spec import DEFAULT_XID_CODES, NodeHealth
from rtj_operator.policy import xid
from rtj_operator.policy.classify import (
    CONFIG_ERROR_GRACE,
    Classification,
    classify_failure,
    reads_event,
)
from rtj_operator.policy.observed import ReadOnce, read_node, read_pod

CASES = FIXTURES / "classify"
NAMES = sorted(p.name for p in CASES.iterdir() if (p / "case.json").exists())
C = FailureClass


def _case(name: str) -> dict[str, Any]:
    folder = CASES / name
    data: dict[str, Any] = {
        kind: load_json(folder / f"{kind}.json")["items"] for kind in ("pods", "nodes", "events")
    }
    rtj = folder / "rtj.json"
    data["health"] = (
        ResilientTrainingJob.from_object(load_json(rtj)).spec.node_health
        if rtj.exists()
        else NodeHealth()
    )
    data["meta"] = load_json(folder / "case.json")
    platform = folder / "platform.json"
    data["preflight_image"] = load_json(platform)["preflightImage"] if platform.exists() else None
    return data


def _classify(data: dict[str, Any], **overrides: Any) -> Classification | None:
    merged = {**data, **overrides}
    return classify_failure(
        merged["pods"], merged["nodes"], merged["events"], NOW, node_health=merged["health"],
        preflight_image=merged["preflight_image"],
    )  # fmt: skip


def test_the_corpus_is_large_and_covers_every_class() -> None:
    assert len(NAMES) >= 40
    expected = {load_json(CASES / n / "case.json")["expected"]["class"] for n in NAMES}
    # Hang is judged from the ranks' progress reports (reconcile.ranks), never from pods
    from_pods = {c.value for c in FailureClass} - {FailureClass.HANG.value}
    assert expected - {None} == from_pods


def test_every_string_has_a_source_and_every_decision_a_note() -> None:
    sources = (CASES / "SOURCES.md").read_text(encoding="utf-8")
    decisions = (CASES / "DECISIONS.md").read_text(encoding="utf-8")
    for name in NAMES:
        meta = load_json(CASES / name / "case.json")
        assert meta["sources"], name
        assert all(f"`{key}`" in sources for key in meta["sources"]), name
        if meta["decided"]:
            assert f"`{name}`" in decisions, f"{name} is decided but not in DECISIONS.md"


@pytest.mark.parametrize("name", NAMES)
def test_fixture_case(name: str) -> None:
    data = _case(name)
    want = data["meta"]["expected"]
    result = _classify(data)
    # the operator's plans read each pod and node once across plans (ReadOnce): the same
    # verdict, the second time from the views kept
    read = ReadOnce()
    for _ in range(2):
        kept = classify_failure(data["pods"], data["nodes"], data["events"], NOW,
                                node_health=data["health"], read=read,
                                preflight_image=data["preflight_image"])  # fmt: skip
        assert kept == result
    if want["class"] is None:
        assert result is None
        return
    assert result is not None
    assert result.failure_class.value == want["class"], result.evidence
    assert result.first_failed is not None
    assert result.first_failed.node_rank == want["first_failed_node_rank"], result.evidence
    assert result.first_failed.rank == want["first_failed_rank"], result.evidence
    assert result.first_failed.exit_code == want["exit_code"], result.evidence
    assert list(result.nodes_to_quarantine) == want["nodes_to_quarantine"], result.evidence
    assert result.evidence, "a classification always explains itself"
    assert result.decided_by is not None and result.decided_by.signal


def test_quarantine_needs_infrastructure_and_node_evidence() -> None:
    quarantined = suspects = 0
    for name in NAMES:
        result = _classify(_case(name))
        if result is None or result.decided_by is None:
            continue
        if result.nodes_to_quarantine:
            quarantined += 1
            assert result.category is FailureCategory.INFRASTRUCTURE, name
            assert result.decided_by.source != "trainer", name
        if result.decided_by.suspect:
            suspects += 1
            assert result.nodes_to_quarantine == (), name
    assert quarantined >= 10 and suspects >= 2


def test_user_category_never_quarantines_nor_retries() -> None:
    for name in NAMES:
        result = _classify(_case(name))
        if result is not None and result.category is FailureCategory.USER:
            assert result.nodes_to_quarantine == () and not result.retryable, name


def test_the_default_xid_list_is_the_catalogs() -> None:
    assert xid.catalog_quarantine_codes() == DEFAULT_XID_CODES
    assert {13, 31, 43, 45, 63, 92, 94} & set(DEFAULT_XID_CODES) == set()
    assert {48, 74, 79, 95, 119} <= set(DEFAULT_XID_CODES)
    assert xid.application_codes() >= {13, 31, 43, 94}


@pytest.mark.parametrize(
    ("text", "codes"),
    [
        (
            "NVRM: Xid (PCI:0000:3b:00): 79, pid=3121, name=python, GPU has fallen off the bus.",
            {79},
        ),
        ("ErrorCode:48 PCI:0000:9d:00 XID 48; Resolution: COMPONENT_RESET", {48}),
        ("detected XID-79 on the instance", {79}),
        ("NvidiaXID13Warning: detected unknown XID-13 on the instance", {13}),
        ("NvidiaXID95Error", {95}),
        ("ErrorCode:145.RLW PCI:0000:9d:00", {145}),
        ("ErrorCode:DCGM_FR_VOLATILE_DBE_DETECTED GPU:3 PCI:0000:9d:00.0", set()),
        ("NVRM: Xid (0000:01:00): 3, C 00000005 SC 00000007", {3}),
    ],
)
def test_an_xid_is_read_in_every_spelling(text: str, codes: set[int]) -> None:
    assert xid.xid_codes(text) == codes


def test_a_trainers_xid_text_is_a_suspect_and_quarantines_nothing() -> None:
    result = _classify(_case("xid_text_only_suspect"))
    assert result is not None and result.failure_class is C.GPU_FAULT
    assert result.decided_by is not None and result.decided_by.suspect
    assert result.nodes_to_quarantine == ()
    assert any("suspect" in line for line in result.evidence)


def test_node_evidence_turns_the_suspect_into_a_quarantine() -> None:
    data = _case("xid_text_only_suspect")
    nodes = copy.deepcopy(data["nodes"])
    nodes[2]["status"]["conditions"].append(
        copy.deepcopy(_case("nvsentinel_xid79_condition")["nodes"][1]["status"]["conditions"][-1])
    )
    result = _classify(data, nodes=nodes)
    assert result is not None and result.nodes_to_quarantine == ("gpu-node-012",)


def test_a_launchers_traceback_alone_is_not_a_user_error() -> None:
    for name in (
        "torchrun_sigabrt_summary_only",
        "torchrun_sigkill_no_oom",
        "torchrun_exit1_no_traceback",
    ):
        result = _classify(_case(name))
        assert result is not None and result.failure_class is C.UNKNOWN, name
        message = next(p for p in _case(name)["pods"] if p["status"]["phase"] == "Failed")
        text = message["status"]["containerStatuses"][0]["state"]["terminated"]["message"]
        assert "Traceback (most recent call last)" in text or "ChildFailedError" in text


def test_messages_keep_at_most_what_the_kubelet_keeps() -> None:
    for name in NAMES:
        for pod in _case(name)["pods"]:
            for status in pod["status"].get("containerStatuses", []):
                message = status.get("state", {}).get("terminated", {}).get("message", "")
                assert len(message.encode()) <= 2048 and message.count("\n") < 80, name


def test_a_dead_nodes_heartbeat_precedes_its_peers_transport_errors() -> None:
    data = _case("node_lost_heartbeat_before_peers")
    result = _classify(data)
    assert result is not None and result.failure_class is C.NODE_LOST
    peers = [p for p in data["pods"] if p["status"]["phase"] == "Failed"]
    first_peer = min(
        p["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"] for p in peers
    )
    assert result.failed_at is not None and result.failed_at.isoformat() < first_peer.replace(
        "Z", "+00:00"
    )


def test_a_healthy_when_true_condition_is_not_a_fault() -> None:
    data = _case("eks_ready_true_user_error")
    result = _classify(data)
    assert result is not None and result.failure_class is C.USER_ERROR
    flipped = copy.deepcopy(data["nodes"])
    for cond in flipped[0]["status"]["conditions"]:
        if cond["type"] == "AcceleratedHardwareReady":
            cond.update(status="False", reason="NvidiaXID79Error")
    result = _classify(data, nodes=flipped)
    assert result is not None and result.failure_class is C.GPU_FAULT


def test_an_xid_not_in_the_list_is_only_a_note() -> None:
    result = _classify(_case("npd_custom_xid13_condition"))
    assert result is not None and result.failure_class is C.USER_ERROR
    assert any(e.startswith("note:") and "13" in e for e in result.evidence)


def test_configuring_the_xid_makes_it_a_gpu_fault() -> None:
    data = _case("npd_custom_xid13_condition")
    health = data["health"].model_copy(update={"xid_codes": [13, 79]})
    result = _classify(data, health=health)
    assert result is not None and result.failure_class is C.GPU_FAULT
    assert result.nodes_to_quarantine == ("gpu-node-013",)


def test_an_init_crash_never_marks_the_checkpoint_corrupt() -> None:
    data = _case("checkpoint_corrupt")
    pods = copy.deepcopy(data["pods"])
    for pod in pods:
        state = pod["status"]["initContainerStatuses"][0]["state"]["terminated"]
        state["message"] = (
            "Traceback (most recent call last):\nModuleNotFoundError: No module named 'boto3'"
        )
    result = _classify(data, pods=pods)
    assert result is not None and result.failure_class is not C.CHECKPOINT_CORRUPT


@pytest.mark.parametrize("name", NAMES)
def test_an_event_reader_filtering_with_reads_event_loses_nothing(name: str) -> None:
    data = _case(name)
    kept = [e for e in data["events"] if reads_event(e)]
    assert _classify(data, events=kept) == _classify(data)


def test_reads_event_ignores_the_noise() -> None:
    noise = {"involvedObject": {"kind": "Pod", "name": "p"}, "reason": "Pulled",
             "message": 'Successfully pulled image "x" in 1.2s'}  # fmt: skip
    assert not reads_event(noise)
    stopped = {"regarding": {"kind": "JobSet", "name": "llm-a1"}, "reason": "Stopped",
               "note": "Exceeded the PodsReady timeout team-a/jobset-llm-a1-5c1e2"}  # fmt: skip
    assert reads_event(stopped)


def test_input_order_does_not_matter() -> None:
    data = _case("nvsentinel_xid79_condition")
    forward = _classify(data)
    backward = _classify(data, pods=list(reversed(data["pods"])), nodes=data["nodes"][::-1])
    assert forward == backward


def test_inputs_are_not_mutated() -> None:
    data = _case("node_lost_not_ready")
    before = copy.deepcopy(data)
    _classify(data)
    assert data == before


def test_unknown_nodes_prove_nothing_about_a_missing_node() -> None:
    result = _classify(_case("node_deleted"), nodes=None)
    assert result is not None and result.failure_class is C.NODE_LOST  # PodGC's condition
    assert result.nodes_to_quarantine == ()


def test_image_pull_errors_get_a_grace_period() -> None:
    data = _case("image_not_found")
    scheduled = NOW - CONFIG_ERROR_GRACE + timedelta(seconds=10)
    pods = copy.deepcopy(data["pods"])
    for pod in pods:
        pod["status"]["startTime"] = scheduled.isoformat()
        for cond in pod["status"]["conditions"]:
            cond["lastTransitionTime"] = scheduled.isoformat()
    assert _classify(data, pods=pods) is None


def test_a_hung_rank_on_an_xid_node_explains_the_timeouts() -> None:
    result = _classify(_case("hung_rank_on_xid_node"))
    assert result is not None
    assert result.evidence[0].startswith("root cause before the first failure")


def test_json_contract() -> None:
    result = _classify(_case("cuda_oom"))
    assert result is not None
    body = result.to_json()
    assert set(body) == {
        "class",
        "category",
        "retryable",
        "first_failed",
        "nodes_to_quarantine",
        "decided_by",
        "evidence",
    }
    assert body["class"] == "OutOfMemory" and body["category"] == "user"
    assert body["retryable"] is False
    assert {"pod", "rank", "node", "container", "exit_code", "finished_at"} <= set(
        body["first_failed"]
    )
    assert body["first_failed"]["finished_at"] == "2025-03-14T11:20:00Z"
    assert set(body["decided_by"]) == {"signal", "source", "rule", "suspect"}


def test_generate_py_is_how_the_corpus_is_built() -> None:
    assert Path(CASES / "generate.py").exists()
    assert re.search(r"def main\(\)", (CASES / "generate.py").read_text(encoding="utf-8"))


def test_read_once_reads_an_object_once_and_a_new_object_afresh() -> None:
    data = _case(NAMES[0])
    pod, node = data["pods"][0], data["nodes"][0]
    read = ReadOnce()
    assert read.pod(pod) is read.pod(pod) and read.pod(pod) == read_pod(pod)
    assert read.node(node) is read.node(node) and read.node(node) == read_node(node)
    # the watch cache stores a changed pod as a new object: a new object is read again
    changed = {**pod, "status": {**pod["status"], "phase": "Failed", "reason": "Evicted"}}
    assert read.pod(changed).phase == "Failed" and read.pod(pod).phase == pod["status"]["phase"]
    small = ReadOnce(limit=2)
    views = [small.pod({**pod}) for _ in range(5)]  # past its limit it starts again: bounded
    assert len(small._pods) <= 2 and all(v == views[0] for v in views)


def test_a_root_image_refused_by_the_kubelet_names_the_fields_to_change() -> None:
    result = _classify(_case("config_error_runs_as_root"))
    assert result is not None and result.failure_class is C.CONFIG_ERROR
    assert "spec.template.spec.securityContext.runAsUser" in result.evidence[0], result.evidence
