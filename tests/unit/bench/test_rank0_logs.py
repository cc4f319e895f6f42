"""Rank 0's log records as the recovery benches read them (bench/rank0_logs.py)."""

from __future__ import annotations

import json
from pathlib import Path

from bench import rank0_logs


def test_the_first_step_after_a_resume_and_the_newest_step(tmp_path: Path) -> None:
    first = tmp_path / "pod-a" / "rank-0.jsonl"
    second = tmp_path / "pod-b" / "rank-0.jsonl"
    for f in (first, second):
        f.parent.mkdir()
    lines = [{"step": 1, "loss": 0.5, "time": 10.0}, {"step": 2, "loss": 0.4, "time": 11.0}]
    first.write_text("\n".join(json.dumps(r) for r in lines) + '\n{"step": 3, "lo')  # cut off
    again = [
        {"event": "restore", "step": 1, "source": "fast-tier", "time": 20.0},
        {"step": 2, "loss": 0.4, "time": 21.5},
        {"step": 3, "loss": 0.3, "time": 22.0},
    ]
    second.write_text("\n".join(json.dumps(r) for r in again) + "\n")
    recs = rank0_logs.records(tmp_path, "pod-*/rank-0.jsonl")
    assert [r["time"] for r in recs] == [10.0, 11.0, 20.0, 21.5, 22.0]
    assert rank0_logs.last_step(recs) == 3
    assert rank0_logs.resumed(recs, 15.0) == (1, 21.5, "fast-tier")
    assert rank0_logs.resumed(recs, 20.5) is None, "no restore after the moment"
    assert rank0_logs.resumed(recs[:3], 15.0) is None, "restored, no step yet"
