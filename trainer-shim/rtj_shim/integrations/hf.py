"""Hugging Face ``Trainer``: a callback that publishes every checkpoint directory the
``Trainer`` writes as a verified step, and the resume helper that finds the step.

    publisher = PublishCheckpoints()  # RTJ_CHECKPOINT_URI; or a path, file:// or s3://
    trainer = Trainer(model=model, args=TrainingArguments(output_dir=out, save_steps=500),
                      train_dataset=data, callbacks=[publisher])
    trainer.train(resume_from_checkpoint=resume_checkpoint())   # None: a fresh start

The ``Trainer`` writes ``output_dir/checkpoint-<global_step>/`` (model, optimizer,
scheduler, every rank's RNG states, ``trainer_state.json``) and then calls ``on_save``;
the callback waits for every rank (a barrier when ``torch.distributed`` is initialized)
and world process zero publishes the directory as ``global_step`` through the commit
protocol. ``save_total_limit`` keeps trimming ``output_dir``; the published steps follow
the job's retention.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from rtj_shim.checkpoint.manifest import Framework
from rtj_shim.checkpoint.protocol import PublishResult, StepMetadata
from rtj_shim.checkpoint.storage import CheckpointStore
from rtj_shim.integrations._common import (
    UNSET,
    LocalStep,
    Retention,
    _Unset,
    make_protocol,
    open_root,
    publish_step,
    resolve_local,
    retention_policy,
)

__all__ = ["PublishCheckpoints", "resume_checkpoint", "resume_step"]

log = logging.getLogger("rtj_shim.integrations")


class PublishCheckpoints(TrainerCallback):
    """``root``: the checkpoint root (default: the operator's ``RTJ_CHECKPOINT_URI``);
    ``attempt``: the writer attempt (default ``RTJ_ATTEMPT`` or 0); ``keep_last``: the
    steps kept after every publish when the job's environment sets no retention
    (``RTJ_KEEP_LAST`` comes first; neither: every step is kept), as
    ``Checkpointer(keep_last=...)``. ``retention`` (a ``RetentionPolicy``) is the
    deprecated spelling of ``keep_last``."""

    def __init__(
        self,
        root: str | CheckpointStore | None = None,
        *,
        attempt: str | None = None,
        keep_last: int | None = None,
        retention: Retention | _Unset = UNSET,
    ) -> None:
        self.store = open_root(root)
        policy = retention_policy(type(self).__name__, keep_last, retention)
        self.protocol = make_protocol(self.store, attempt, policy)
        self.last_publish: PublishResult | None = None

    def on_save(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            dist.barrier()  # every rank has written its part (its RNG state, its shards)
        if not state.is_world_process_zero:
            return
        if args.output_dir is None:
            raise ValueError("TrainingArguments.output_dir is not set: nothing was saved")
        folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        meta = StepMetadata.from_env(
            world_size=world,
            framework=Framework(
                name="transformers",
                version=transformers.__version__,
                components={"torch": torch.__version__},
            ),
            extra={"epoch": state.epoch, "format": "hf-trainer-checkpoint"},
        )
        result = publish_step(self.protocol, state.global_step, folder, meta)
        if result is not None:
            self.last_publish = result
            log.info("published step %d: %s", state.global_step, result.uri)


def resume_step(
    root: str | CheckpointStore | None = None,
    *,
    download_dir: str | os.PathLike[str] | None = None,
    restored_once: bool = False,
) -> LocalStep | None:
    """The step to resume (the operator's pin, else the newest step that passes deep
    verification) under ``root`` (default: ``RTJ_CHECKPOINT_URI``) as a local directory,
    with why newer steps were skipped; None when there is nothing to resume. A
    non-filesystem root (S3) is copied into ``download_dir`` (default: a new temporary
    directory), each file checked against the manifest."""
    return resolve_local(root, download_dir=download_dir, restored_once=restored_once)


def resume_checkpoint(
    root: str | CheckpointStore | None = None,
    *,
    download_dir: str | os.PathLike[str] | None = None,
    restored_once: bool = False,
) -> str | None:
    """:func:`resume_step` as ``trainer.train(resume_from_checkpoint=...)`` takes it."""
    found = resume_step(root, download_dir=download_dir, restored_once=restored_once)
    return None if found is None else str(found.directory)
