"""The goodput soak, short (`python -m bench.goodput` is the long one, in `make bench`):
real training through the operator, a hang and then a corrupted newest checkpoint with a
rank killed, and every invariant the soak checks: the final model equals a no-fault run
bit for bit, never two worlds at once, resumes only from pinned unflagged steps, nothing
leaked, and a goodput figure computed from the trainer's own logs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench import goodput
from bench.soak_schedule import Fault

pytestmark = [pytest.mark.demo, pytest.mark.timeout(900)]


def test_the_soak_survives_a_hang_and_a_corrupt_checkpoint_bit_for_bit(tmp_path: Path) -> None:
    opts = goodput.SoakOptions(
        steps=1500,
        save_every=100,
        work=tmp_path / "soak",
        faults=[Fault(15.0, "hang", 1), Fault(80.0, "corrupt_newest", 0)],
    )
    facts = goodput.run(opts)
    goodput.write_report(tmp_path / "report", facts, opts, goodput.machine())
    sys.stdout.write((tmp_path / "report" / "goodput.md").read_text())
    assert facts["problems"] == []
    kinds = [f["kind"] for f in facts["injected"]]
    assert kinds == ["hang", "corrupt_newest"], facts["injected"]
    assert all(not f["what"].startswith("skipped") for f in facts["injected"])
    classes = [r.get("failureClass") for r in facts["records"]]
    assert "Hang" in classes and "CheckpointCorrupt" in classes, classes
    assert 0.0 < facts["goodput"] < 1.0
    assert (tmp_path / "report" / "goodput-timeline.svg").read_text().count("<polyline") >= 3
