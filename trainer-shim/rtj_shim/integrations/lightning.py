"""PyTorch Lightning: a ``CheckpointIO`` plugin that publishes every checkpoint Lightning
saves as a verified step, and resumes from the newest step that verifies.

    io = PublishingCheckpointIO()       # RTJ_CHECKPOINT_URI; or a path, file:// or s3://
    trainer = Trainer(callbacks=[ModelCheckpoint(every_n_epochs=1, save_top_k=-1)],
                      plugins=[io])
    trainer.fit(model, ckpt_path=io.resume_path())  # None on a fresh start

The plugin works with a ``Trainer`` from either package, ``lightning`` (``from
lightning.pytorch import Trainer``) or the standalone ``pytorch_lightning``: it subclasses
the ``CheckpointIO`` of the first one installed and is registered as a ``CheckpointIO`` of
the other.

Each save (``ModelCheckpoint``, ``trainer.save_checkpoint``) is written with ``torch.save``
into a temporary directory and published under the checkpoint's ``global_step`` through
the commit protocol: nothing half-written is ever resumed, retention runs after each
publish. The local ``dirpath`` receives nothing. A second save at a global step already
published (``save_last`` beside a top-k file) keeps the first one.

Lightning calls the plugin on global rank 0 only with the single-device and DDP
strategies; sharded strategies (FSDP, DeepSpeed) write per-rank files their own way and do
not use a ``CheckpointIO``, so they are not covered.
"""

from __future__ import annotations

import logging
import os
import tempfile
from abc import ABCMeta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rtj_shim.checkpoint.manifest import Framework
from rtj_shim.checkpoint.protocol import PublishResult, StepMetadata
from rtj_shim.checkpoint.storage import CheckpointStore
from rtj_shim.integrations._common import (
    UNSET,
    LocalStep,
    Retention,
    _Unset,
    local_step,
    make_protocol,
    open_root,
    publish_step,
    resolve_local,
    retention_policy,
)

__all__ = ["PublishingCheckpointIO"]

log = logging.getLogger("rtj_shim.integrations")

CKPT_SUFFIX = ".ckpt"


def checkpoint_io_classes() -> tuple[ABCMeta, ...]:
    """The ``CheckpointIO`` base classes installed: ``lightning`` (``lightning.pytorch``)'s,
    then the standalone ``pytorch_lightning``'s (from ``lightning_fabric``). Two distinct
    classes: each package's ``Trainer`` accepts only a plugin that is an instance of its own
    (otherwise ``MisconfigurationException: Found invalid type for plugin``)."""
    found: list[ABCMeta] = []
    try:
        from lightning.fabric.plugins.io import CheckpointIO as Unified

        found.append(Unified)
    except ImportError:
        pass
    try:
        from lightning_fabric.plugins.io import CheckpointIO as Standalone

        found.append(Standalone)
    except ImportError:
        pass
    if not found:
        raise ImportError(
            "rtj_shim.integrations.lightning needs PyTorch Lightning: pip install lightning "
            "(or the standalone pytorch-lightning)"
        )
    return tuple(found)


_BASES = checkpoint_io_classes()
if TYPE_CHECKING:
    from lightning.fabric.plugins.io import CheckpointIO
else:
    CheckpointIO = _BASES[0]


class PublishingCheckpointIO(CheckpointIO):
    """``root``: the checkpoint root (default: the operator's ``RTJ_CHECKPOINT_URI``);
    ``attempt``: the writer attempt (default ``RTJ_ATTEMPT`` or 0); ``keep_last``: the
    steps kept after every publish when the job's environment sets no retention
    (``RTJ_KEEP_LAST`` comes first; neither: every step is kept), as
    ``Checkpointer(keep_last=...)``; ``download_dir``: where a step of a non-filesystem root
    is copied to be loaded (default: a temporary directory per load). ``retention``
    (a ``RetentionPolicy``) is the deprecated spelling of ``keep_last``.

    A plugin for ``lightning.pytorch.Trainer`` and ``pytorch_lightning.Trainer`` alike."""

    def __init__(
        self,
        root: str | CheckpointStore | None = None,
        *,
        attempt: str | None = None,
        keep_last: int | None = None,
        download_dir: str | os.PathLike[str] | None = None,
        retention: Retention | _Unset = UNSET,
    ) -> None:
        super().__init__()
        self.store = open_root(root)
        policy = retention_policy(type(self).__name__, keep_last, retention)
        self.protocol = make_protocol(self.store, attempt, policy)
        self.download_dir = download_dir
        self.last_publish: PublishResult | None = None
        self.resumed: LocalStep | None = None
        self._published: dict[str, int] = {}  # the path Lightning named -> its step

    # ------------------------------------------------------------------ saving

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | os.PathLike[str], storage_options: Any = None
    ) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} does not take storage_options")
        step = int(checkpoint["global_step"])
        name = Path(path).name
        if not name.endswith(CKPT_SUFFIX):
            name += CKPT_SUFFIX
        with tempfile.TemporaryDirectory(prefix="rtj-lightning-") as tmp:
            torch.save(checkpoint, Path(tmp) / name)
            result = publish_step(self.protocol, step, Path(tmp), metadata(checkpoint))
        self._published[str(path)] = step
        if result is not None:
            self.last_publish = result
            log.info("published step %d (%s): %s", step, name, result.uri)

    def remove_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """A no-op: published steps are immutable and deleted only by the job's retention
        (``RTJ_KEEP_LAST``...); ``ModelCheckpoint``'s top-k list is its own bookkeeping."""

    # ------------------------------------------------------------------ resuming

    def resume_path(self, *, restored_once: bool = False) -> str | None:
        """The ``.ckpt`` of the step to resume (the operator's pin, else the newest step
        that passes deep verification) as a local path for ``trainer.fit(ckpt_path=...)``;
        None when there is nothing to resume."""
        found = resolve_local(
            self.store, download_dir=self.download_dir, restored_once=restored_once
        )
        self.resumed = found
        return None if found is None else str(checkpoint_file(found))

    def load_checkpoint(
        self,
        path: str | os.PathLike[str],
        map_location: Any = None,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        """``weights_only`` defaults to True: a Lightning checkpoint of plain tensors,
        numbers and strings loads without unpickling code. Pass ``weights_only=False``
        (``trainer.fit(..., weights_only=False)``) for one that holds other objects (a
        custom object in ``hyper_parameters`` or in ``on_save_checkpoint``).

        ``path``: a local file, such as :meth:`resume_path` returns, or a path this plugin
        published in this process (``ModelCheckpoint.best_model_path``,
        ``ckpt_path="best"``), loaded from its published step after deep verification."""
        local = Path(path)
        if not local.exists() and str(path) in self._published:
            local = checkpoint_file(
                local_step(self.store, self._published[str(path)], download_dir=self.download_dir)
            )
        loaded = torch.load(
            local,
            map_location=map_location,
            weights_only=True if weights_only is None else weights_only,
        )
        if not isinstance(loaded, dict):
            raise TypeError(f"{local}: not a Lightning checkpoint (a {type(loaded).__name__})")
        return loaded


for _other in _BASES[1:]:  # the other package's Trainer accepts it too (isinstance)
    _other.register(PublishingCheckpointIO)


def checkpoint_file(step: LocalStep) -> Path:
    """The step's one ``.ckpt`` file."""
    names = [f.path for f in step.manifest.files if f.path.endswith(CKPT_SUFFIX)]
    if len(names) != 1:
        raise FileNotFoundError(
            f"step {step.step} at {step.uri} holds {len(names)} {CKPT_SUFFIX} files, expected 1"
        )
    return step.directory / names[0]


def metadata(checkpoint: dict[str, Any]) -> StepMetadata:
    version = str(checkpoint.get("pytorch-lightning_version") or "")
    dist = torch.distributed
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    return StepMetadata.from_env(
        world_size=world,
        framework=Framework(
            name="lightning", version=version, components={"torch": torch.__version__}
        ),
        extra={"epoch": checkpoint.get("epoch"), "format": "lightning-ckpt"},
    )
