"""Every restore prints one line to stderr: which step, from where, what was skipped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from torch import nn

from rtj_shim.checkpoint.layout import step_key
from rtj_shim.checkpoint.storage import open_store
from rtj_shim.torch import Checkpointer
from rtj_shim.torch.options import ResumeOptions


@pytest.fixture(autouse=True)
def _no_resume_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RTJ_RESUME_FILE", str(tmp_path / "absent-resume.json"))
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)


def lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("rtj_shim.torch: ")]


def test_a_fresh_start_and_a_resume_each_print_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "ckpt"
    model = nn.Linear(2, 2)
    Checkpointer(root).restore({"model": model})
    assert lines(capsys.readouterr().err) == [
        f"rtj_shim.torch: no verified checkpoint under {open_store(str(root)).uri}: "
        "starting fresh at step 0"
    ]

    ckpt = Checkpointer(root)
    for step in (10, 20, 30):
        ckpt.save(step, {"model": model, "epoch": step})
    (root / step_key(30, "COMMITTED")).unlink()
    shard = next((root / step_key(20, "common")).glob("shard-*"))
    data = bytearray(shard.read_bytes())
    data[-50] ^= 1
    shard.write_bytes(bytes(data))
    capsys.readouterr()

    Checkpointer(root).restore({"model": nn.Linear(2, 2), "new": 0}, strict=False)
    [line] = lines(capsys.readouterr().err)
    uri = open_store(str(root)).key_uri(step_key(10))
    assert line.startswith(f"rtj_shim.torch: restored step 10 from {uri} (newest verified, ")
    assert "skipped 30 (COMMITTED is missing" in line and "20 (file 'common/shard-" in line
    assert "not in the checkpoint, left as they are: ['new']" in line
    assert "in the checkpoint, not restored: ['epoch']" in line


def test_the_resume_file_is_named_and_the_line_can_be_turned_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "ckpt"
    Checkpointer(root).save(5, {"model": nn.Linear(2, 2)})
    resume = tmp_path / "resume.json"
    uri = open_store(str(root)).key_uri(step_key(5))
    resume.write_text(json.dumps({"step": 5, "uri": uri, "skipped": [{"step": 7, "reason": "x"}]}))
    monkeypatch.setenv("RTJ_RESUME_FILE", str(resume))
    capsys.readouterr()

    ckpt = Checkpointer(root)
    ckpt.restore({"model": nn.Linear(2, 2)})
    [line] = lines(capsys.readouterr().err)
    assert "restored step 5" in line and "(pinned by the resume file, " in line
    assert "skipped 7 (x)" in line
    assert ckpt.last_restore is not None and ckpt.last_restore.line() == line

    quiet = Checkpointer(root, resume=ResumeOptions(report=False))
    quiet.restore({"model": nn.Linear(2, 2)})
    assert lines(capsys.readouterr().err) == []
    assert quiet.last_restore is not None and quiet.last_restore.step == 5
