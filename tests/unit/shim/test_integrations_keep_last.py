"""One name for retention: the framework integrations take ``keep_last=`` as the
Checkpointer does (the job's ``RTJ_KEEP_LAST`` first); ``retention=``, the old name, still
works for one release with a DeprecationWarning naming ``keep_last``. Given no root, they
read ``RTJ_CHECKPOINT_URI`` as ``Checkpointer()`` does."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rtj_shim.checkpoint.resolver import describe_steps
from rtj_shim.checkpoint.retention import RetentionPolicy
from rtj_shim.integrations.hf import PublishCheckpoints, resume_step
from rtj_shim.integrations.lightning import PublishingCheckpointIO

Make = Callable[..., Any]
KINDS: list[Make] = [PublishingCheckpointIO, PublishCheckpoints]


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("RTJ_KEEP_LAST", "RTJ_KEEP_EVERY", "RTJ_CHECKPOINT_URI", "RTJ_ATTEMPT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RTJ_RESUME_FILE", str(tmp_path / "absent-resume.json"))
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)


@pytest.mark.parametrize("make", KINDS)
def test_keep_last_applies_when_the_environment_sets_none(make: Make, tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new name warns about nothing
        made = make(str(tmp_path), keep_last=2)
    assert made.protocol.retention == RetentionPolicy(keep_last=2)
    assert make(str(tmp_path)).protocol.retention is None  # neither: every step is kept


@pytest.mark.parametrize("make", KINDS)
def test_the_jobs_retention_comes_first(
    make: Make, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RTJ_KEEP_LAST", "5")
    assert make(str(tmp_path), keep_last=2).protocol.retention.keep_last == 5


@pytest.mark.parametrize("make", KINDS)
def test_retention_is_a_deprecated_alias(make: Make, tmp_path: Path) -> None:
    name = make.__name__
    with pytest.warns(DeprecationWarning, match=rf"{name}\(retention=...\).*keep_last=N") as seen:
        made = make(str(tmp_path), retention=RetentionPolicy(keep_last=3))
    assert made.protocol.retention == RetentionPolicy(keep_last=3)
    assert seen[0].filename == __file__  # points at the caller's line
    with pytest.warns(DeprecationWarning, match="keep_last"):
        assert make(str(tmp_path), retention=None).protocol.retention is None


@pytest.mark.parametrize("make", KINDS)
def test_wrong_retention_arguments_name_what_was_expected(make: Make, tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="pass keep_last= only"):
        make(str(tmp_path), keep_last=2, retention=RetentionPolicy(keep_last=2))
    with pytest.raises(ValueError, match=r"keep_last=0, expected an int >= 1 or None"):
        make(str(tmp_path), keep_last=0)
    with pytest.raises(TypeError, match=r"retention=3, expected a RetentionPolicy or None"):
        make(str(tmp_path), retention=3)


def test_keep_last_deletes_older_published_steps(tmp_path: Path) -> None:
    io = PublishingCheckpointIO(str(tmp_path), keep_last=2)
    for step in (1, 2, 3):
        io.save_checkpoint({"global_step": step}, tmp_path / f"step={step}.ckpt")
    steps = [s.entry.name.step for s in describe_steps(io.store) if s.state.verified]
    assert sorted(steps) == [2, 3]


@pytest.mark.parametrize("make", KINDS)
def test_no_root_reads_rtj_checkpoint_uri(
    make: Make, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError, match="root: none given and RTJ_CHECKPOINT_URI is not set"):
        make()
    monkeypatch.setenv("RTJ_CHECKPOINT_URI", f"file://{tmp_path}/ckpt")
    assert make().store.uri == f"file://{tmp_path}/ckpt"
    assert resume_step() is None  # nothing published there yet
