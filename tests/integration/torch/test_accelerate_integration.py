"""Hugging Face Accelerate with ``PublishingState``: two processes (torchrun, gloo, CPU)
train with shuffled data and dropout, publishing ``accelerator.save_state`` every 4 steps;
the whole process group is SIGKILLed after step 10 (step 8 published, 12 not yet), the
same command resumes (``accelerator.load_state`` of the newest step that verifies, the
epoch's first batches skipped with ``accelerator.skip_first_batches``) and ends with a
model equal bit for bit to an uninterrupted run's, every step's loss on both ranks too.

Exact because the checkpoint holds everything that decides a step here (weights, AdamW
moments, the LR schedule, every process's RNG states), the seedable sampler draws each
epoch's shuffle from its seed and the epoch, and the DataLoader has its own generator (its
per-iterator base seed would otherwise come from the restored global RNG).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from worker_runs import Worker, assert_same_model, final_model, killed_copy, published

from rtj_shim.checkpoint.layout import step_key

WORKER = Worker(Path(__file__).with_name("accelerate_worker.py"))
TOTAL, KILL_AT = 16, 10

# one xdist worker runs the module: the runs fixture is computed once
pytestmark = pytest.mark.xdist_group("accelerate-integration")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """An uninterrupted run, and a store left by a run killed after step KILL_AT."""
    tmp = tmp_path_factory.mktemp("accelerate")
    full, _ = WORKER.run(f"file://{tmp}/full", tmp / "out-full")
    WORKER.run_killed(f"file://{tmp}/killed", tmp / "out-killed", KILL_AT)
    return {"tmp": tmp, "full": full, "model": final_model(tmp / "out-full")}


def test_uninterrupted_run_publishes_and_retention_bounds_the_store(runs: dict[str, Any]) -> None:
    root = f"file://{runs['tmp']}/full"
    assert published(root) == [(12, True), (16, True)]  # 4, 8, 12, 16 saved; keep_last=2
    files = {p.name for p in (runs["tmp"] / "full" / step_key(16)).iterdir()}
    assert {"model.safetensors", "optimizer.bin", "scheduler.bin",
            "random_states_0.pkl", "random_states_1.pkl"} <= files  # fmt: skip
    assert [sorted(map(int, r)) for r in runs["full"]["losses"]] == [list(range(1, 17))] * 2


def test_sigkilled_run_resumes_to_the_uninterrupted_model_bit_for_bit(
    runs: dict[str, Any],
) -> None:
    root, out = killed_copy(runs["tmp"], "resume")
    assert published(root) == [(4, True), (8, True)]  # killed after 10: 12 never written
    resumed, err = WORKER.run(root, out)
    line = f"rtj_shim: resuming step 8 from {root}/steps/step-000000000008 (newest verified)"
    assert line in err, err[-4000:]
    assert (resumed["restored"], resumed["skipped"]) == (8, [])
    for rank in (0, 1):  # steps 9-16 on each rank: the uninterrupted run's losses exactly
        assert sorted(map(int, resumed["losses"][rank])) == list(range(9, TOTAL + 1))
        for step, loss in resumed["losses"][rank].items():
            assert loss == runs["full"]["losses"][rank][step], (rank, step)
    assert_same_model(final_model(out), runs["model"])
    assert published(root) == [(12, True), (16, True)]  # retention, after the resume too


def test_a_corrupt_newest_step_is_skipped_with_the_reason(runs: dict[str, Any]) -> None:
    root, out = killed_copy(runs["tmp"], "corrupt")
    weights = runs["tmp"] / "corrupt" / step_key(8) / "model.safetensors"
    raw = bytearray(weights.read_bytes())
    raw[-3] ^= 0xFF  # same size: only deep verification notices
    weights.write_bytes(bytes(raw))

    resumed, err = WORKER.run(root, out)
    assert resumed["restored"] == 4
    assert [step for step, _ in resumed["skipped"]] == [8]
    reason = resumed["skipped"][0][1]
    assert "model.safetensors" in reason, reason
    assert f"resume: skipped step 8: {reason}" in err  # the warning, on stderr
    assert "rtj_shim: resuming step 4 from" in err and "1 newer step(s) skipped" in err
    for rank in (0, 1):
        assert sorted(map(int, resumed["losses"][rank])) == list(range(5, TOTAL + 1))
        for step, loss in resumed["losses"][rank].items():
            assert loss == runs["full"]["losses"][rank][step], (rank, step)
    assert_same_model(final_model(out), runs["model"])
    assert published(root) == [(12, True), (16, True)]  # the corrupt 8 replaced, then trimmed
