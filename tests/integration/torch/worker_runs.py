"""What the framework integrations' tests share: their worker script run under torchrun
(gloo, CPU) to the end or SIGKILLed at a step, the steps a store holds, the final model
compared bit for bit, and a copy of a killed run's store for each test to resume."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rtj_shim.checkpoint.resolver import describe_steps
from rtj_shim.checkpoint.storage import open_store
from rtj_shim.checkpoint.verification import Depth

RUN_SECONDS = 300
"""A run's limit: ~30 s alone, several times that beside a loaded suite on 2 cores (a
DeepSpeed resume ran past 180 s once, beside other torchruns)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Worker:
    """``script ROOT OUT_DIR`` under ``torchrun --nproc-per-node R``: each rank writes
    ``OUT_DIR/rank-<r>.json`` at the end; with ``KILL_AT=N`` each writes its pid into
    ``OUT_DIR/at-kill-<r>`` after step N and sleeps."""

    script: Path
    env: Mapping[str, str] = field(default_factory=dict)

    def launch(
        self, root: str, out: Path, kill_at: int = 0, ranks: int = 2, **extra: str
    ) -> subprocess.Popen[str]:
        out.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
            "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
            str(self.script), root, str(out),
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RTJ_", "TORCHELASTIC_"))}
        env.update(
            OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONWARNINGS="ignore",
            RTJ_RESUME_FILE=str(out / "absent-resume.json"), KILL_AT=str(kill_at),
            **{**self.env, **extra},
        )  # fmt: skip
        return subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True,  # torchrun's process group, killed with it
        )  # fmt: skip

    def run(self, root: str, out: Path) -> tuple[dict[str, Any], str]:
        """Train to the end (resuming what ``root`` holds): rank 0's report with every
        rank's ``losses``, and stderr."""
        proc = self.launch(root, out)
        stdout, stderr = proc.communicate(timeout=RUN_SECONDS)
        assert proc.returncode == 0, stdout[-2000:] + stderr[-4000:]
        reports = [json.loads((out / f"rank-{r}.json").read_text()) for r in (0, 1)]
        assert reports[0]["restored"] == reports[1]["restored"]  # every rank loaded one step
        return {**reports[0], "losses": [r["losses"] for r in reports]}, stderr

    def run_killed(self, root: str, out: Path, kill_at: int) -> None:
        """Train until step `kill_at`, then SIGKILL every rank (torchrun starts each in a
        session of its own) and torchrun."""
        proc = self.launch(root, out, kill_at=kill_at)
        marks = [out / f"at-kill-{rank}" for rank in (0, 1)]
        deadline = time.monotonic() + RUN_SECONDS
        try:
            while not all(m.exists() and m.read_text() for m in marks):
                assert proc.poll() is None, proc.communicate()[1][-4000:]
                assert time.monotonic() < deadline, "the workers never reached the kill step"
                time.sleep(0.1)
        finally:
            for mark in marks:  # each rank leads a session: its children (a Manager
                if mark.exists() and mark.read_text():  # Megatron spawns) die with it
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(int(mark.read_text()), signal.SIGKILL)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGKILL


def published(root: str) -> list[tuple[int, bool]]:
    listing = describe_steps(open_store(root), Depth.DEEP)
    return sorted(
        (s.entry.name.step, s.state.verified) for s in listing if not s.entry.name.in_progress
    )


def final_model(out: Path) -> dict[str, torch.Tensor]:
    loaded = torch.load(out / "final.pt", weights_only=True)
    assert isinstance(loaded, dict)
    return loaded


def assert_same_model(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:  # bit for bit: equal tensors, not close ones
        assert torch.equal(a[name], b[name]), name


def killed_copy(tmp: Path, name: str) -> tuple[str, Path]:
    """A copy of the killed run's store (``tmp/killed``): each test resumes its own."""
    shutil.copytree(tmp / "killed", tmp / name)
    return f"file://{tmp}/{name}", tmp / f"out-{name}"
