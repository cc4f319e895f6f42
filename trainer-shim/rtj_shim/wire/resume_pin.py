"""The resume init container's decision, as a trainer takes it at its first restore: the
durable step the operator pinned, and how deeply it must still be verified. Torch-free:
`rtj_shim.torch` and every framework integration read it alike."""

from __future__ import annotations

import os
from pathlib import Path

from rtj_shim.checkpoint.storage import CheckpointStore
from rtj_shim.checkpoint.verification import Depth
from rtj_shim.errors import CheckpointError
from rtj_shim.wire.resume_file import ResumeFile, ResumeFileError


def pinned_step(
    store: CheckpointStore, resume_file: Path, restored_once: bool
) -> tuple[int | None, list[tuple[int, str]], Depth] | None:
    """The init container's decision, valid for the pod's first incarnation only: after
    an in-pod restart (torchrun), newer steps may exist, so resolve again.

    With it, how deeply the step must still be verified here. A step the init container
    verified deeply (`"verification": "deep"`) is checked shallowly (manifest, COMMITTED,
    sizes), not hashed a second time: that init container ran in this pod, for this
    attempt, moments before. With `--deep-share` it hashed only its share, and the pods of
    the attempt hashed the rest; a pod whose share does not verify fails its init
    container, and the restore is collective, so no rank gets past it then. Any other
    resume file (an older resolver, a shallow resolution) is verified deeply here."""
    if restored_once or int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0) > 0:
        return None
    try:
        raw = resume_file.read_bytes()
    except FileNotFoundError:
        return None
    try:
        pin = ResumeFile.parse(raw)
    except ResumeFileError as exc:
        raise CheckpointError(f"{resume_file}: {exc}") from exc
    if pin.error is not None:
        raise CheckpointError(f"{resume_file}: the resume decision failed: {pin.error}")
    if not pin.pins_step:  # an in-place restart that pinned only a fast-tier step
        return None
    if pin.uri is not None and not pin.uri.startswith(store.uri):
        raise CheckpointError(
            f"{resume_file} names {pin.uri}, which is not under this job's root {store.uri}"
        )
    return pin.step, list(pin.skipped), (Depth.SHALLOW if pin.verified_deeply else Depth.DEEP)
