"""Ray Train with ``PublishingReporter``: ``TorchTrainer`` runs two workers (DDP over gloo,
CPU) on a local Ray cluster, an MLP with dropout, AdamW and an LR schedule, reporting a
checkpoint every 4 steps; the whole Ray session (driver, GCS, raylet, workers) is
SIGKILLed after step 10 (step 8 published, 12 not yet); the same driver resumes (the
newest step that verifies, handed to every worker) and ends with a model equal bit for bit
to an uninterrupted run's, every step's loss on both workers too. A corrupted newest step
is skipped with the reason; retention bounds the store.

Ray starts in tens of seconds here: the three fits after the kill share one driver (one
Ray cluster). Exact because the checkpoint holds model, optimizer and schedule, and each
step draws its rows and dropout masks from the step and the rank (Ray saves no RNG state).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from rtj_shim.checkpoint.layout import step_key
from rtj_shim.checkpoint.manifest import decode_manifest
from rtj_shim.checkpoint.resolver import describe_steps
from rtj_shim.checkpoint.storage import open_store
from rtj_shim.checkpoint.verification import Depth

WORKER = Path(__file__).with_name("ray_worker.py")
TOTAL, KILL_AT = 16, 10

pytestmark = pytest.mark.xdist_group("ray-integration")


def _plan(tmp: Path, name: str, kill_at: int = 0) -> dict[str, Any]:
    return {"root": f"file://{tmp}/{name}", "out": str(tmp / f"out-{name}"),
            "storage": str(tmp / f"ray-{name}"), "kill_at": kill_at}  # fmt: skip


def _launch(plans: list[dict[str, Any]]) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RTJ_", "TORCHELASTIC_"))}
    env.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONWARNINGS="ignore",
               RTJ_RESUME_FILE="/nonexistent/rtj-resume.json")  # fmt: skip
    return subprocess.Popen(
        [sys.executable, str(WORKER), json.dumps(plans)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # Ray's processes stay in the driver's session
    )


def _kill_session(sid: int) -> None:
    """SIGKILL every process of a session: Ray's actors run in process groups of their
    own, so killing the driver's group leaves them checkpointing for a few seconds."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:  # after the name: state, ppid, pgrp, session
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(stat.parent.name), signal.SIGKILL)


def _run_killed(plan: dict[str, Any]) -> None:
    proc = _launch([plan])
    marks = [Path(plan["out"]) / f"at-kill-{r}" for r in (0, 1)]
    deadline = time.monotonic() + 240
    try:
        while not all(m.exists() and m.read_text() for m in marks):
            assert proc.poll() is None, (proc.stdout.read() if proc.stdout else "")[-4000:]
            assert time.monotonic() < deadline, "the workers never reached the kill step"
            time.sleep(0.2)
    finally:
        _kill_session(proc.pid)
        proc.communicate(timeout=60)


def _facts(plan: dict[str, Any]) -> dict[str, Any]:
    out = Path(plan["out"])
    reports = [json.loads((out / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert len({r["restored"] for r in reports}) == 1  # every worker restored one step
    models = [torch.load(out / f"final-{r}.pt", weights_only=True) for r in (0, 1)]
    assert all(torch.equal(models[0][k], models[1][k]) for k in models[0])  # DDP replicas
    return {"restored": reports[0]["restored"], "skipped": reports[0]["skipped"],
            "losses": [r["losses"] for r in reports], "model": models[0]}  # fmt: skip


def published(root: str) -> list[tuple[int, bool]]:
    listing = describe_steps(open_store(root), Depth.DEEP)
    return sorted(
        (s.entry.name.step, s.state.verified) for s in listing if not s.entry.name.in_progress
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A run killed after step KILL_AT; then, in one driver: a copy of its store with step 8
    corrupted resumed, another copy resumed, and an uninterrupted run."""
    tmp = tmp_path_factory.mktemp("ray")
    _run_killed(_plan(tmp, "killed", KILL_AT))
    killed = published(f"file://{tmp}/killed")
    for name in ("corrupt", "resume"):
        shutil.copytree(tmp / "killed", tmp / name)
    state = tmp / "corrupt" / step_key(8) / "state.pt"
    raw = bytearray(state.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # same size: only deep verification notices
    state.write_bytes(bytes(raw))
    plans = [_plan(tmp, name) for name in ("corrupt", "resume", "full")]
    proc = _launch(plans)
    output, _ = proc.communicate(timeout=420)
    assert proc.returncode == 0, output[-6000:]
    return {"tmp": tmp, "killed": killed, "output": output,
            **{p["out"].rsplit("-", 1)[1]: _facts(p) for p in plans}}  # fmt: skip


def _assert_same_model(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_uninterrupted_run_publishes_and_retention_bounds_the_store(runs: dict[str, Any]) -> None:
    root = f"file://{runs['tmp']}/full"
    assert published(root) == [(12, True), (16, True)]  # 4, 8, 12, 16 reported; keep_last=2
    manifest = decode_manifest((runs["tmp"] / "full" / step_key(16) / "manifest.json").read_bytes())
    assert manifest.framework.name == "ray-train" and manifest.world_size == 2
    assert [f.path for f in manifest.files] == ["state.pt"]
    assert [sorted(map(int, r)) for r in runs["full"]["losses"]] == [list(range(1, 17))] * 2
    assert runs["full"]["restored"] == 0


def test_sigkilled_run_resumes_to_the_uninterrupted_model_bit_for_bit(
    runs: dict[str, Any],
) -> None:
    assert runs["killed"] == [(4, True), (8, True)]  # killed after 10: 12 never reported
    resumed = runs["resume"]
    root = f"file://{runs['tmp']}/resume"
    line = f"rtj_shim: resuming step 8 from {root}/steps/step-000000000008 (newest verified)"
    assert line in runs["output"], runs["output"][-4000:]
    assert (resumed["restored"], resumed["skipped"]) == (8, [])
    for rank in (0, 1):  # steps 9-16 on each worker: the uninterrupted run's losses exactly
        assert sorted(map(int, resumed["losses"][rank])) == list(range(9, TOTAL + 1))
        for step, loss in resumed["losses"][rank].items():
            assert loss == runs["full"]["losses"][rank][step], (rank, step)
    _assert_same_model(resumed["model"], runs["full"]["model"])
    assert published(root) == [(12, True), (16, True)]  # retention, after the resume too


def test_a_corrupt_newest_step_is_skipped_with_the_reason(runs: dict[str, Any]) -> None:
    resumed = runs["corrupt"]
    assert resumed["restored"] == 4
    assert [step for step, _ in resumed["skipped"]] == [8]
    reason = resumed["skipped"][0][1]
    assert "state.pt" in reason, reason
    assert f"resume: skipped step 8: {reason}" in runs["output"]
    for rank in (0, 1):
        assert sorted(map(int, resumed["losses"][rank])) == list(range(5, TOTAL + 1))
        for step, loss in resumed["losses"][rank].items():
            assert loss == runs["full"]["losses"][rank][step], (rank, step)
    _assert_same_model(resumed["model"], runs["full"]["model"])
