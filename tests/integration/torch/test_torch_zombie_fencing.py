"""A new attempt owns the checkpoint root from its restore on, not from its first save: a
rank of the old world that still trains (a node cut off from the API server but not from
the store) or wakes up (SIGSTOP) is refused at its next commit even while the new world has
not saved yet, and a world older than the root's owner does not train at all. Both
backends: a real filesystem and the loopback S3 server."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from rtj_shim.checkpoint.resolver import resolve
from rtj_shim.checkpoint.storage import open_store
from rtj_shim.checkpoint.verification import Depth
from rtj_shim.errors import StoreError
from rtj_shim.torch import Checkpointer, CheckpointError
from rtj_shim.torch.options import ResumeOptions
from rtj_shim.torch.restore import claim_problem

RUN = "team-a.llm"


@pytest.fixture(autouse=True)
def _no_resume_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RTJ_RESUME_FILE", str(tmp_path / "absent-resume.json"))
    for name in ("TORCHELASTIC_RESTART_COUNT", "RTJ_ATTEMPT", "RTJ_RUN_ID"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(params=["file", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "file":
        return f"file://{tmp_path / 'ckpt'}"
    return str(request.getfixturevalue("s3_root"))


def _state(seed: int) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = nn.Linear(4, 3)
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.1)}


def test_the_old_world_is_refused_once_the_new_one_restored(root: str) -> None:
    old = Checkpointer(root, run_id=RUN, attempt="1", resume=ResumeOptions(report=False))
    old.save(10, _state(0))
    # attempt 1's node goes silent; the operator starts attempt 2, which restores step 10
    # and trains, its first save still steps away
    new = Checkpointer(root, run_id=RUN, attempt="2", resume=ResumeOptions(report=False))
    assert new.restore(_state(1)) == 10
    # the old world, still training, reaches its next save
    with pytest.raises(CheckpointError, match="attempt 1 is stale; attempt 2"):
        old.save(20, _state(0))
    assert resolve(open_store(root), Depth.DEEP).step == 10, "it published nothing"
    new.save(20, _state(1))  # the new world saves that step number itself
    assert resolve(open_store(root), Depth.DEEP).step == 20


def test_a_zombie_woken_mid_save_is_refused_and_leaves_the_new_worlds_step_alone(
    root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attempt 1 is frozen inside its save of step 20, after its files are written; attempt
    2 restores, claims the root and publishes step 20 itself (its fresh start of the step
    removed the zombie's files); the zombie wakes to a write error (its file gone: a 404 in
    CI). It is refused as stale, naming the claim, and cleans up nothing: the keys of a
    step are the same for every writer, so its cleanup would delete the new world's files
    (on S3: before, the newest step then failed deep verification)."""
    old = Checkpointer(root, run_id=RUN, attempt="1", resume=ResumeOptions(report=False))
    old.save(10, _state(0))
    writes = old._writer._write_files

    def frozen_mid_save(*args: Any, **kwargs: Any) -> Any:
        entries = writes(*args, **kwargs)
        new = Checkpointer(root, run_id=RUN, attempt="2", resume=ResumeOptions(report=False))
        assert new.restore(_state(1)) == 10
        new.save(20, _state(1))
        del entries  # written, then removed by the new world's fresh start of the step
        raise StoreError("verifying rank-00000.pt: 404 (HTTP 404): Not Found")

    monkeypatch.setattr(old._writer, "_write_files", frozen_mid_save)
    with pytest.raises(CheckpointError, match=r"attempt 1 is stale; attempt 2.*404"):
        old.save(20, _state(0))
    assert resolve(open_store(root), Depth.DEEP).step == 20, "the new world's step intact"


def test_a_world_older_than_the_roots_owner_does_not_train(root: str) -> None:
    Checkpointer(root, run_id=RUN, attempt="3", resume=ResumeOptions(report=False)).save(
        10, _state(0)
    )
    stale = Checkpointer(root, run_id=RUN, attempt="2", resume=ResumeOptions(report=False))
    with pytest.raises(CheckpointError, match=r"claiming the run: .*attempt 2 is stale"):
        stale.restore(_state(1))
    other = Checkpointer(root, run_id="team-b.llm", attempt="1", resume=ResumeOptions(report=False))
    with pytest.raises(CheckpointError, match="each run needs its own checkpoint root"):
        other.peek()


def test_a_root_that_cannot_be_claimed_warns_and_restores(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A read-only root (restored for evaluation): the claim's store error is a warning."""

    def read_only() -> None:
        raise StoreError("s3://bucket/run.json: AccessDenied")

    with caplog.at_level(logging.WARNING, logger="rtj_shim.torch"):
        assert claim_problem(read_only) is None
    assert "could not claim the run before training" in caplog.text
    assert "AccessDenied" in caplog.text
