"""The fast tier on real training (issue 16): the example trainer under torchrun, 2 ranks,
durable saves every 20 steps and fast-tier saves every 5 (``RTJ_FAST_TIER_DIR``).

Rank 1 is SIGKILLed after step 47: the newest durable step is 40, the newest fast step every
rank holds is 45. A restart pinned as an in-place restart pins it (``fast_step`` in the
resume file) resumes from 45 and continues the no-fault run bit for bit; a corrupted
fast-tier shard on one rank is skipped on every rank, with the reason, for the durable 40.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rtj_shim.fast_tier import committed_steps, holdings, rank_store

REPO = Path(__file__).resolve().parents[3]
STEPS, DURABLE_EVERY, FAST_EVERY, KILL_AFTER = 60, 20, 5, 47

pytestmark = pytest.mark.timeout(600)


def _train(work: Path, root: Path, logs: Path, *extra: str, env: dict[str, str]) -> int:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("RTJ_", "AWS_"))}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         "--max-restarts=0", "examples/ddp_train.py", f"--root=file://{root}",
         f"--log-dir={logs}", f"--steps={STEPS}", f"--save-every={DURABLE_EVERY}", *extra],
        cwd=REPO, env={**clean, **env}, timeout=300, capture_output=True, text=True,
    )  # fmt: skip
    (work / f"{logs.name}.stderr").write_text(done.stderr)
    return done.returncode


def _records(logs: Path, rank: int) -> list[dict[str, Any]]:
    out = []
    for line in (logs / f"rank-{rank}.jsonl").read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # the line a killed rank was writing
    return out


def _losses(logs: Path, rank: int) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in _records(logs, rank) if "loss" in r and "event" not in r}


def _restore(logs: Path, rank: int) -> dict[str, Any]:
    return [r for r in _records(logs, rank) if r.get("event") == "restore"][-1]


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The no-fault run, and a run whose rank 1 was killed after step 47."""
    work = tmp_path_factory.mktemp("fast-tier")
    assert _train(work, work / "clean-ckpt", work / "clean-logs", env={}) == 0
    fast = work / "fast"
    code = _train(
        work, work / "ckpt", work / "killed-logs",
        f"--fault-kill-step={KILL_AFTER}", "--fault-kill-rank=1",
        "--step-sleep=0.05",  # the fast step written in the background is in before the kill
        env={"RTJ_FAST_TIER_DIR": str(fast), "RTJ_FAST_EVERY_STEPS": str(FAST_EVERY)},
    )  # fmt: skip
    assert code != 0, "rank 1 was to be killed"
    return {"work": work, "fast": fast, "ckpt": work / "ckpt", "clean": work / "clean-logs"}


def _resume(killed: dict[str, Path], name: str, pin: dict[str, Any]) -> Path:
    """Resume a copy of the killed run's stores with the resume file an in-place restart
    writes; the logs of the resumed run."""
    work = killed["work"] / name
    shutil.copytree(killed["ckpt"], work / "ckpt")
    shutil.copytree(killed["fast"], work / "fast")
    (work / "resume.json").write_text(json.dumps({**pin, "skipped": [], "source": "test"}))
    env = {
        "RTJ_FAST_TIER_DIR": str(work / "fast"),
        "RTJ_FAST_EVERY_STEPS": str(FAST_EVERY),
        "RTJ_RESUME_FILE": str(work / "resume.json"),
    }
    assert _train(work, work / "ckpt", work / "logs", env=env) == 0, (
        work / "logs.stderr"
    ).read_text()[-3000:]
    return work / "logs"


def test_the_killed_world_left_fast_steps_newer_than_its_durable_one(
    killed: dict[str, Path],
) -> None:
    for rank in (0, 1):
        kept = committed_steps(rank_store(killed["fast"], rank))
        assert kept == [45, 40], f"rank {rank} keeps the newest two fast steps: {kept}"
    assert holdings(killed["fast"]) == [40, 45]  # what the pod's supervisor reports
    durable = sorted(p.name for p in (killed["ckpt"] / "steps").iterdir())
    assert durable == ["step-000000000020", "step-000000000040"]


def test_resume_from_the_pinned_fast_step_continues_the_no_fault_run_bit_for_bit(
    killed: dict[str, Path],
) -> None:
    logs = _resume(killed, "from-fast", {"step": 40, "fast_step": 45})
    for rank in (0, 1):
        restore = _restore(logs, rank)
        assert (restore["step"], restore["source"], restore["skipped"]) == (45, "fast-tier", [])
        resumed, clean = _losses(logs, rank), _losses(killed["clean"], rank)
        assert sorted(resumed) == list(range(46, STEPS + 1))
        assert all(resumed[s] == clean[s] for s in resumed), f"rank {rank} diverged"


def test_a_corrupt_fast_shard_on_one_rank_falls_back_to_the_durable_step_on_every_rank(
    killed: dict[str, Path],
) -> None:
    shard = killed["fast"] / "rank-00001" / "steps" / "step-000000000045" / "ranks"
    target = shard / "rank-00001.pt"
    original = target.read_bytes()
    target.write_bytes(original[:-8] + bytes(8))  # same size: only the hash can tell
    try:
        logs = _resume(killed, "corrupt", {"step": 40, "fast_step": 45})
    finally:
        target.write_bytes(original)
    for rank in (0, 1):
        restore = _restore(logs, rank)
        assert (restore["step"], restore["source"]) == (40, "resume-file")
        [(step, reason)] = [(s["step"], s["reason"]) for s in restore["skipped"]]
        assert step == 45 and reason.startswith("fast tier: rank 1: ")
        assert "sha256" in reason or "does not match" in reason, reason
        resumed, clean = _losses(logs, rank), _losses(killed["clean"], rank)
        assert sorted(resumed) == list(range(41, STEPS + 1))
        assert all(resumed[s] == clean[s] for s in resumed), f"rank {rank} diverged"


def test_a_fast_step_alone_pinned_falls_back_to_resolving_the_durable_store(
    killed: dict[str, Path],
) -> None:
    """A file:// root the operator cannot read pins only the fast step; a fast step no rank
    holds then falls back to the newest verified durable step."""
    logs = _resume(killed, "unheld", {"fast_step": 55})
    for rank in (0, 1):
        restore = _restore(logs, rank)
        assert (restore["step"], restore["source"]) == (40, "resolved")
        assert restore["skipped"][0]["step"] == 55
        assert restore["skipped"][0]["reason"].startswith("fast tier: rank 0: ")
