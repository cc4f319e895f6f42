"""The goodput soak's JobSet baseline, short (`python -m bench.goodput_baseline` is the
long one, in `make bench`): the trainer's plain checkpoints resume exactly (a torchrun
killed and started again), then the same trainer in a plain JobSet on the pod runner
restarts through RestartJobSet after a killed rank, and resumes silently from a corrupted
newest file: the harness reports the differing final model as a finding, not a failure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import goodput, goodput_baseline
from bench.soak_schedule import Fault
from e2e.operator_proc import REPO

pytestmark = [pytest.mark.demo, pytest.mark.timeout(600)]


def _losses(log: Path) -> dict[int, float]:
    out = {}
    for line in log.read_text().splitlines():
        record = json.loads(line)
        if "loss" in record and "event" not in record:
            out[record["step"]] = record["loss"]  # the newest line of a step wins
    return out


def test_plain_checkpoints_resume_exactly(tmp_path: Path) -> None:
    def torchrun(name: str, *extra: str) -> int:
        return subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone",
             "--nproc-per-node=2", "examples/ddp_train.py",
             f"--plain-checkpoints={tmp_path / name / 'ckpt'}", f"--log-dir={tmp_path / name}",
             "--steps=40", "--save-every=10", *extra],
            cwd=REPO, capture_output=True, timeout=300, check=False,
        ).returncode  # fmt: skip

    assert torchrun("whole") == 0
    assert torchrun("killed", "--fault-kill-step=25") != 0
    assert sorted(p.name for p in (tmp_path / "killed" / "ckpt").iterdir()) == [
        "step-10.pt", "step-20.pt",
    ]  # fmt: skip
    assert torchrun("killed") == 0
    for rank in (0, 1):
        want = _losses(tmp_path / "whole" / f"rank-{rank}.jsonl")
        assert len(want) == 40
        assert _losses(tmp_path / "killed" / f"rank-{rank}.jsonl") == want


def test_the_baseline_restarts_and_resumes_from_a_corrupt_file_unnoticed(tmp_path: Path) -> None:
    opts = goodput.SoakOptions(
        steps=700,
        save_every=50,  # a file before the second fault even when the first world was slow
        work=tmp_path / "soak",
        faults=[Fault(8.0, "rank_killed", 1), Fault(25.0, "corrupt_newest", 0)],
    )
    facts = goodput_baseline.run(opts, cap=240.0)
    sys.stdout.write(json.dumps({k: facts[k] for k in ("goodput", "findings", "problems")}))
    assert facts["problems"] == []
    assert [f["kind"] for f in facts["injected"]] == ["rank_killed", "corrupt_newest"]
    assert all(not f["what"].startswith("skipped") for f in facts["injected"])
    assert "flipped a byte of step-" in facts["injected"][1]["what"]
    assert facts["completed"] == "Completed" and facts["attempts"] == 3
    assert all(r["resumed_attempt"] is not None for r in facts["recoveries"])
    differs = [f for f in facts["findings"] if "the model differs from the no-fault run" in f]
    assert len(differs) == 2, facts["findings"]  # both ranks: the resume trusted the file
    assert 0.0 < facts["goodput"] < 1.0
