"""The classifier over pods recorded from a real kubelet (tests/fixtures/recorded/real-kubelet):
shapes the kubelet and containerd wrote, not ones we generated."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from rtj_test_support import FIXTURES

from rtj_operator.policy.classify import classify_failure

RECORDED = FIXTURES / "recorded" / "real-kubelet"
CASES: dict[str, dict[str, Any]] = json.loads((RECORDED / "cases.json").read_text())


def _pod(name: str) -> dict[str, Any]:
    return json.loads((RECORDED / f"{name}.json").read_text())  # type: ignore[no-any-return]


def _finished(pod: dict[str, Any], container: str) -> datetime:
    status = next(s for s in pod["status"]["containerStatuses"] if s["name"] == container)
    finished = status["state"]["terminated"]["finishedAt"]
    return datetime.fromisoformat(finished.replace("Z", "+00:00"))


def test_every_recording_has_a_case_and_every_case_a_recording() -> None:
    assert {p.stem for p in RECORDED.glob("*.json")} - {"cases"} == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_recorded_pod_is_classified_as_its_case_says(name: str) -> None:
    case, pod = CASES[name], _pod(name)
    now = _finished(pod, case["container"]) + timedelta(seconds=5)
    found = classify_failure([pod], None, [], now)
    assert found is not None and found.first_failed is not None, name
    assert found.failure_class.value == case["class"], (name, found.evidence)
    assert found.first_failed.container == case["container"]
    assert found.first_failed.exit_code == case["exit_code"]
    assert not found.nodes_to_quarantine, "no node is blamed for what a container did"


def test_the_recordings_are_what_the_kubelet_wrote() -> None:
    """Guards the corpus itself: each recording carries the shape its case names."""
    for name, case in CASES.items():
        pod = _pod(name)
        status = next(
            s for s in pod["status"]["containerStatuses"] if s["name"] == case["container"]
        )
        terminated = status["state"]["terminated"]
        assert terminated["reason"] == case["reason"], name
        assert terminated["exitCode"] == case["exit_code"], name
        assert pod["spec"]["nodeName"] == "real-node-0", name
        assert Path(RECORDED / f"{name}.json").read_text().endswith("\n")
