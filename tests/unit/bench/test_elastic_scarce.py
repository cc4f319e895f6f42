"""The scarce-capacity benchmark's judgement of a run (`bench.elastic_scarce.judge`) and the
exactly-once check it shares with the elastic drill (`e2e.demo.elastic_logs`)."""

from __future__ import annotations

from typing import Any

import pytest

from bench.elastic_scarce import Settings, judge
from e2e.demo.elastic_logs import epochs_exactly_once


def _rec(step: int, rank: int, world: int, t: float, samples: list[int]) -> dict[str, Any]:
    return {"step": step, "rank": rank, "world": world, "time": t, "loss": 1.0 / step,
            "epoch": (step - 1) // 2, "samples": samples, "generation": 0,
            "attempt": 1}  # fmt: skip


def _run() -> tuple[dict[int, list[dict[str, Any]]], list[dict[str, Any]]]:
    """Four steps of a 4-sample epoch, 2 samples a step: a world of 2, then 1 (after a
    10 s stall, step 3 trained twice), then 2."""
    records = {
        1: [_rec(1, 0, 2, 1.0, [0]), _rec(1, 1, 2, 1.0, [1])],
        2: [_rec(2, 0, 2, 2.0, [2]), _rec(2, 1, 2, 2.0, [3])],
        3: [_rec(3, 0, 1, 12.0, [0, 1])],
        4: [_rec(4, 0, 2, 13.0, [2]), _rec(4, 1, 2, 13.0, [3])],
    }
    rank0 = [r for recs in records.values() for r in recs if r["rank"] == 0]
    return records, [*rank0, _rec(3, 0, 2, 3.0, [0])]  # step 3 first trained before the fault


def test_a_run_is_judged_from_its_newest_records() -> None:
    records, trained = _run()
    s = Settings(workers=2, steps=4)
    clean = {1: 1.0, 2: 0.5, 3: 1 / 3, 4: 0.25 + 0.01}
    run = judge("elastic", s, records, trained, {"attempts": [{}]}, 20.0, None, clean)
    assert run.steps_by_world == {1: 1, 2: 3}
    assert run.longest_gap_seconds == 10.0
    assert run.trained_again == 1
    assert run.epochs_not_once == []
    assert run.max_loss_drift == pytest.approx(0.01)


def test_a_run_missing_a_step_is_an_error() -> None:
    records, trained = _run()
    del records[3]
    with pytest.raises(RuntimeError, match=r"not 1\.\.4"):
        judge("waiting", Settings(workers=2, steps=4), records, trained, {}, 1.0, None, {})


def test_a_sample_consumed_twice_is_named_by_its_epoch() -> None:
    records, _ = _run()
    records[4] = [_rec(4, 0, 2, 13.0, [2]), _rec(4, 1, 2, 13.0, [2])]
    assert epochs_exactly_once(records, samples=4, global_batch=2) == ["epoch 1"]
