"""Ray Train: the checkpoint directory a Ray Train worker reports, published as a verified
step, and the step to resume handed to every worker as a local directory.

    def train_func(config):                     # run by TorchTrainer on every worker
        ckpts = PublishingReporter()            # RTJ_CHECKPOINT_URI; or a path, file:// or s3://
        step, directory = ckpts.restore()       # 0, None on a fresh start
        if directory is not None:
            state = torch.load(directory / "state.pt")
        ...
        with tempfile.TemporaryDirectory() as d:
            if ray.train.get_context().get_world_rank() == 0:
                torch.save({...}, f"{d}/state.pt")
            ckpts.report({"loss": loss}, step, d)   # every worker, as ray.train.report

:meth:`PublishingReporter.report` is collective, as ``ray.train.report`` is: every
worker's directory (or None) is merged into one staging directory (what Ray does with the
workers' checkpoint directories), the first worker publishes it as ``step`` through the
commit protocol, and every worker then reports ``metrics`` to Ray. Ray's own checkpoint is
not written (the published step is the checkpoint); ``checkpoint_to_ray=True`` hands Ray
the same files too (for ``Result.checkpoint``). The staging directory must be one every
worker that writes sees: one node, or ``staging_dir=`` on a shared filesystem (only the
first worker writing: any directory on its node).

:meth:`PublishingReporter.restore` takes the Checkpointer's decision on the first worker
(the operator's pin in the pod's first incarnation, else the newest step that passes deep
verification, newer ones skipped with the reason) and hands every worker the step as a
local directory (a filesystem root's step is read in place: do not write into it). Ray's
``get_checkpoint()`` is not consulted: it knows the run's own storage only, not whether a
step verifies.

Needs ``torch.distributed`` initialized when there is more than one worker
(``TorchTrainer`` does it): the decision and the staging directory travel through it.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ray
import ray.train
import torch

from rtj_shim.checkpoint.manifest import Framework
from rtj_shim.checkpoint.protocol import PublishResult, StepMetadata
from rtj_shim.checkpoint.storage import CheckpointStore
from rtj_shim.errors import CheckpointError
from rtj_shim.integrations import _torch_ranks as ranks
from rtj_shim.integrations._common import StepPublisher, publish_step, resolve_everywhere

__all__ = ["PublishingReporter"]

log = logging.getLogger("rtj_shim.integrations")


class PublishingReporter(StepPublisher):
    """``root``: the checkpoint root (default: the operator's ``RTJ_CHECKPOINT_URI``);
    ``attempt``: the writer attempt (default ``RTJ_ATTEMPT`` or 0); ``keep_last``: the steps
    kept after every publish when the job's environment sets no retention (``RTJ_KEEP_LAST``
    first; neither: every step kept); ``staging_dir``: where the workers' files are merged
    before the publish; ``download_dir``: where a step of a non-filesystem root (S3) is
    copied for the workers, one subdirectory per worker (default: a temporary directory,
    yours to delete); ``checkpoint_to_ray``: also hand Ray the published files."""

    def __init__(
        self,
        root: str | CheckpointStore | None = None,
        *,
        attempt: str | None = None,
        keep_last: int | None = None,
        staging_dir: str | os.PathLike[str] | None = None,
        download_dir: str | os.PathLike[str] | None = None,
        checkpoint_to_ray: bool = False,
    ) -> None:
        super().__init__(root, attempt=attempt, keep_last=keep_last, staging_dir=staging_dir,
                         download_dir=download_dir)  # fmt: skip
        self.checkpoint_to_ray = checkpoint_to_ray

    @property
    def rank(self) -> int:
        return int(ray.train.get_context().get_world_rank())

    @property
    def world(self) -> int:
        return int(ray.train.get_context().get_world_size())

    # ------------------------------------------------------------------ saving

    def report(
        self,
        metrics: Mapping[str, Any],
        step: int,
        directory: str | os.PathLike[str] | None = None,
    ) -> PublishResult | None:
        """Every worker: its ``directory``'s files (None: it wrote none) merged with the
        others', published by the first worker as ``step``, then ``metrics`` reported to
        Ray. Returns the publish on the first worker (None on the others)."""
        first = self.new_staging("rtj-ray-") if self.rank == 0 else None
        staging = self._broadcast(first)
        if not isinstance(staging, str):
            raise CheckpointError(f"step {step}: no staging directory ({staging!r})")
        result: PublishResult | None = None
        try:
            if directory is not None:
                shutil.copytree(directory, staging, dirs_exist_ok=True)
            ranks.barrier(self.world)  # every worker's files are in
            error: str | None = None
            if self.rank == 0:
                try:
                    result = self._publish(step, Path(staging))
                except Exception as exc:  # every worker raises it, none waits forever
                    error = f"{type(exc).__name__}: {exc}"
                    if self.world == 1:
                        raise
            error = self._broadcast(error)
            if error is not None:
                raise CheckpointError(f"step {step} was not published: {error}")
            self._report_to_ray(metrics, staging)  # collective: Ray has copied what it got
        finally:
            if self.rank == 0:
                shutil.rmtree(staging, ignore_errors=True)
        return self.published(step, result)

    def _publish(self, step: int, staging: Path) -> PublishResult | None:
        if not any(staging.iterdir()):
            raise CheckpointError(
                f"no worker's directory reached {staging}: pass the directory you wrote to "
                "report(), and on several nodes PublishingReporter(staging_dir=...) on a "
                "filesystem every writing worker shares"
            )
        return publish_step(self.protocol, step, staging, self._metadata())

    def _report_to_ray(self, metrics: Mapping[str, Any], staging: str) -> None:
        if self.checkpoint_to_ray and self.rank == 0:
            checkpoint = ray.train.Checkpoint.from_directory(staging)
            ray.train.report(dict(metrics), checkpoint=checkpoint)
        else:
            ray.train.report(dict(metrics))

    # ------------------------------------------------------------------ resuming

    def restore(self, *, restored_once: bool = False) -> tuple[int, Path | None]:
        """Every worker: the step to resume and its files as a local directory; ``(0,
        None)`` on a fresh start. The first worker decides (the operator's pin in the first
        incarnation unless ``restored_once``, else the newest step that passes deep
        verification; newer ones skipped with the reason, in ``self.resumed.skipped`` and
        a warning)."""
        found = resolve_everywhere(
            self.store,
            rank=self.rank,
            world=self.world,
            broadcast=self._broadcast,
            download_dir=self.copy_dir(self.rank),
            restored_once=restored_once,
        )
        self.resumed = found
        if found is None:
            return 0, None
        return found.step, found.directory

    # ------------------------------------------------------------------ helpers

    def _broadcast(self, value: Any) -> Any:
        return ranks.broadcast(value, self.world, " (TorchTrainer initializes it before your "
                               "training function runs)")  # fmt: skip

    def _metadata(self) -> StepMetadata:
        return StepMetadata.from_env(
            world_size=self.world,
            parallelism={"dp": self.world},
            framework=Framework(
                name="ray-train",
                version=ray.__version__,
                components={"torch": torch.__version__},
            ),
            extra={"format": "ray-train-report"},
        )
