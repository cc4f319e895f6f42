"""Gather what a step's verification needs from a store and apply the pure rules.

Deep verification hashes files in parallel: hashlib releases the GIL on large buffers,
so threads give real parallelism without extra processes.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from rtj_shim.checkpoint.layout import COMMITTED_FILE, MANIFEST_FILE, StepDirName, step_key
from rtj_shim.checkpoint.storage.base import CheckpointStore
from rtj_shim.checkpoint.verification import (
    Depth,
    Share,
    Verdict,
    check_commit,
    check_digests,
    check_sizes,
)
from rtj_shim.errors import ManifestError


def default_workers() -> int:
    return max(2, min(8, os.cpu_count() or 2))


def verify_step(
    store: CheckpointStore,
    step: int,
    depth: Depth,
    workers: int | None = None,
    share: Share | None = None,
) -> Verdict:
    """Verify one published step (deep: with `share`, only that share's files are hashed;
    every file's size is always checked). StoreError propagates: unreadable is not invalid."""
    name = StepDirName(step)
    try:
        manifest = check_commit(
            step,
            store.read(step_key(step, MANIFEST_FILE)),
            store.read(step_key(step, COMMITTED_FILE)),
        )
    except ManifestError as exc:
        return Verdict(step, False, str(exc), depth)
    problem = check_sizes(manifest, store.list_files(name))
    if problem is None and depth is Depth.DEEP:
        paths = [e.path for e in manifest.files if share is None or share.owns(e.path)]
        threads = workers or default_workers()
        with ThreadPoolExecutor(threads, thread_name_prefix="rtj-verify") as pool:
            digests = dict(
                zip(paths, pool.map(lambda p: store.sha256(name, p), paths), strict=True)
            )
        problem = check_digests(manifest, digests, share)
    if problem is not None:
        return Verdict(step, False, problem, depth, manifest)
    part = ""
    if share is not None and depth is Depth.DEEP:
        hashed = f"{len(paths)} of {len(manifest.files)} files hashed"
        part = f" (share {share.index}/{share.count}: {hashed})"
    return Verdict(step, True, f"{depth.value} verification passed{part}", depth, manifest)
