"""Megatron Core: a distributed checkpoint (``megatron.core.dist_checkpointing.save`` of a
sharded state dict) published as a verified step, and loaded from the step to resume.

    ckpt = PublishingDistCheckpoint()           # RTJ_CHECKPOINT_URI; or a path, file:// or s3://
    step, state = ckpt.restore(model.sharded_state_dict())   # 0, None on a fresh start
    if state is not None:
        model.load_state_dict(state)
    ...
    ckpt.save(step, model.sharded_state_dict())   # every rank, as dist_checkpointing.save

:meth:`PublishingDistCheckpoint.save` has every rank take part in Megatron's save into one
staging directory (each rank writes its shards, ``__<rank>_<thread>.distcp``; the first
writes ``common.pt``, torch DCP's ``.metadata`` and, last, after every rank has written,
``metadata.json``, Megatron's mark of a complete checkpoint), waits for all, and the first
rank publishes the directory through the commit protocol (``metadata.json`` alone is
written with a plain ``open``, not atomically; the published step is the commit). The
staging directory must be one every rank sees: one node, or ``staging_dir=`` on a shared
filesystem (a save without ``metadata.json`` or ``.metadata`` is refused).

:meth:`PublishingDistCheckpoint.restore` takes the Checkpointer's decision on the first
rank (the operator's pin in the pod's first incarnation, else the newest step that passes
deep verification, newer ones skipped with the reason), hands it to every rank, and each
loads it with ``dist_checkpointing.load`` into the sharded state dict it gives: Megatron
maps every tensor by its global offsets, so another tensor- or data-parallel layout loads
the same values (the optimizer's own formats, ``dp_reshardable`` and ``fully_reshardable``,
are the caller's sharded state dict to give; they are not tested here: Megatron's
distributed optimizer needs CUDA).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import megatron.core
import torch
from megatron.core import dist_checkpointing, parallel_state
from torch.distributed.checkpoint.filesystem import FileSystemReader

from rtj_shim.checkpoint.manifest import Framework
from rtj_shim.checkpoint.protocol import PublishResult, StepMetadata
from rtj_shim.checkpoint.storage import CheckpointStore
from rtj_shim.errors import CheckpointError
from rtj_shim.integrations import _torch_ranks as ranks
from rtj_shim.integrations._common import publish_step, resolve_everywhere

__all__ = ["PublishingDistCheckpoint", "check_complete"]

log = logging.getLogger("rtj_shim.integrations")

ITEM = "state"
"""The directory, inside a published step, that holds Megatron's checkpoint."""
COMPLETE_MARK = "metadata.json"
"""Megatron's last file of a save (after a barrier): without it, load refuses the directory."""


class PublishingDistCheckpoint(ranks.TorchRanksPublisher):
    """``root``: the checkpoint root (default: the operator's ``RTJ_CHECKPOINT_URI``);
    ``attempt``: the writer attempt (default ``RTJ_ATTEMPT`` or 0); ``keep_last``: the steps
    kept after every publish when the job's environment sets no retention (``RTJ_KEEP_LAST``
    first; neither: every step kept); ``staging_dir``: where Megatron writes before the
    publish, a directory every rank sees (default: the system's temporary directory, enough
    on one node); ``download_dir``: where a step of a non-filesystem root (S3) is copied to
    be loaded, one subdirectory per rank (default: a temporary directory, deleted once
    loaded). ``save_kwargs``: passed to every ``dist_checkpointing.save`` (a strategy,
    ``validate_access_integrity``, ...)."""

    def __init__(
        self,
        root: str | CheckpointStore | None = None,
        *,
        attempt: str | None = None,
        keep_last: int | None = None,
        staging_dir: str | os.PathLike[str] | None = None,
        download_dir: str | os.PathLike[str] | None = None,
        **save_kwargs: Any,
    ) -> None:
        super().__init__(root, attempt=attempt, keep_last=keep_last, staging_dir=staging_dir,
                         download_dir=download_dir)  # fmt: skip
        self.save_kwargs = save_kwargs

    # ------------------------------------------------------------------ saving

    def save(self, step: int, sharded_state_dict: dict[str, Any]) -> PublishResult | None:
        """Every rank: Megatron saves ``sharded_state_dict`` into a staging directory, the
        first rank publishes it as ``step``. The publish on the first rank (None on the
        others)."""
        first = self.new_staging("rtj-megatron-") if self.rank == 0 else None
        staging = ranks.broadcast(first, self.world)
        if not isinstance(staging, str):
            raise CheckpointError(f"step {step}: no staging directory ({staging!r})")
        target = Path(staging) / ITEM
        result: PublishResult | None = None
        try:
            target.mkdir(parents=True, exist_ok=True)  # every node's ranks: it must exist
            ranks.barrier(self.world)
            dist_checkpointing.save(sharded_state_dict, str(target), **self.save_kwargs)
            ranks.barrier(self.world)  # every rank's shards and the first's metadata are written
            error: str | None = None
            if self.rank == 0:
                try:
                    check_complete(target)
                    result = publish_step(self.protocol, step, Path(staging), self._metadata())
                except Exception as exc:  # every rank raises it, none waits forever
                    error = f"{type(exc).__name__}: {exc}"
                    if self.world == 1:
                        raise
            error = ranks.broadcast(error, self.world)
            if error is not None:
                raise CheckpointError(f"step {step} was not published: {error}")
        finally:
            if self.rank == 0:
                shutil.rmtree(staging, ignore_errors=True)
        return self.published(step, result)

    # ------------------------------------------------------------------ resuming

    def restore(
        self, sharded_state_dict: dict[str, Any], *, restored_once: bool = False
    ) -> tuple[int, dict[str, Any] | None]:
        """Every rank: the step to resume and the state dict Megatron loaded from it into
        ``sharded_state_dict``'s shardings; ``(0, None)`` on a fresh start. The first rank
        decides (the operator's pin in the first incarnation unless ``restored_once``, else
        the newest step that passes deep verification; newer ones skipped with the reason,
        in ``self.resumed.skipped`` and a warning)."""
        found = resolve_everywhere(
            self.store,
            rank=self.rank,
            world=self.world,
            broadcast=lambda value: ranks.broadcast(value, self.world),
            download_dir=self.copy_dir(self.rank),
            restored_once=restored_once,
        )
        if found is None:
            self.resumed = None
            return 0, None
        try:
            loaded = dist_checkpointing.load(sharded_state_dict, str(found.directory / ITEM))
        finally:
            self.drop_copy(found.directory)
        self.resumed = found
        return found.step, dict(loaded)

    # ------------------------------------------------------------------ helpers

    def _metadata(self) -> StepMetadata:
        parallelism = {"dp": self.world}
        if parallel_state.model_parallel_is_initialized():
            parallelism = {
                "tp": parallel_state.get_tensor_model_parallel_world_size(),
                "pp": parallel_state.get_pipeline_model_parallel_world_size(),
                "dp": parallel_state.get_data_parallel_world_size(),
            }
        return StepMetadata.from_env(
            world_size=self.world,
            parallelism=parallelism,
            framework=Framework(
                name="megatron-core",
                version=str(getattr(megatron.core, "__version__", "?")),
                components={"torch": torch.__version__},
            ),
            extra={"format": "megatron-dist-checkpointing"},
        )


def check_complete(directory: Path) -> None:
    """Megatron's checkpoint is complete: its ``metadata.json`` (written last, once every
    rank has written) and torch DCP's ``.metadata`` (where every shard is) are there."""
    marks = [name for name in (COMPLETE_MARK, ".metadata") if not (directory / name).is_file()]
    if marks:
        raise CheckpointError(
            f"{directory} lacks {', '.join(marks)}: Megatron's save did not complete there "
            "(on several nodes, pass PublishingDistCheckpoint(staging_dir=...) on a "
            "filesystem every rank shares)"
        )
    try:
        json.loads((directory / COMPLETE_MARK).read_text())
    except ValueError as exc:
        raise CheckpointError(f"{directory / COMPLETE_MARK} is not JSON: {exc}") from exc
    # every shard file torch DCP's metadata names (our own staging, just written)
    storage = FileSystemReader(str(directory)).read_metadata().storage_data or {}
    named = {str(getattr(info, "relative_path", "")) for info in storage.values()}
    missing = sorted(name for name in named if name and not (directory / name).is_file())
    if missing:
        raise CheckpointError(
            f"{directory} lacks {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}: "
            "the ranks wrote to different filesystems; pass PublishingDistCheckpoint("
            "staging_dir=...) on a filesystem every rank shares"
        )
