"""JAX with Orbax: a pytree saved by Orbax published as a verified step, and restored from
the step to resume. Needs no torch.

    ckpt = PublishingCheckpointer()        # RTJ_CHECKPOINT_URI; or a path, file:// or s3://
    step, state = ckpt.restore(abstract)   # 0, None on a fresh start; else the restored tree
    ...
    ckpt.save(step, state)                 # every process calls it, as Orbax's save

:meth:`PublishingCheckpointer.save` has every JAX process take part in Orbax's save
(``StandardCheckpointer``: each process writes its own shards, ``ocdbt.process_<i>``, and
the primary finalizes with ``commit_success.txt`` once all have) into a staging directory
named after the attempt and the step, waits for all of them, and process 0 publishes it
through the commit protocol (Orbax's own atomic rename is local to the staging
directory; the published step is the commit). The staging directory must be one every
process sees: one host, or ``staging_dir=`` on a shared filesystem (a save missing a
process's shards is refused, naming the fix).

:meth:`PublishingCheckpointer.restore` takes the Checkpointer's decision on process 0 (the
operator's pin in the pod's first incarnation, else the newest step that passes deep
verification, newer ones skipped with the reason), hands the step to every process and
restores the tree into ``abstract`` (its shapes, dtypes and shardings: Orbax places every
array where the abstract tree says).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from rtj_shim.checkpoint.manifest import Framework
from rtj_shim.checkpoint.protocol import PublishResult, StepMetadata
from rtj_shim.checkpoint.storage import CheckpointStore
from rtj_shim.checkpoint.storage.filesystem import FilesystemStore
from rtj_shim.errors import CheckpointError
from rtj_shim.integrations._common import (
    LocalStep,
    local_step,
    make_protocol,
    open_root,
    publish_step,
    resolve_local,
    retention_policy,
)

__all__ = ["PublishingCheckpointer", "check_every_process_wrote"]

log = logging.getLogger("rtj_shim.integrations")

ITEM = "state"
"""The directory, inside a published step, that holds Orbax's checkpoint of the tree."""
NONE, FAILED = -1, -2
"""What process 0 broadcasts instead of a step: nothing to resume; its decision failed."""


class PublishingCheckpointer:
    """``root``: the checkpoint root (default: the operator's ``RTJ_CHECKPOINT_URI``);
    ``attempt``: the writer attempt (default ``RTJ_ATTEMPT`` or 0); ``keep_last``: the steps
    kept after every publish when the job's environment sets no retention (``RTJ_KEEP_LAST``
    first); ``staging_dir``: where Orbax writes before the publish, a directory every process
    sees (default: the system's temporary directory, enough on one host); ``download_dir``:
    where a step of a non-filesystem root (S3) is copied to be restored, one subdirectory per
    process (default: a temporary directory, deleted once restored)."""

    def __init__(
        self,
        root: str | CheckpointStore | None = None,
        *,
        attempt: str | None = None,
        keep_last: int | None = None,
        staging_dir: str | os.PathLike[str] | None = None,
        download_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.store = open_root(root)
        self.protocol = make_protocol(
            self.store, attempt, retention_policy(type(self).__name__, keep_last)
        )
        self.attempt = attempt or os.environ.get("RTJ_ATTEMPT") or "0"
        self.staging_dir = Path(staging_dir or Path(tempfile.gettempdir()) / "rtj-orbax")
        self.download_dir = download_dir
        self.checkpointer = ocp.StandardCheckpointer()
        self.last_publish: PublishResult | None = None
        self.resumed: LocalStep | None = None

    # ------------------------------------------------------------------ saving

    def save(self, step: int, state: Any) -> PublishResult | None:
        """Every process: Orbax saves `state` into the step's staging directory; process 0
        publishes it as ``step``. The publish on process 0 (None on the others)."""
        staging = self.staging_dir / f"attempt-{self.attempt}-step-{step}"
        if jax.process_index() == 0:
            shutil.rmtree(staging, ignore_errors=True)  # a save cut short before
        multihost_utils.sync_global_devices(f"rtj-orbax-stage-{step}")
        result: PublishResult | None = None
        try:
            self.checkpointer.save(staging / ITEM, state)
            self.checkpointer.wait_until_finished()
            multihost_utils.sync_global_devices(f"rtj-orbax-saved-{step}")
            failed = 0
            if jax.process_index() == 0:
                try:
                    check_every_process_wrote(staging / ITEM, jax.process_count())
                    result = publish_step(self.protocol, step, staging, self._metadata())
                except Exception:
                    if jax.process_count() == 1:
                        raise
                    log.exception("step %d was not published", step)
                    failed = 1
            if int(multihost_utils.broadcast_one_to_all(np.int32(failed))):
                raise CheckpointError(f"step {step} was not published (process 0 logged why)")
        finally:
            if jax.process_index() == 0:
                shutil.rmtree(staging, ignore_errors=True)
        if result is not None:
            self.last_publish = result
            log.info("published step %d: %s", step, result.uri)
        return result

    # ------------------------------------------------------------------ resuming

    def restore(self, abstract: Any, *, restored_once: bool = False) -> tuple[int, Any]:
        """Every process: the step to resume and the tree restored into `abstract` (shapes,
        dtypes, shardings: ``jax.ShapeDtypeStruct`` leaves); ``(0, None)`` on a fresh start.
        Process 0 decides (the operator's pin in the first incarnation unless
        ``restored_once``, else the newest step that passes deep verification; newer ones
        skipped with the reason, in ``self.resumed.skipped`` and a warning)."""
        found: LocalStep | None = None
        decided = NONE
        if jax.process_index() == 0:
            try:
                found = resolve_local(
                    self.store, download_dir=self._downloads(), restored_once=restored_once
                )
                decided = NONE if found is None else found.step
            except Exception:
                if jax.process_count() == 1:
                    raise
                log.exception("the resume decision failed")
                decided = FAILED
        step = int(multihost_utils.broadcast_one_to_all(np.int64(decided)))
        if step == FAILED:
            raise CheckpointError("resume failed on process 0 (it logged why)")
        if step == NONE:
            self.resumed = None
            return 0, None
        if found is None:  # verified by process 0; a copy is checked file by file
            found = local_step(self.store, step, download_dir=self._downloads(), verified=True)
        try:
            state = self.checkpointer.restore(found.directory / ITEM, abstract)
        finally:
            if not isinstance(self.store, FilesystemStore) and self.download_dir is None:
                shutil.rmtree(found.directory, ignore_errors=True)  # a temporary copy
        self.resumed = found
        return step, state

    # ------------------------------------------------------------------ helpers

    def _downloads(self) -> Path | None:
        if self.download_dir is None:
            return None
        return Path(self.download_dir) / f"process-{jax.process_index()}"

    def _metadata(self) -> StepMetadata:
        return StepMetadata.from_env(
            world_size=jax.process_count(),
            parallelism={"devices": jax.device_count()},
            framework=Framework(
                name="orbax",
                version=str(getattr(ocp, "__version__", "?")),
                components={"jax": jax.__version__},
            ),
            extra={"format": "orbax-standard-checkpointer"},
        )


def check_every_process_wrote(directory: Path, processes: int) -> None:
    """Orbax's finalized checkpoint (``commit_success.txt``) with every process's shards
    (``ocdbt.process_<i>``, the default OCDBT layout) in the directory process 0 publishes."""
    if not (directory / "commit_success.txt").exists():
        raise CheckpointError(
            f"{directory}: Orbax did not finalize the save (no commit_success.txt)"
        )
    missing = [i for i in range(processes) if not (directory / f"ocdbt.process_{i}").is_dir()]
    if missing:
        raise CheckpointError(
            f"{directory} lacks the shards of process(es) {missing}: the processes wrote to "
            "different filesystems; pass PublishingCheckpointer(staging_dir=...) on a "
            "filesystem every process shares"
        )
