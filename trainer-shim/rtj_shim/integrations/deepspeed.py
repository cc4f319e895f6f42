"""DeepSpeed: ``engine.save_checkpoint`` published as a verified step, and
``engine.load_checkpoint`` from the step to resume.

    engine, optimizer, _, scheduler = deepspeed.initialize(model=..., config=...)
    state = PublishingEngine(engine)       # RTJ_CHECKPOINT_URI; or a path, file:// or s3://
    step, client_state = state.restore()   # 0, None on a fresh start
    ...
    state.save(step, client_state={...})   # every rank calls it, as save_checkpoint

:meth:`PublishingEngine.save` has every rank write ``engine.save_checkpoint`` (the module's
states from data-parallel rank 0, each rank's ZeRO optimizer partition, the LR scheduler,
the engine's counters and your ``client_state``) into one staging directory under one tag,
waits for all of them, and the first rank publishes the tag's directory as the step through
the commit protocol: DeepSpeed's own ``latest`` file is not written (it is written before
the last rank finishes, so it is no commit marker; the published step is). Every rank
returns once the step is published (or raises the first rank's error). The staging
directory must be visible to every rank: one node, or ``staging_dir=`` on a shared
filesystem (a save that lacks a rank's ZeRO partition is refused, naming the fix).

:meth:`PublishingEngine.restore` takes the Checkpointer's decision on the first rank (the
operator's pin in the pod's first incarnation, else the newest step that passes deep
verification, newer ones skipped with the reason), hands it to every rank, and each rank
runs ``engine.load_checkpoint`` on it. A ZeRO step saved by another number of
data-parallel ranks is refused before anything is loaded (DeepSpeed partitions the
optimizer by that number; its Universal Checkpoint converts one, and is not wired here).
DeepSpeed saves no RNG state: what a step draws (dropout, data order) is the caller's to
derive from the step number, or to carry in ``client_state``.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

import deepspeed
import torch

from rtj_shim.checkpoint.manifest import Framework, Manifest
from rtj_shim.checkpoint.protocol import PublishResult, StepMetadata
from rtj_shim.checkpoint.storage import CheckpointStore
from rtj_shim.errors import CheckpointError
from rtj_shim.integrations import _torch_ranks as ranks
from rtj_shim.integrations._common import publish_step, resolve_everywhere

__all__ = ["PublishingEngine", "check_every_rank_wrote", "refuse_another_world"]

log = logging.getLogger("rtj_shim.integrations")

TAG = "rtj-step"
"""The tag every save writes under (the published step is the tag's directory)."""
ZERO_FILE = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
MODEL_FILE = re.compile(r"^mp_rank_(\d+)_model_states\.pt$")


class PublishingEngine(ranks.TorchRanksPublisher):
    """``engine``: the ``DeepSpeedEngine`` whose state is saved and loaded; ``root``: the
    checkpoint root (default: the operator's ``RTJ_CHECKPOINT_URI``); ``attempt``: the
    writer attempt (default ``RTJ_ATTEMPT`` or 0); ``keep_last``: the steps kept after
    every publish when the job's environment sets no retention (``RTJ_KEEP_LAST`` comes
    first; neither: every step is kept); ``staging_dir``: where ``save_checkpoint`` writes
    before the publish, a directory every rank sees (default: the system's temporary
    directory, enough on one node); ``download_dir``: where a step of a non-filesystem
    root (S3) is copied to be loaded, one subdirectory per rank (default: a temporary
    directory, deleted once loaded)."""

    def __init__(
        self,
        engine: Any,
        root: str | CheckpointStore | None = None,
        *,
        attempt: str | None = None,
        keep_last: int | None = None,
        staging_dir: str | os.PathLike[str] | None = None,
        download_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        super().__init__(root, attempt=attempt, keep_last=keep_last, staging_dir=staging_dir,
                         download_dir=download_dir)  # fmt: skip
        self.engine = engine

    # ------------------------------------------------------------------ saving

    def save(self, step: int, client_state: dict[str, Any] | None = None) -> PublishResult | None:
        """Every rank: ``engine.save_checkpoint`` into a staging directory, published by the
        first rank as ``step``. Returns the publish on the first rank (None on the others)."""
        first = self.new_staging("rtj-deepspeed-") if self.rank == 0 else None
        staging = ranks.broadcast(first, self.world)
        if not isinstance(staging, str):
            raise CheckpointError(f"step {step}: no staging directory ({staging!r})")
        result: PublishResult | None = None
        try:
            Path(staging).mkdir(parents=True, exist_ok=True)  # another node's ranks
            self.engine.save_checkpoint(
                staging, tag=TAG, client_state=dict(client_state or {}), save_latest=False
            )
            ranks.barrier(self.world)  # every rank's partition is written
            error: str | None = None
            if self.rank == 0:
                try:
                    tagged = Path(staging) / TAG
                    check_every_rank_wrote(tagged, *self._layout())
                    result = publish_step(self.protocol, step, tagged, self._metadata())
                except Exception as exc:  # every rank raises it, none waits forever
                    error = f"{type(exc).__name__}: {exc}"
                    if self.world == 1:
                        raise
            error = ranks.broadcast(error, self.world)
            if error is not None:
                raise CheckpointError(f"step {step} was not published: {error}")
        finally:  # every rank wrote before the barrier and reads nothing after it
            if self.rank == 0:
                shutil.rmtree(staging, ignore_errors=True)
        return self.published(step, result)

    # ------------------------------------------------------------------ resuming

    def restore(self, *, restored_once: bool = False) -> tuple[int, dict[str, Any] | None]:
        """Every rank: load the step to resume into the engine (``load_checkpoint``); its
        number and the ``client_state`` saved with it; ``(0, None)`` on a fresh start. The
        first rank decides (the operator's pin in the first incarnation unless
        ``restored_once``, else the newest step that passes deep verification; newer ones
        skipped with the reason, in ``self.resumed.skipped`` and a warning)."""
        found = resolve_everywhere(
            self.store,
            rank=self.rank,
            world=self.world,
            broadcast=lambda value: ranks.broadcast(value, self.world),
            download_dir=self.copy_dir(self.rank),
            restored_once=restored_once,
            check=lambda manifest: refuse_another_world(manifest, *self._layout()),
        )
        if found is None:
            self.resumed = None
            return 0, None
        step = found.step
        try:
            path, client_state = self.engine.load_checkpoint(
                str(found.directory.parent), tag=found.directory.name
            )
        finally:
            self.drop_copy(found.directory)
        if path is None:
            raise CheckpointError(f"DeepSpeed loaded nothing from step {step} ({found.uri})")
        self.resumed = found
        return step, client_state

    # ------------------------------------------------------------------ helpers

    def _layout(self) -> tuple[int, int, int]:
        """ZeRO stage, data-parallel ranks, model-parallel ranks of this engine."""
        stage = int(self.engine.zero_optimization_stage())
        return (stage, int(getattr(self.engine, "dp_world_size", self.world)),
                int(getattr(self.engine, "mp_world_size", 1)))  # fmt: skip

    def _metadata(self) -> StepMetadata:
        stage, dp, mp = self._layout()
        return StepMetadata.from_env(
            world_size=self.world,
            parallelism={"dp": dp, "mp": mp},
            framework=Framework(
                name="deepspeed",
                version=deepspeed.__version__,
                components={"torch": torch.__version__},
            ),
            extra={"format": "deepspeed-save-checkpoint", "zero_stage": stage},
        )


def check_every_rank_wrote(directory: Path, stage: int, dp: int, mp: int) -> None:
    """The tag's directory holds every model-parallel rank's module states and, under ZeRO,
    every data-parallel rank's optimizer partition: else the ranks wrote to different
    filesystems."""
    names = [p.name for p in directory.iterdir()] if directory.is_dir() else []
    models = {int(m.group(1)) for n in names if (m := MODEL_FILE.match(n))}
    parts = {(int(m.group(1)), int(m.group(2))) for n in names if (m := ZERO_FILE.match(n))}
    missing = [f"mp_rank_{r:02d}_model_states.pt" for r in range(mp) if r not in models]
    if stage > 0:
        missing += [f"zero_pp_rank_{d}_mp_rank_{r:02d}_optim_states.pt" for r in range(mp)
                    for d in range(dp) if (d, r) not in parts]  # fmt: skip
    if missing:
        raise CheckpointError(
            f"{directory} lacks {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}: "
            "the ranks wrote to different filesystems; pass PublishingEngine(..., "
            "staging_dir=...) on a filesystem every rank shares"
        )


def refuse_another_world(manifest: Manifest, stage: int, dp: int, mp: int) -> None:
    """A ZeRO step is partitioned by its data-parallel ranks (and every step by its
    model-parallel ranks): another layout cannot load it as saved."""
    saved = manifest.parallelism
    saved_dp, saved_mp = saved.get("dp"), saved.get("mp")
    saved_stage = manifest.extra.get("zero_stage")
    wrong = []
    if saved_mp is not None and saved_mp != mp:
        wrong.append(
            f"parallelism.mp: saved by {saved_mp} model-parallel ranks, this world has {mp}"
        )
    if saved_stage and saved_dp is not None and saved_dp != dp:
        wrong.append(f"parallelism.dp: ZeRO stage {saved_stage} partitions saved by {saved_dp} "
                     f"data-parallel ranks, this world has {dp}")  # fmt: skip
    if wrong:
        raise CheckpointError(
            f"step {manifest.step} cannot be loaded by this world ({'; '.join(wrong)}): "
            "DeepSpeed loads ZeRO and model-parallel states only into the layout that saved "
            "them; resume with that layout, or convert the step with DeepSpeed's Universal "
            "Checkpoint (deepspeed.checkpoint.ds_to_universal) and load it yourself"
        )
