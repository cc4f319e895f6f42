"""The Checkpointer applies the job's retention after each publish, on both backends.

The policy is the environment the operator injects (``RTJ_KEEP_LAST``, ``RTJ_KEEP_EVERY``,
``RTJ_PROTECT_STEP``); blocking and background saves both go through the protocol's
publish on the committing rank, where retention runs.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from torch import nn

from rtj_shim.checkpoint.resolver import describe_steps
from rtj_shim.checkpoint.storage import open_store
from rtj_shim.torch import Checkpointer
from rtj_shim.torch.options import IoOptions


@pytest.fixture(params=["filesystem", pytest.param("s3", marks=pytest.mark.s3)])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "s3":
        return str(request.getfixturevalue("s3_root"))
    return str(tmp_path / "ckpt")


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in [n for n in os.environ if n.startswith("RTJ_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("RTJ_RESUME_FILE", str(tmp_path / "absent-resume.json"))
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)


def objects(seed: int) -> dict[str, object]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 1))
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.1)}


def train_step(state: dict[str, object]) -> None:
    model, opt = state["model"], state["opt"]
    assert isinstance(model, nn.Module) and isinstance(opt, torch.optim.Optimizer)
    model(torch.randn(2, 4)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()


def test_saves_keep_the_newest_milestones_and_the_protected_step(
    root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RTJ_KEEP_LAST", "2")
    monkeypatch.setenv("RTJ_KEEP_EVERY", "4")
    monkeypatch.setenv("RTJ_PROTECT_STEP", "1")
    state = objects(0)
    ckpt = Checkpointer(root, io=IoOptions(shard_bytes=256))
    for step in range(1, 11):
        train_step(state)
        ckpt.save(step, state, blocking=step % 2 == 0)  # odd steps publish in the background
    ckpt.wait()
    listings = describe_steps(open_store(root))
    assert all(s.label == "published" for s in listings)
    assert sorted(s.entry.name.step for s in listings) == [1, 4, 8, 9, 10]
    resumed = objects(1)
    assert Checkpointer(root).restore(resumed) == 10
    for a, b in zip(
        state["model"].parameters(),  # type: ignore[attr-defined]
        resumed["model"].parameters(),  # type: ignore[attr-defined]
        strict=True,
    ):
        assert torch.equal(a, b)
