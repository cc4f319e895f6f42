"""JAX with Orbax through ``PublishingCheckpointer``: two JAX processes (CPU, gloo
collectives, ``jax.distributed``) train a model on a global batch both contribute to,
publishing Orbax's save every 4 steps; both are SIGKILLed after step 10 (step 8 published,
12 not yet), the same command resumes (Orbax's restore of the newest step that verifies,
into the same shardings) and ends with parameters equal bit for bit to an uninterrupted
run's, every step's loss on both processes too; a corrupted newest step is skipped with the
reason; retention bounds the store; one process restores what two saved (Orbax's restore
into another sharding). No torch is imported by the processes.

Exact because the checkpoint holds the whole state (parameters and momentum) and each
step's rows are drawn from the step and the process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from rtj_shim.checkpoint.layout import step_key
from rtj_shim.checkpoint.manifest import decode_manifest
from rtj_shim.checkpoint.resolver import describe_steps
from rtj_shim.checkpoint.storage import open_store
from rtj_shim.checkpoint.verification import Depth

WORKER = Path(__file__).with_name("orbax_worker.py")
TOTAL, KILL_AT, PROCESSES = 16, 10, 2

pytestmark = pytest.mark.xdist_group("orbax-integration")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(
    root: str, out: Path, kill_at: int = 0, processes: int = PROCESSES, **extra: str
) -> list[subprocess.Popen[str]]:
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RTJ_", "TORCHELASTIC_"))}
    env.update(PYTHONWARNINGS="ignore", RTJ_RESUME_FILE=str(out / "absent-resume.json"),
               KILL_AT=str(kill_at), JAX_PLATFORMS="cpu", **extra)  # fmt: skip
    return [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(p), str(processes), str(port), root, str(out)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for p in range(processes)
    ]


def run(root: str, out: Path) -> tuple[dict[str, Any], str]:
    """Train to the end (resuming what ``root`` holds); the processes' reports, process 0's
    stderr."""
    procs = launch(root, out)
    errs = []
    for proc in procs:
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err[-4000:]
        errs.append(err)
    reports = [json.loads((out / f"process-{p}.json").read_text()) for p in range(PROCESSES)]
    assert len({r["restored"] for r in reports}) == 1  # every process restored one step
    assert reports[0]["params"] == reports[1]["params"]  # replicated
    assert not any(r["torch_imported"] for r in reports)  # the integration needs no torch
    facts = {"restored": reports[0]["restored"], "skipped": reports[0]["skipped"],
             "losses": [r["losses"] for r in reports], "params": reports[0]["params"],
             "saved": reports[0]["saved"]}  # fmt: skip
    return facts, errs[0]


def run_killed(root: str, out: Path) -> None:
    procs = launch(root, out, kill_at=KILL_AT)
    marks = [out / f"at-kill-{p}" for p in range(PROCESSES)]
    deadline = time.monotonic() + 180
    try:
        while not all(m.exists() and m.read_text() for m in marks):
            for proc in procs:
                assert proc.poll() is None, proc.communicate()[1][-4000:]
            assert time.monotonic() < deadline, "the processes never reached the kill step"
            time.sleep(0.1)
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=60)


def published(root: str) -> list[tuple[int, bool]]:
    listing = describe_steps(open_store(root), Depth.DEEP)
    return sorted(
        (s.entry.name.step, s.state.verified) for s in listing if not s.entry.name.in_progress
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """An uninterrupted run, and a store left by a run killed after step KILL_AT."""
    tmp = tmp_path_factory.mktemp("orbax")
    full, _ = run(f"file://{tmp}/full", tmp / "out-full")
    run_killed(f"file://{tmp}/killed", tmp / "out-killed")
    return {"tmp": tmp, "full": full}


def killed_copy(runs: dict[str, Any], name: str) -> tuple[str, Path]:
    tmp: Path = runs["tmp"]
    shutil.copytree(tmp / "killed", tmp / name)
    return f"file://{tmp}/{name}", tmp / f"out-{name}"


def test_uninterrupted_run_publishes_and_retention_bounds_the_store(runs: dict[str, Any]) -> None:
    root = f"file://{runs['tmp']}/full"
    assert published(root) == [(12, True), (16, True)]  # 4, 8, 12, 16 saved; keep_last=2
    state = runs["tmp"] / "full" / step_key(16) / "state"
    assert (state / "commit_success.txt").exists()
    assert {f"ocdbt.process_{p}" for p in range(PROCESSES)} <= {p.name for p in state.iterdir()}
    manifest = decode_manifest((runs["tmp"] / "full" / step_key(16) / "manifest.json").read_bytes())
    assert manifest.framework.name == "orbax" and manifest.world_size == PROCESSES
    assert [sorted(map(int, r)) for r in runs["full"]["losses"]] == [list(range(1, 17))] * 2


def test_sigkilled_run_resumes_to_the_uninterrupted_model_bit_for_bit(
    runs: dict[str, Any],
) -> None:
    root, out = killed_copy(runs, "resume")
    assert published(root) == [(4, True), (8, True)]  # killed after 10: 12 never written
    resumed, err = run(root, out)
    line = f"rtj_shim: resuming step 8 from {root}/steps/step-000000000008 (newest verified)"
    assert line in err, err[-4000:]
    assert (resumed["restored"], resumed["skipped"]) == (8, [])
    for p in range(PROCESSES):  # steps 9-16 on each process: the uninterrupted run's exactly
        assert sorted(map(int, resumed["losses"][p])) == list(range(9, TOTAL + 1))
        for step, loss in resumed["losses"][p].items():
            assert loss == runs["full"]["losses"][p][step], (p, step)
    assert resumed["params"] == runs["full"]["params"]  # bit for bit (floats round-trip)
    assert published(root) == [(12, True), (16, True)]


def test_a_corrupt_newest_step_is_skipped_with_the_reason(runs: dict[str, Any]) -> None:
    root, out = killed_copy(runs, "corrupt")
    shards = runs["tmp"] / "corrupt" / step_key(8) / "state" / "ocdbt.process_1"
    victim = max((p for p in shards.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    raw = bytearray(victim.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # same size: only deep verification notices
    victim.write_bytes(bytes(raw))

    resumed, err = run(root, out)
    assert resumed["restored"] == 4
    assert [step for step, _ in resumed["skipped"]] == [8]
    reason = resumed["skipped"][0][1]
    assert "ocdbt.process_1" in reason, reason
    assert f"resume: skipped step 8: {reason}" in err
    for p in range(PROCESSES):
        for step, loss in resumed["losses"][p].items():
            assert loss == runs["full"]["losses"][p][step], (p, step)
    assert resumed["params"] == runs["full"]["params"]


def test_one_process_restores_what_two_saved(runs: dict[str, Any]) -> None:
    """A world of another size (the operator's elastic shrink, or a resume on fewer hosts):
    Orbax restores the step into the new world's shardings, the values those two processes
    saved, bit for bit; the shim refuses nothing. (What the training does next on fewer
    processes, its global batch, is the script's: this worker's is made of every process's
    rows, so it would differ.)"""
    root, out = killed_copy(runs, "resized")
    [proc] = launch(root, out, processes=1, STOP_AFTER_RESTORE="1")
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-4000:]
    report = json.loads((out / "process-0.json").read_text())
    assert (report["restored"], report["skipped"]) == (8, [])
    assert report["params"] == runs["full"]["saved"]["8"]
    assert published(root) == [(4, True), (8, True)]  # nothing written by the restore
