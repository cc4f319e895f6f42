"""DeepSpeed with ``PublishingEngine``: two processes (torchrun, gloo, CPU with
``DS_ACCELERATOR=cpu``) train with ZeRO stage 2, AdamW, WarmupLR and dropout, publishing
``engine.save_checkpoint`` every 4 steps; the whole process group is SIGKILLed after step
10 (step 8 published, 12 not yet), the same command resumes (``engine.load_checkpoint`` of
the newest step that verifies) and ends with a model equal bit for bit to an uninterrupted
run's, every step's loss on both ranks too. A corrupted newest step is skipped with the
reason; retention bounds the store; a world of another size is refused before it loads.

Exact because the checkpoint holds what DeepSpeed decides a step with (the fp32 weights,
each rank's ZeRO partition of the AdamW moments, the schedule, the engine's counters) and
the worker draws each step's batch and dropout masks from the step and the rank (DeepSpeed
saves no RNG state).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from worker_runs import Worker, assert_same_model, final_model, killed_copy, published

from rtj_shim.checkpoint.layout import step_key
from rtj_shim.checkpoint.manifest import decode_manifest

WORKER = Worker(Path(__file__).with_name("deepspeed_worker.py"), env={"DS_ACCELERATOR": "cpu"})
TOTAL, KILL_AT = 16, 10

# one xdist worker runs the module: the runs fixture is computed once
pytestmark = pytest.mark.xdist_group("deepspeed-integration")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """An uninterrupted run, and a store left by a run killed after step KILL_AT."""
    tmp = tmp_path_factory.mktemp("deepspeed")
    full, _ = WORKER.run(f"file://{tmp}/full", tmp / "out-full")
    WORKER.run_killed(f"file://{tmp}/killed", tmp / "out-killed", KILL_AT)
    return {"tmp": tmp, "full": full, "model": final_model(tmp / "out-full")}


def test_uninterrupted_run_publishes_and_retention_bounds_the_store(runs: dict[str, Any]) -> None:
    root = f"file://{runs['tmp']}/full"
    assert published(root) == [(12, True), (16, True)]  # 4, 8, 12, 16 saved; keep_last=2
    files = {p.name for p in (runs["tmp"] / "full" / step_key(16)).iterdir()}
    assert {"mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
            "zero_pp_rank_1_mp_rank_00_optim_states.pt"} <= files  # fmt: skip
    assert "latest" not in files  # DeepSpeed's marker is not ours: the publish is
    manifest = decode_manifest((runs["tmp"] / "full" / step_key(16) / "manifest.json").read_bytes())
    assert manifest.framework.name == "deepspeed" and manifest.parallelism == {"dp": 2, "mp": 1}
    assert manifest.extra["zero_stage"] == 2
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
    assert resumed["client_state"]["last_loss"] == runs["full"]["losses"][0]["8"]
    for rank in (0, 1):  # steps 9-16 on each rank: the uninterrupted run's losses exactly
        assert sorted(map(int, resumed["losses"][rank])) == list(range(9, TOTAL + 1))
        for step, loss in resumed["losses"][rank].items():
            assert loss == runs["full"]["losses"][rank][step], (rank, step)
    assert_same_model(final_model(out), runs["model"])
    assert published(root) == [(12, True), (16, True)]  # retention, after the resume too


def test_a_corrupt_newest_step_is_skipped_with_the_reason(runs: dict[str, Any]) -> None:
    root, out = killed_copy(runs["tmp"], "corrupt")
    part = runs["tmp"] / "corrupt" / step_key(8) / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    raw = bytearray(part.read_bytes())
    raw[-3] ^= 0xFF  # same size: only deep verification notices
    part.write_bytes(bytes(raw))

    resumed, err = WORKER.run(root, out)
    assert resumed["restored"] == 4
    assert [step for step, _ in resumed["skipped"]] == [8]
    reason = resumed["skipped"][0][1]
    assert "zero_pp_rank_1_mp_rank_00_optim_states.pt" in reason, reason
    assert f"resume: skipped step 8: {reason}" in err  # the warning, on stderr
    for rank in (0, 1):
        assert sorted(map(int, resumed["losses"][rank])) == list(range(5, TOTAL + 1))
        for step, loss in resumed["losses"][rank].items():
            assert loss == runs["full"]["losses"][rank][step], (rank, step)
    assert_same_model(final_model(out), runs["model"])


def test_a_world_of_another_size_is_refused_before_it_loads(runs: dict[str, Any]) -> None:
    root, out = killed_copy(runs["tmp"], "resized")
    proc = WORKER.launch(root, out, ranks=1)
    _, stderr = proc.communicate(timeout=180)
    assert proc.returncode != 0
    assert (
        "step 8 cannot be loaded by this world (parallelism.dp: ZeRO stage 2 partitions "
        "saved by 2 data-parallel ranks, this world has 1)" in stderr
    ), stderr[-4000:]
    assert "Universal Checkpoint" in stderr
    assert published(root) == [(4, True), (8, True)]  # nothing lost, nothing written
