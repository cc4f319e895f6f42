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
