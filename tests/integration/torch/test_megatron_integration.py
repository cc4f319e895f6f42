"""Megatron Core's distributed checkpoints with ``PublishingDistCheckpoint``: two processes
(torchrun, gloo, CPU) with tensor parallelism 2 train a column/row-parallel MLP by SGD with
momentum, Megatron's ``dist_checkpointing`` saving the weights and momentum as sharded
tensors every 4 steps; the whole process group is SIGKILLed after step 10 (step 8
published, 12 not yet), the same command resumes (the newest step that verifies) and ends
with every rank's shards equal bit for bit to an uninterrupted run's, every step's loss too.
A corrupted newest step is skipped with the reason; retention bounds the store; one process
(tensor parallelism 1) loads the whole tensors two saved as shards.

Megatron's own model classes and distributed optimizer are not run: on CPU its optimizer
hard-codes CUDA tensors (megatron-core 0.16.1, ``optimizer/optimizer.py``), and its save
calls two ``torch.cuda`` functions the worker replaces with no-ops (see megatron_worker.py).
What is tested is Megatron's checkpoint format, written and read by Megatron.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from worker_runs import Worker, killed_copy, published

from rtj_shim.checkpoint.layout import step_key
from rtj_shim.checkpoint.manifest import decode_manifest

WORKER = Worker(Path(__file__).with_name("megatron_worker.py"))
TOTAL, KILL_AT = 16, 10

pytestmark = pytest.mark.xdist_group("megatron-integration")


def _reports(out: Path, ranks: int = 2) -> list[dict[str, Any]]:
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(ranks)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """An uninterrupted run, and a store left by a run killed after step KILL_AT."""
    tmp = tmp_path_factory.mktemp("megatron")
    WORKER.run(f"file://{tmp}/full", tmp / "out-full")
    WORKER.run_killed(f"file://{tmp}/killed", tmp / "out-killed", KILL_AT)
    return {"tmp": tmp, "full": _reports(tmp / "out-full")}


def test_uninterrupted_run_publishes_and_retention_bounds_the_store(runs: dict[str, Any]) -> None:
    root = f"file://{runs['tmp']}/full"
    assert published(root) == [(12, True), (16, True)]  # 4, 8, 12, 16 saved; keep_last=2
    state = runs["tmp"] / "full" / step_key(16) / "state"
    names = {p.name for p in state.iterdir()}
    assert {"metadata.json", ".metadata"} <= names
    assert any(n.startswith("__0_") for n in names) and any(n.startswith("__1_") for n in names)
    manifest = decode_manifest((runs["tmp"] / "full" / step_key(16) / "manifest.json").read_bytes())
    assert manifest.framework.name == "megatron-core"
    assert manifest.parallelism == {"tp": 2, "pp": 1, "dp": 1}
    assert [sorted(map(int, r["losses"])) for r in runs["full"]] == [list(range(1, 17))] * 2


def test_sigkilled_run_resumes_to_the_uninterrupted_shards_bit_for_bit(
    runs: dict[str, Any],
) -> None:
    root, out = killed_copy(runs["tmp"], "resume")
    assert published(root) == [(4, True), (8, True)]  # killed after 10: 12 never written
    _, err = WORKER.run(root, out)
    line = f"rtj_shim: resuming step 8 from {root}/steps/step-000000000008 (newest verified)"
    assert line in err, err[-4000:]
    for rank, report in enumerate(_reports(out)):
        assert (report["restored"], report["skipped"]) == (8, [])
        assert sorted(map(int, report["losses"])) == list(range(9, TOTAL + 1))
        for step, loss in report["losses"].items():
            assert loss == runs["full"][rank]["losses"][step], (rank, step)
        assert report["params"] == runs["full"][rank]["params"], rank  # exact floats
    assert published(root) == [(12, True), (16, True)]


def test_a_corrupt_newest_step_is_skipped_with_the_reason(runs: dict[str, Any]) -> None:
    root, out = killed_copy(runs["tmp"], "corrupt")
    state = runs["tmp"] / "corrupt" / step_key(8) / "state"
    victim = max((p for p in state.glob("__1_*.distcp")), key=lambda p: p.stat().st_size)
    raw = bytearray(victim.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # same size: only deep verification notices
    victim.write_bytes(bytes(raw))

    _, err = WORKER.run(root, out)
    reports = _reports(out)
    assert reports[0]["restored"] == 4
    assert [step for step, _ in reports[0]["skipped"]] == [8]
    reason = reports[0]["skipped"][0][1]
    assert victim.name in reason, reason
    assert f"resume: skipped step 8: {reason}" in err
    for rank, report in enumerate(reports):
        for step, loss in report["losses"].items():
            assert loss == runs["full"][rank]["losses"][step], (rank, step)
        assert report["params"] == runs["full"][rank]["params"], rank


def test_one_process_loads_the_whole_tensors_two_saved_as_shards(runs: dict[str, Any]) -> None:
    """Another layout (tensor parallelism 1 in one process) loads step 8: Megatron maps every
    tensor by its global offsets, so the whole weights are the two ranks' shards side by
    side, bit for bit."""
    root, out = killed_copy(runs["tmp"], "resized")
    proc = WORKER.launch(root, out, ranks=1, STOP_AFTER_RESTORE="1")
    stdout, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 0, stdout[-2000:] + stderr[-4000:]
    [report] = _reports(out, ranks=1)
    assert report["restored"] == 8
    saved = [runs["full"][r]["saved"]["8"] for r in (0, 1)]
    for name in ("w1", "m_w1"):  # split along rows
        assert report["params"][name] == saved[0][name] + saved[1][name], name
    for name in ("w2", "m_w2"):  # split along columns
        whole = [a + b for a, b in zip(saved[0][name], saved[1][name], strict=True)]
        assert report["params"][name] == whole, name
    assert published(root) == [(4, True), (8, True)]  # nothing written by the load
