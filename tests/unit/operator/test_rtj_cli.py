"""`rtj classify` prints the classification JSON for kubectl-style input files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rtj_test_support import FIXTURES

from rtj_operator.cli import main

CASES = FIXTURES / "classify"


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, object]]:
    code = main(["classify", *args, "--now", "2025-03-14T12:00:00Z"])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else {}


def test_classify_prints_the_contract(capsys: pytest.CaptureFixture[str]) -> None:
    case = CASES / "nvsentinel_xid79_condition"
    code, body = _run(
        capsys,
        "--pods", str(case / "pods.json"),
        "--nodes", str(case / "nodes.json"),
        "--events", str(case / "events.json"),
    )  # fmt: skip
    assert code == 0
    assert body["class"] == "GPUFault" and body["category"] == "infrastructure"
    assert body["retryable"] is True
    assert body["nodes_to_quarantine"] == ["gpu-node-011"]
    first = body["first_failed"]
    assert isinstance(first, dict) and first["node"] == "gpu-node-011" and first["rank"] == 11


def test_classify_uses_the_jobs_node_health(capsys: pytest.CaptureFixture[str]) -> None:
    case = CASES / "platform_xid_label"
    args = ["--pods", str(case / "pods.json"), "--nodes", str(case / "nodes.json")]
    _, without = _run(capsys, *args)
    _, with_rtj = _run(capsys, *args, "--rtj", str(case / "rtj.json"))
    assert without["class"] == "UserError"  # an illegal memory access, no node evidence read
    assert with_rtj["class"] == "GPUFault" and with_rtj["nodes_to_quarantine"] == ["gpu-node-010"]


def test_classify_nothing_failed(capsys: pytest.CaptureFixture[str]) -> None:
    code, body = _run(capsys, "--pods", str(CASES / "healthy" / "pods.json"))
    assert code == 0 and body["class"] is None and body["nodes_to_quarantine"] == []


def test_classify_rejects_garbage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "pods.json"
    bad.write_text('"just a string"')
    assert main(["classify", "--pods", str(bad)]) == 2
    assert "expected a Kubernetes List" in capsys.readouterr().err
    assert main(["classify", "--pods", str(tmp_path / "missing.json")]) == 2
    # the job's own manifest given as pods: refused, not classified as "nothing failed"
    job = tmp_path / "job.json"
    manifest = {"apiVersion": "training.resilient.dev/v1alpha1",
                "kind": "ResilientTrainingJob", "metadata": {"name": "llm"}}  # fmt: skip
    job.write_text(json.dumps(manifest))
    assert main(["classify", "--pods", str(job)]) == 2
    assert "item 0 is a ResilientTrainingJob; expected Pods, Nodes or Events" in (
        capsys.readouterr().err
    )


def _dump(tmp: Path, name: str, items: list[object], api: str = "v1") -> Path:
    path = tmp / name
    body = {"apiVersion": api, "kind": "List", "metadata": {"resourceVersion": ""}, "items": items}
    path.write_text(json.dumps(body))
    return path


def _items(case: Path, kind: str) -> list[object]:
    body = json.loads((case / f"{kind}.json").read_text())
    items = body["items"]
    assert isinstance(items, list)
    return items


def test_classify_reads_one_mixed_dump_and_both_event_apis(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kubectl get pods,nodes -o json` in one file; the scheduler's events.k8s.io/v1 event
    beside core/v1 ones; the same event listed through both APIs counts once."""
    case = CASES / "node_lost_not_ready"
    everything = _dump(tmp_path, "all.json", [*_items(case, "pods"), *_items(case, "nodes")])
    core = _items(case, "events")
    as_v1 = [
        {
            "apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": e["metadata"],  # type: ignore[index]
            "eventTime": None, "reason": e["reason"], "note": e["message"], "type": e["type"],  # type: ignore[index]
            "regarding": e["involvedObject"], "reportingController": "node-controller",  # type: ignore[index]
            "deprecatedFirstTimestamp": e["firstTimestamp"],  # type: ignore[index]
        }
        for e in core
    ]  # fmt: skip
    events = _dump(tmp_path, "events.json", [*core, *as_v1])
    _, one = _run(capsys, "--pods", str(everything), "--events", str(events))
    _, apart = _run(
        capsys,
        "--pods", str(case / "pods.json"), "--nodes", str(case / "nodes.json"),
        "--events", str(case / "events.json"),
    )  # fmt: skip
    assert one == apart
    assert one["class"] == "NodeLost" and one["nodes_to_quarantine"] == ["gpu-node-012"]


def test_classify_reads_events_k8s_io_alone(capsys: pytest.CaptureFixture[str]) -> None:
    case = CASES / "preempted_pod_then_timeouts"
    assert {e["apiVersion"] for e in _items(case, "events")} == {"events.k8s.io/v1"}  # type: ignore[index]
    _, body = _run(
        capsys,
        "--pods", str(case / "pods.json"), "--nodes", str(case / "nodes.json"),
        "--events", str(case / "events.json"),
    )  # fmt: skip
    assert body["class"] == "Preempted"
    assert any("Preempted by pod" in line for line in body["evidence"])  # type: ignore[union-attr]


def test_classify_says_which_signal_decided_and_why(capsys: pytest.CaptureFixture[str]) -> None:
    case = CASES / "xid_text_only_suspect"
    args = ["--pods", str(case / "pods.json"), "--nodes", str(case / "nodes.json")]
    _, body = _run(capsys, *args)
    decided = body["decided_by"]
    assert isinstance(decided, dict) and decided["source"] == "trainer" and decided["suspect"]
    code = main(["classify", *args, "--now", "2025-03-14T12:00:00Z", "--output", "text"])
    text = capsys.readouterr().out
    assert code == 0
    assert "class:      GPUFault (infrastructure, retried)" in text
    assert "decided by: pod llm-a1-worker-0-2-r2v8n container trainer" in text
    assert "not quarantined" in text and "quarantine: none" in text


def test_classify_text_when_nothing_failed(capsys: pytest.CaptureFixture[str]) -> None:
    main(["classify", "--pods", str(CASES / "healthy" / "pods.json"), "-o", "text"])
    assert capsys.readouterr().out == "no failed pod: nothing to classify\n"


def test_classify_blames_no_node_for_a_trainers_hook_words(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 42: a trainer that prints the NVIDIA hook's words and exits 127 is not the runtime."""
    case = CASES / "nvidia_hook_words_from_the_trainer"
    args = ["--pods", str(case / "pods.json"), "--nodes", str(case / "nodes.json")]
    code, body = _run(capsys, *args)
    assert code == 0 and body["nodes_to_quarantine"] == []
    assert body["class"] == "Unknown"
    decided = body["decided_by"]
    assert isinstance(decided, dict) and decided["source"] == "trainer"
    first = body["first_failed"]
    assert isinstance(first, dict) and first["exit_code"] == 127


def test_classify_prints_the_same_contract_as_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    case = CASES / "nvsentinel_xid79_condition"
    args = ["classify", "--pods", str(case / "pods.json"), "--nodes", str(case / "nodes.json"),
            "--events", str(case / "events.json"), "--now", "2025-03-14T12:00:00Z"]  # fmt: skip
    assert main([*args, "-o", "yaml"]) == 0
    as_yaml = yaml.safe_load(capsys.readouterr().out)
    assert main(args) == 0
    assert as_yaml == json.loads(capsys.readouterr().out)
