"""The Lightning CheckpointIO plugin: every ModelCheckpoint save is a published, verified
step; a run killed mid-epoch resumes from the newest step that verifies and trains the
remaining steps with exactly the losses of an uninterrupted run. The same plugin works
with a Trainer of the ``lightning`` package and of the standalone ``pytorch_lightning``.

Exact here because everything that decides a step is in Lightning's checkpoint (weights,
Adam moments, the LR scheduler, the loops' position) and the data order is fixed: saves at
epoch ends, no shuffling, no dropout. Lightning saves no RNG state and cannot skip into a
plain DataLoader mid-epoch, so neither would be restored (see docs/converting.md).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from rtj_shim.checkpoint.layout import step_key
from rtj_shim.checkpoint.resolver import describe_steps
from rtj_shim.checkpoint.storage import open_store
from rtj_shim.checkpoint.verification import Depth
from rtj_shim.integrations.lightning import PublishingCheckpointIO

STEPS_PER_EPOCH = 4  # 32 samples, batches of 8
EPOCHS = 4


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in [n for n in os.environ if n.startswith("RTJ_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("RTJ_RESUME_FILE", str(tmp_path / "absent-resume.json"))
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    warnings.filterwarnings("ignore", module="(pytorch_)?lightning")


class TinyLogic:
    """The model, data and optimizer; mixed into either package's LightningModule."""

    global_step: int

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
        self.losses: dict[int, float] = {}  # global step (1-based, after the step) -> loss

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.losses[self.global_step + 1] = loss.item()
        return loss

    def configure_optimizers(self) -> Any:
        opt = torch.optim.Adam(self.parameters(), lr=0.05)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def train_dataloader(self) -> DataLoader[tuple[torch.Tensor, ...]]:
        g = torch.Generator().manual_seed(1)
        x = torch.randn(32, 4, generator=g)
        y = x.sum(dim=1, keepdim=True).sin()
        return DataLoader(TensorDataset(x, y), batch_size=8, shuffle=False)


class Tiny(TinyLogic, LightningModule):
    pass


class TinyPL(TinyLogic, pl.LightningModule):  # import pytorch_lightning as pl
    pass


class Killed(Exception):
    pass


class KillAfter(Callback):
    """The process dies right after optimizer step ``step``: nothing later is saved."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            raise Killed(f"killed after step {self.step}")


def fit(
    root: str, out: Path, *, kill_after: int | None = None, resume: bool = False
) -> tuple[Tiny, PublishingCheckpointIO]:
    io = PublishingCheckpointIO(root, download_dir=out / "downloaded")  # used for s3:// only
    model = Tiny()
    callbacks: list[Any] = [
        ModelCheckpoint(dirpath=out, every_n_epochs=1, save_top_k=-1, save_on_train_epoch_end=True)
    ]
    if kill_after is not None:
        callbacks.append(KillAfter(kill_after))
    trainer = Trainer(
        max_epochs=EPOCHS,
        accelerator="cpu",
        devices=1,
        callbacks=callbacks,
        plugins=[io],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    ckpt_path = io.resume_path() if resume else None
    if kill_after is None:
        trainer.fit(model, ckpt_path=ckpt_path)
    else:
        with pytest.raises(Killed):
            trainer.fit(model, ckpt_path=ckpt_path)
    return model, io


def published(root: str) -> list[tuple[int, bool]]:
    listing = describe_steps(open_store(root), Depth.DEEP)
    return [(s.entry.name.step, s.state.verified) for s in listing if not s.entry.name.in_progress]


def test_killed_run_resumes_with_the_uninterrupted_losses(tmp_path: Path) -> None:
    root_a, root_b = f"file://{tmp_path}/a", f"file://{tmp_path}/b"
    total = STEPS_PER_EPOCH * EPOCHS
    full, _ = fit(root_a, tmp_path / "out-a")
    assert sorted(full.losses) == list(range(1, total + 1))
    assert sorted(published(root_a)) == [(s, True) for s in (4, 8, 12, 16)]
    assert not list((tmp_path / "out-a").glob("*.ckpt"))  # the published step is the copy

    killed, _ = fit(root_b, tmp_path / "out-b", kill_after=10)  # mid-epoch 3
    assert max(killed.losses) == 10
    assert sorted(published(root_b)) == [(4, True), (8, True)]

    resumed, io = fit(root_b, tmp_path / "out-b", resume=True)
    assert io.resumed is not None and io.resumed.step == 8
    assert sorted(resumed.losses) == list(range(9, total + 1))
    for step in range(9, total + 1):  # bit-for-bit: the same float, not approximately
        assert resumed.losses[step] == full.losses[step], step
    for step in range(9, 11):  # steps the killed run trained too
        assert killed.losses[step] == full.losses[step]
    assert sorted(published(root_b)) == [(s, True) for s in (4, 8, 12, 16)]


def test_a_corrupt_newest_step_is_skipped(tmp_path: Path) -> None:
    root_a, root_b = f"file://{tmp_path}/a", f"file://{tmp_path}/b"
    full, _ = fit(root_a, tmp_path / "out-a")
    fit(root_b, tmp_path / "out-b", kill_after=10)
    (ckpt,) = (tmp_path / "b" / step_key(8)).glob("*.ckpt")
    raw = bytearray(ckpt.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # same size: only deep verification notices
    ckpt.write_bytes(bytes(raw))

    resumed, io = fit(root_b, tmp_path / "out-b", resume=True)
    assert io.resumed is not None and io.resumed.step == 4
    assert [s for s, _ in io.resumed.skipped] == [8]
    assert sorted(resumed.losses) == list(range(5, STEPS_PER_EPOCH * EPOCHS + 1))
    assert all(resumed.losses[s] == full.losses[s] for s in resumed.losses)
    # the corrupt step 8 was replaced by the resumed run's save of step 8
    assert sorted(published(root_b)) == [(s, True) for s in (4, 8, 12, 16)]


def test_fresh_start_and_best_path_load(tmp_path: Path) -> None:
    root = f"file://{tmp_path}/r"
    io = PublishingCheckpointIO(root)
    assert io.resume_path() is None
    model, io = fit(root, tmp_path / "out")
    best = str(tmp_path / "out" / "epoch=3-step=16.ckpt")
    loaded = io.load_checkpoint(best)  # never written locally: read from published step 16
    assert loaded["global_step"] == 16
    assert torch.equal(loaded["state_dict"]["net.0.weight"], model.state_dict()["net.0.weight"])


@pytest.mark.s3
def test_an_s3_root_resumes_through_a_verified_copy(s3_root: str, tmp_path: Path) -> None:
    full, _ = fit(f"file://{tmp_path}/a", tmp_path / "out-a")
    fit(s3_root, tmp_path / "out-b", kill_after=10)
    resumed, io = fit(s3_root, tmp_path / "out-b", resume=True)
    assert io.resumed is not None and io.resumed.step == 8
    assert io.resumed.uri.startswith("s3://")
    assert all(resumed.losses[s] == full.losses[s] for s in resumed.losses)
    assert sorted(resumed.losses) == list(range(9, STEPS_PER_EPOCH * EPOCHS + 1))
    assert sorted(published(s3_root)) == [(s, True) for s in (4, 8, 12, 16)]


def test_a_pytorch_lightning_trainer_takes_the_plugin_and_resumes(tmp_path: Path) -> None:
    """``import pytorch_lightning as pl``: its Trainer accepts the plugin (no
    MisconfigurationException), publishes through it and resumes from it, with the losses
    of the ``lightning.pytorch`` run."""
    root_a, root_b = f"file://{tmp_path}/a", f"file://{tmp_path}/b"
    full, _ = fit(root_a, tmp_path / "out-a")

    def fit_pl(epochs: int, resume: bool) -> tuple[TinyPL, PublishingCheckpointIO]:
        io = PublishingCheckpointIO(root_b)
        assert isinstance(io, pl.plugins.io.CheckpointIO)
        model = TinyPL()
        trainer = pl.Trainer(
            max_epochs=epochs,
            accelerator="cpu",
            devices=1,
            callbacks=[pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "out-b", every_n_epochs=1)],
            plugins=[io],
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer.fit(model, ckpt_path=io.resume_path() if resume else None)
        assert trainer.strategy.checkpoint_io is io
        return model, io

    first, io = fit_pl(2, resume=False)
    assert io.resumed is None and sorted(first.losses) == list(range(1, 9))
    assert sorted(published(root_b)) == [(4, True), (8, True)]
    resumed, io = fit_pl(EPOCHS, resume=True)
    assert io.resumed is not None and io.resumed.step == 8
    assert sorted(resumed.losses) == list(range(9, STEPS_PER_EPOCH * EPOCHS + 1))
    assert all(first.losses[s] == full.losses[s] for s in first.losses)
    assert all(resumed.losses[s] == full.losses[s] for s in resumed.losses)
    assert sorted(published(root_b)) == [(s, True) for s in (4, 8, 12, 16)]
