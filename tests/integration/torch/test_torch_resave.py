"""Saving a step number that is already published: a no-op with the same state, else an error."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from rtj_shim.checkpoint.layout import step_key
from rtj_shim.torch import Checkpointer, CheckpointError, isolated_rng


@pytest.fixture(autouse=True)
def _no_resume_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RTJ_RESUME_FILE", str(tmp_path / "absent-resume.json"))
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)


def job() -> dict[str, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.2), nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return {"model": model, "opt": opt, "epoch": 0}


def train_step(state: dict[str, Any]) -> float:
    loss = state["model"](torch.randn(3, 4)).pow(2).mean()
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad()
    return float(loss.detach())


def run(state: dict[str, Any], ckpt: Checkpointer, start: int, stop: int) -> list[float]:
    """A loop that saves at the *top* of an iteration: a resumed run saves its step again."""
    losses = []
    for step in range(start, stop):
        if step % 5 == 0:
            ckpt.save(step, state)
        losses.append(train_step(state))
    return losses


def manifest(root: Path, step: int) -> bytes:
    return (root / step_key(step, "manifest.json")).read_bytes()


def test_a_resume_at_a_save_boundary_saves_that_step_again_as_a_no_op(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = job()
    ckpt = Checkpointer(tmp_path)
    ckpt.restore(state)
    expected = run(state, ckpt, 0, 14)  # saves 0, 5, 10
    before = manifest(tmp_path, 10)

    resumed = job()
    again = Checkpointer(tmp_path)
    start = again.restore(resumed)
    assert start == 10
    with caplog.at_level(logging.WARNING, logger="rtj_shim.torch"):
        got = run(resumed, again, start, 14)  # its first iteration saves step 10 again
    assert got == expected[10:]
    assert manifest(tmp_path, 10) == before  # untouched
    report = again.last_save
    assert report is not None and report.step == 10 and report.already_published
    assert "save of step 10 did nothing: step 10 is already published with this same state" in (
        caplog.text
    )


def test_a_changed_state_under_a_published_step_number_is_refused(tmp_path: Path) -> None:
    state = job()
    Checkpointer(tmp_path).save(5, state)

    resumed = job()
    again = Checkpointer(tmp_path)
    assert again.restore(resumed) == 5
    train_step(resumed)  # a step, but the script forgot to count it
    with pytest.raises(CheckpointError, match=r"step 5 is already published.*\['model', 'opt'\]"):
        again.save(5, resumed)

    resumed["epoch"] = 1  # a plain value changed
    with pytest.raises(CheckpointError, match=r"\['epoch', 'model', 'opt'\] changed since"):
        again.save(5, resumed)


@pytest.mark.parametrize("blocking", [True, False])
def test_saving_the_step_just_published_again_is_a_no_op_until_the_state_changes(
    tmp_path: Path, blocking: bool
) -> None:
    state = job()
    ckpt = Checkpointer(tmp_path)
    train_step(state)
    ckpt.save(1, state, blocking=blocking)
    report = ckpt.save(1, state)  # e.g. a scheduled save and a manual one at the same step
    assert report is not None and report.already_published
    with torch.no_grad():
        state["model"][0].weight.data.mul_(2)  # changed through .data: seen by its values
    with pytest.raises(CheckpointError, match=r"\['model'\] changed since"):
        ckpt.save(1, state)


def test_random_numbers_drawn_in_between_are_reported_not_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    Checkpointer(tmp_path).save(3, job())
    resumed = job()
    again = Checkpointer(tmp_path)
    again.restore(resumed)
    torch.rand(3)  # say, a DataLoader iterator created from the global RNG
    with caplog.at_level(logging.WARNING, logger="rtj_shim.torch"):
        report = again.save(3, resumed)
    assert report is not None and report.already_published
    assert "the global RNGs moved since" in caplog.text
    caplog.clear()
    with isolated_rng(), caplog.at_level(logging.WARNING, logger="rtj_shim.torch"):
        again.restore(resumed)
        again.save(3, resumed)
    assert "did nothing" in caplog.text and "RNGs moved" not in caplog.text


def test_a_published_step_this_run_never_held_stays_immutable(tmp_path: Path) -> None:
    state = job()
    ckpt = Checkpointer(tmp_path)
    ckpt.save(5, state)
    train_step(state)
    ckpt.save(6, state)
    other = Checkpointer(tmp_path)
    other.restore(job())  # restores 6
    with pytest.raises(CheckpointError, match="step 5 is already published"):
        other.save(5, job())
