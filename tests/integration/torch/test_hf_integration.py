"""The Hugging Face Trainer callback: every checkpoint the Trainer writes is a published,
verified step; a run killed mid-epoch resumes (``resume_from_checkpoint``) from the newest
step that verifies and trains the remaining steps with exactly the losses of an
uninterrupted run, on shuffled data with dropout.

Exact here because the Trainer's checkpoint holds everything that decides a step on one
CPU process (weights, AdamW moments, the LR schedule, the RNG states) and the Trainer skips
the batches of the current epoch already seen, drawing the same seeded shuffle.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from transformers import (
    Trainer,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)

from rtj_shim.checkpoint.layout import step_key
from rtj_shim.checkpoint.resolver import describe_steps
from rtj_shim.checkpoint.storage import open_store
from rtj_shim.checkpoint.verification import Depth
from rtj_shim.integrations.hf import PublishCheckpoints, resume_checkpoint, resume_step

SAMPLES, BATCH = 32, 4  # 8 steps per epoch
MAX_STEPS, SAVE_STEPS, KILL_AFTER = 20, 6, 14


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in [n for n in os.environ if n.startswith("RTJ_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("RTJ_RESUME_FILE", str(tmp_path / "absent-resume.json"))
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    warnings.filterwarnings("ignore", module="transformers")


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Dropout(0.2), nn.Linear(16, 1))
        self.last_loss: float | None = None

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        loss = nn.functional.mse_loss(self.net(x), labels)
        self.last_loss = loss.item()
        return {"loss": loss}


def dataset() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(SAMPLES, 4, generator=g)
    y = x.sum(dim=1, keepdim=True).sin()
    return [{"x": x[i], "labels": y[i]} for i in range(SAMPLES)]


class Killed(Exception):
    pass


class Record(TrainerCallback):
    """Each step's loss; the process dies right after step ``kill_after`` (before the
    Trainer could save it)."""

    def __init__(self, model: Tiny, kill_after: int | None) -> None:
        self.model, self.kill_after = model, kill_after
        self.losses: dict[int, float] = {}

    def on_step_end(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        assert self.model.last_loss is not None
        self.losses[state.global_step] = self.model.last_loss
        if state.global_step == self.kill_after:
            raise Killed(f"killed after step {state.global_step}")


def train(
    root: str, out: Path, *, kill_after: int | None = None, resume: bool = False
) -> dict[int, float]:
    torch.manual_seed(0)  # a fresh process: the resumed run does not continue this one's RNGs
    model = Tiny()
    record = Record(model, kill_after)
    args = TrainingArguments(
        output_dir=str(out),
        max_steps=MAX_STEPS,
        per_device_train_batch_size=BATCH,
        learning_rate=0.05,
        lr_scheduler_type="linear",
        save_strategy="steps",
        save_steps=SAVE_STEPS,
        save_total_limit=1,  # output_dir is trimmed; the published steps are not
        logging_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=7,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=dataset(),
        callbacks=[record, PublishCheckpoints(root)],
    )
    checkpoint = resume_checkpoint(root, download_dir=out / "downloaded") if resume else None
    if kill_after is None:
        trainer.train(resume_from_checkpoint=checkpoint)
    else:
        with pytest.raises(Killed):
            trainer.train(resume_from_checkpoint=checkpoint)
    return record.losses


def published(root: str) -> list[tuple[int, bool]]:
    listing = describe_steps(open_store(root), Depth.DEEP)
    return [(s.entry.name.step, s.state.verified) for s in listing if not s.entry.name.in_progress]


def test_killed_run_resumes_with_the_uninterrupted_losses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root_a, root_b = f"file://{tmp_path}/a", f"file://{tmp_path}/b"
    full = train(root_a, tmp_path / "out-a")
    assert sorted(full) == list(range(1, MAX_STEPS + 1))
    assert sorted(published(root_a)) == [(s, True) for s in (6, 12, 18, 20)]
    assert len(list((tmp_path / "out-a").glob("checkpoint-*"))) == 1  # save_total_limit

    killed = train(root_b, tmp_path / "out-b", kill_after=KILL_AFTER)
    assert max(killed) == KILL_AFTER
    assert sorted(published(root_b)) == [(6, True), (12, True)]

    found = resume_step(root_b)
    assert found is not None and found.step == 12
    capsys.readouterr()
    resumed = train(root_b, tmp_path / "out-b", resume=True)
    # which step, from where: printed whatever the log level (issue 44)
    assert (
        f"rtj_shim: resuming step 12 from {root_b}/steps/step-000000000012 (newest verified)"
        in capsys.readouterr().err
    )
    assert sorted(resumed) == list(range(13, MAX_STEPS + 1))
    for step in resumed:  # bit-for-bit: the same float, not approximately
        assert resumed[step] == full[step], step
    assert all(killed[s] == full[s] for s in killed)
    assert sorted(published(root_b)) == [(s, True) for s in (6, 12, 18, 20)]


def test_a_corrupt_newest_step_is_skipped(tmp_path: Path) -> None:
    root_a, root_b = f"file://{tmp_path}/a", f"file://{tmp_path}/b"
    full = train(root_a, tmp_path / "out-a")
    train(root_b, tmp_path / "out-b", kill_after=KILL_AFTER)
    optimizer = tmp_path / "b" / step_key(12) / "optimizer.pt"
    raw = bytearray(optimizer.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # same size: only deep verification notices
    optimizer.write_bytes(bytes(raw))

    found = resume_step(root_b)
    assert found is not None and found.step == 6
    assert [s for s, _ in found.skipped] == [12]
    resumed = train(root_b, tmp_path / "out-b", resume=True)
    assert sorted(resumed) == list(range(7, MAX_STEPS + 1))
    assert all(resumed[s] == full[s] for s in resumed)
    assert sorted(published(root_b)) == [(s, True) for s in (6, 12, 18, 20)]


@pytest.mark.s3
def test_an_s3_root_is_published_and_resumed_through_a_verified_copy(
    s3_root: str, tmp_path: Path
) -> None:
    full = train(f"file://{tmp_path}/a", tmp_path / "out-a")
    train(s3_root, tmp_path / "out-b", kill_after=KILL_AFTER)

    copy = tmp_path / "copy"
    found = resume_step(s3_root, download_dir=copy)
    assert found is not None and found.step == 12
    assert found.directory == copy / "step-000000000012"
    assert (found.directory / "trainer_state.json").is_file()
    resumed = train(s3_root, tmp_path / "out-b", resume=True)
    assert sorted(resumed) == list(range(13, MAX_STEPS + 1))
    assert all(resumed[s] == full[s] for s in resumed)
    assert sorted(published(s3_root)) == [(s, True) for s in (6, 12, 18, 20)]


def test_the_operators_pin_is_honoured_in_the_first_incarnation_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = f"file://{tmp_path}/r"
    train(root, tmp_path / "out", kill_after=KILL_AFTER)  # publishes 6 and 12
    pin = tmp_path / "resume.json"
    uri = open_store(root).key_uri(step_key(6))
    pin.write_text(json.dumps({"step": 6, "uri": uri, "skipped": []}))
    monkeypatch.setenv("RTJ_RESUME_FILE", str(pin))

    found = resume_step(root)
    assert found is not None and (found.step, found.source) == (6, "resume-file")
    again = resume_step(root, restored_once=True)  # after an in-pod restart: resolve again
    assert again is not None and (again.step, again.source) == (12, "resolved")
    pin.write_text(json.dumps({"step": None, "uri": None, "skipped": []}))
    assert resume_checkpoint(root) is None  # the operator said: start fresh
