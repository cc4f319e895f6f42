"""Hugging Face Accelerate: ``accelerator.save_state`` published as a verified step, and
``accelerator.load_state`` from the step to resume.

    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    state = PublishingState(accelerator)   # RTJ_CHECKPOINT_URI; or a path, file:// or s3://
    step = state.restore()                 # 0 on a fresh start
    ...
    state.save(step)                       # every rank calls it, as save_state

:meth:`PublishingState.save` has every rank write ``accelerator.save_state`` (model,
optimizer, scheduler, scaler, every process's RNG states, the objects registered with
``register_for_checkpointing``) into one staging directory, waits for all of them, and the
main process publishes the directory as the step through the commit protocol; every rank
returns once the step is published (or raises the main process's error). The staging
directory must be visible to every rank: one node, or ``staging_dir=`` on a shared
filesystem (a save that lacks a rank's RNG file is refused, naming the fix).

:meth:`PublishingState.restore` takes the Checkpointer's decision on the main process (the
operator's pin in the pod's first incarnation, else the newest step that passes deep
verification, newer ones skipped with the reason), hands the step to every rank, and each
rank runs ``accelerator.load_state`` on it. The dataloader position is the caller's: the
step number says how many batches of the current epoch to skip
(``accelerator.skip_first_batches``).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

import accelerate
import torch
from accelerate import Accelerator
from accelerate.utils import broadcast_object_list

from rtj_shim.checkpoint.manifest import Framework
from rtj_shim.checkpoint.protocol import PublishResult, StepMetadata
from rtj_shim.checkpoint.storage import CheckpointStore
from rtj_shim.errors import CheckpointError
from rtj_shim.integrations._common import (
    UNSET,
    Retention,
    StepPublisher,
    _Unset,
    publish_step,
    resolve_everywhere,
)

__all__ = ["PublishingState"]

log = logging.getLogger("rtj_shim.integrations")

RNG_FILE = re.compile(r"^random_states_(\d+)\.pkl$")


class PublishingState(StepPublisher):
    """``accelerator``: the ``Accelerator`` whose state is saved and loaded (after
    ``prepare``); ``root``: the checkpoint root (default: the operator's
    ``RTJ_CHECKPOINT_URI``); ``attempt``: the writer attempt (default ``RTJ_ATTEMPT`` or 0);
    ``keep_last``: the steps kept after every publish when the job's environment sets no
    retention (``RTJ_KEEP_LAST`` comes first; neither: every step is kept), as
    ``Checkpointer(keep_last=...)``; ``staging_dir``: where ``save_state`` writes before
    the publish, a directory every rank sees (default: the system's temporary directory,
    enough on one node); ``download_dir``: where a step of a non-filesystem root (S3) is
    copied to be loaded, one subdirectory per rank (default: a temporary directory, deleted
    once loaded). ``retention`` (a ``RetentionPolicy``) is the deprecated spelling of
    ``keep_last``."""

    def __init__(
        self,
        accelerator: Accelerator,
        root: str | CheckpointStore | None = None,
        *,
        attempt: str | None = None,
        keep_last: int | None = None,
        staging_dir: str | os.PathLike[str] | None = None,
        download_dir: str | os.PathLike[str] | None = None,
        retention: Retention | _Unset = UNSET,
    ) -> None:
        if accelerator.project_configuration.automatic_checkpoint_naming:
            raise ValueError(
                f"{type(self).__name__}: the Accelerator's ProjectConfiguration has "
                "automatic_checkpoint_naming=True, which makes save_state ignore the directory "
                "it is given; turn it off (the published steps are the checkpoints, and "
                "keep_last= or RTJ_KEEP_LAST bounds them)"
            )
        super().__init__(root, attempt=attempt, keep_last=keep_last, staging_dir=staging_dir,
                         download_dir=download_dir, retention=retention)  # fmt: skip
        self.accelerator = accelerator

    # ------------------------------------------------------------------ saving

    def save(self, step: int) -> PublishResult | None:
        """Every rank: ``accelerator.save_state`` into a staging directory, published by
        the main process as ``step``. Returns the publish on the main process (None on the
        others, and for a step already published that verifies, which is kept)."""
        acc = self.accelerator
        staging = self._broadcast(
            self.new_staging("rtj-accelerate-") if acc.is_main_process else None
        )
        if not isinstance(staging, str):
            raise CheckpointError(f"step {step}: no staging directory ({staging!r})")
        try:
            Path(staging).mkdir(parents=True, exist_ok=True)  # another node's ranks
            acc.save_state(staging)
            acc.wait_for_everyone()  # every rank's files (RNG states, shards) are written
            error: str | None = None
            result: PublishResult | None = None
            if acc.is_main_process:
                try:
                    check_every_rank_wrote(Path(staging), acc.num_processes)
                    result = publish_step(self.protocol, step, Path(staging), self._metadata())
                except Exception as exc:  # every rank raises it, none waits forever
                    error = f"{type(exc).__name__}: {exc}"
                    if acc.num_processes == 1:
                        raise
            error = self._broadcast(error)
            if error is not None:
                raise CheckpointError(f"step {step} was not published: {error}")
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return self.published(step, result)

    # ------------------------------------------------------------------ resuming

    def restore(self, *, restored_once: bool = False) -> int:
        """Every rank: load the step to resume into the accelerator (``load_state``) and
        return its number; 0 (nothing loaded) on a fresh start. The main process decides
        (the operator's pin in the first incarnation unless ``restored_once``, else the
        newest step that passes deep verification; newer ones skipped with the reason, in
        ``self.resumed.skipped`` and a warning) and every rank loads that step."""
        acc = self.accelerator
        found = resolve_everywhere(
            self.store,
            rank=acc.process_index,
            world=acc.num_processes,
            broadcast=self._broadcast,
            download_dir=self.copy_dir(acc.process_index),
            restored_once=restored_once,
        )
        if found is None:
            self.resumed = None
            return 0
        try:
            acc.load_state(str(found.directory))
        finally:
            self.drop_copy(found.directory)
        self.resumed = found
        return found.step

    # ------------------------------------------------------------------ helpers

    def _broadcast(self, value: Any) -> Any:
        if self.accelerator.num_processes == 1:
            return value
        return broadcast_object_list([value], from_process=0)[0]

    def _metadata(self) -> StepMetadata:
        acc = self.accelerator
        return StepMetadata.from_env(
            world_size=acc.num_processes,
            framework=Framework(
                name="accelerate",
                version=accelerate.__version__,
                components={"torch": torch.__version__},
            ),
            extra={
                "format": "accelerate-save-state",
                "distributed_type": str(acc.distributed_type.value),
            },
        )


def check_every_rank_wrote(directory: Path, processes: int) -> None:
    """``save_state`` writes one ``random_states_<process>.pkl`` per process: all of them
    must be in the directory the main process publishes."""
    seen = {int(m.group(1)) for p in directory.iterdir() if (m := RNG_FILE.match(p.name))}
    missing = sorted(set(range(processes)) - seen)
    if missing:
        raise CheckpointError(
            f"{directory} lacks the RNG states of process(es) {missing}: the ranks wrote "
            "to different filesystems; pass PublishingState(..., staging_dir=...) on a "
            "filesystem every rank shares"
        )
