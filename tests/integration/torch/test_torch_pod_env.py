"""`Checkpointer()` in an operator's pod (issue 44): with no root it saves under the
operator's RTJ_CHECKPOINT_URI, its SIGTERM deadline is RTJ_EMERGENCY_SAVE_SECONDS, and with
neither a root nor the variable it refuses naming both (never a silent default root)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from rtj_shim.checkpoint.layout import step_key
from rtj_shim.torch import Checkpointer
from rtj_shim.torch.options import EmergencyOptions


def test_no_root_saves_under_the_operators_uri_with_its_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RTJ_CHECKPOINT_URI", (tmp_path / "ckpt").as_uri())
    monkeypatch.setenv("RTJ_EMERGENCY_SAVE_SECONDS", "7")
    model = nn.Linear(2, 2)
    ckpt = Checkpointer()
    assert ckpt.options.emergency.deadline_s == 7.0
    assert ckpt.restore({"model": model}) == 0
    ckpt.save(1, {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.1)})
    ckpt.close()
    assert (tmp_path / "ckpt" / step_key(1) / "COMMITTED").is_file()
    explicit = Checkpointer(tmp_path / "other", emergency=EmergencyOptions(deadline_s=3))
    assert explicit.options.emergency.deadline_s == 3  # an argument wins over the environment
    explicit.close()


def test_no_root_and_no_uri_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RTJ_CHECKPOINT_URI", raising=False)
    with pytest.raises(ValueError, match="root: none given and RTJ_CHECKPOINT_URI is not set"):
        Checkpointer()


def test_a_bad_deadline_from_the_operator_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RTJ_EMERGENCY_SAVE_SECONDS", "soon")
    with pytest.raises(ValueError, match="RTJ_EMERGENCY_SAVE_SECONDS='soon'"):
        Checkpointer(tmp_path)
