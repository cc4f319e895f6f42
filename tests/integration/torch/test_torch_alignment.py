"""The data alignment check after a resume with real PyTorch (DDP on gloo, 3 ranks by
torchrun; issue 43 section 5): a run trains 40 steps and saves; resumed, every rank reading
where it stopped, nothing is found; resumed with rank 1 reading its labels one record off,
rank 1 alone is named 16 steps later, beside the resume file and in the log, and with
``AlignmentCheck(fail=True)`` every rank raises `MisalignedResume` naming it."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rtj_shim.wire.misaligned_resume import SUFFIX, MisalignedRanks

WORKER = Path(__file__).with_name("alignment_worker.py")
SAVED = 40


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(root: Path, mode: str, first: int, last: int) -> tuple[dict[str, Any], str]:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3",
        "--master-addr", "127.0.0.1", "--master-port", str(_free_port()),
        str(WORKER), str(root), mode, str(first), str(last),
    ]  # fmt: skip
    env = {**os.environ, "RTJ_RESUME_FILE": str(_resume_file(root))}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result, done.stderr


def _resume_file(root: Path) -> Path:
    return root.with_name(f"{root.name}-resume.json")


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("trained") / "ckpt"
    result, _ = _run(root, "train", 1, SAVED)
    assert result == {"restored": 0, "errors": [None, None, None]}
    return root


def _resumed(trained: Path, tmp_path: Path, mode: str) -> tuple[dict[str, Any], str, Path]:
    root = tmp_path / mode
    shutil.copytree(trained, root)
    result, log = _run(root, mode, SAVED + 1, SAVED + 20)
    return result, log, _resume_file(root).with_name(_resume_file(root).name + SUFFIX)


def test_a_resume_that_reads_where_it_stopped_finds_nothing(trained: Path, tmp_path: Path) -> None:
    result, log, finding = _resumed(trained, tmp_path, "clean")
    assert result == {"restored": SAVED, "errors": [None, None, None]}
    assert not finding.exists() and "data alignment" not in log


def test_a_rank_reading_from_the_wrong_position_is_named(trained: Path, tmp_path: Path) -> None:
    result, log, finding = _resumed(trained, tmp_path, "shifted")
    assert result["errors"] == [None, None, None], "a warning by default: training goes on"
    found = MisalignedRanks.parse(finding.read_text())
    assert found.ranks == (1,) and found.step == SAVED + 16
    assert found.factors[0] > 3, found
    assert log.count("data alignment after the resume: by step 56, rank 1 (") == 1, log[-3000:]


def test_with_fail_every_rank_raises_naming_the_rank(trained: Path, tmp_path: Path) -> None:
    result, _, finding = _resumed(trained, tmp_path, "shifted-fail")
    errors = result["errors"]
    assert len(set(errors)) == 1 and errors[0].startswith("MisalignedResume: "), errors
    assert "rank 1 (" in errors[0] and "rank 0" not in errors[0] and "rank 2" not in errors[0]
    assert MisalignedRanks.parse(finding.read_text()).ranks == (1,)
