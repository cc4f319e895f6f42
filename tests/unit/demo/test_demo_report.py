"""The demo's summary and loss plot (pure)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from e2e.demo.report import format_summary, loss_svg, parse_losses, restore_step, summarize

STATUS = {
    "phase": "Succeeded",
    "attempt": 2,
    "attempts": [
        {"attempt": 1, "failureClass": "GPUFault", "detectionSeconds": 0.5,
         "recoverySeconds": 2.5, "lostSteps": 0, "evidence": ["XID 79"],
         "firstFailed": {"pod": "p1", "node": "n0", "nodeRank": 1}},
        {"attempt": 2, "resumedFromStep": 80},
    ],
    "quarantinedNodes": [{"node": "n0"}],
}  # fmt: skip


def lines(records: list[dict[str, object]]) -> list[str]:
    return [json.dumps(r) for r in records]


def test_parse_losses_skips_events_and_a_torn_last_line() -> None:
    text = [*lines([{"event": "restore", "step": 80}, {"step": 81, "loss": 0.25}]), '{"step": 8']
    assert parse_losses(text) == [(81, 0.25)]
    assert restore_step(text) == 80


def test_summary_takes_its_numbers_from_the_status() -> None:
    losses = {1: [(s, 1.0 / s) for s in range(1, 101)], 2: [(s, 1.0 / s) for s in range(81, 121)]}
    s = summarize("job", STATUS, losses, restored_step=80, new_pods_running_seconds=3.0)
    assert (s.failure_class, s.first_failed_rank, s.first_failed_node) == ("GPUFault", 1, "n0")
    assert (s.detection_seconds, s.recovery_seconds) == (0.5, 2.5)
    assert (s.last_step_before_fault, s.resumed_from_step, s.steps_recomputed) == (100, 80, 20)
    assert s.losses_continue and s.final_step == 120 and s.tainted_nodes == ["n0"]
    text = format_summary(s, losses, "NAME  PHASE\njob   Succeeded\n")
    assert "detection        0.50 s" in text and "20 steps recomputed" in text
    assert "job   Succeeded" in text


def test_loss_svg_marks_fault_and_resume() -> None:
    losses = {1: [(1, 1.0), (2, 0.5)], 2: [(2, 0.5), (3, 0.25)]}
    root = ET.fromstring(loss_svg(losses, fault_step=2, resume_step=1, title="t <&>"))
    ns = "{http://www.w3.org/2000/svg}"
    assert len(root.findall(f"{ns}polyline")) == 2
    texts = [t.text for t in root.findall(f"{ns}text")]
    assert "fault (step 2)" in texts and "resume (step 1)" in texts and "t <&>" in texts
    with pytest.raises(ValueError, match="no losses"):
        loss_svg({}, fault_step=None, resume_step=None, title="x")
