"""What every framework integration shares, torch-free (a framework without torch can use
it): publish a directory as a step (tolerating a re-save of a step that is already
published and verifies), and find the step to resume from as a local directory.

The resume decision is the Checkpointer's: the init container's ``resume.json`` in the
pod's first incarnation (``RTJ_RESUME_FILE``, default ``/var/run/rtj/resume.json``),
otherwise the newest step that passes deep verification. A filesystem root is read in
place; any other store (S3) is copied into a local directory, every file checked against
the manifest's size and sha256 while it is written.
"""

from __future__ import annotations

import enum
import logging
import os
import shutil
import sys
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from rtj_shim.checkpoint.layout import (
    COMMITTED_FILE,
    MANIFEST_FILE,
    StepDirName,
    step_dir_name,
    step_key,
)
from rtj_shim.checkpoint.manifest import Manifest, sha256_hex
from rtj_shim.checkpoint.protocol import (
    RETENTION_FROM_ENV,
    CommitProtocol,
    PublishResult,
    StepMetadata,
    _FromEnv,
    retention_from_env,
)
from rtj_shim.checkpoint.resolver import resolve
from rtj_shim.checkpoint.retention import RetentionPolicy, merged_retention
from rtj_shim.checkpoint.storage import CheckpointStore, open_store
from rtj_shim.checkpoint.storage.filesystem import FilesystemStore
from rtj_shim.checkpoint.verification import Depth, check_commit
from rtj_shim.checkpoint.verifier import verify_step
from rtj_shim.errors import CheckpointError, StepAlreadyPublished
from rtj_shim.wire import pod_env
from rtj_shim.wire.resume_file import DEFAULT_PATH as DEFAULT_RESUME_FILE
from rtj_shim.wire.resume_pin import pinned_step

log = logging.getLogger("rtj_shim.integrations")

Retention = RetentionPolicy | _FromEnv | None


class _Unset(enum.Enum):
    UNSET = "unset"


UNSET: Final = _Unset.UNSET
"""The default of the deprecated ``retention=`` argument: not given."""


def open_root(root: str | CheckpointStore | None) -> CheckpointStore:
    """``root`` as a store; None: the operator's ``RTJ_CHECKPOINT_URI``, as for a
    ``Checkpointer()`` given no root (ValueError naming both when it is not set)."""
    if root is None:
        root = pod_env.checkpoint_uri()
    return open_store(root) if isinstance(root, str) else root


def make_protocol(
    store: CheckpointStore, attempt: str | None, retention: Retention
) -> CommitProtocol:
    return CommitProtocol(
        store, attempt=attempt or os.environ.get("RTJ_ATTEMPT") or "0", retention=retention
    )


def retention_policy(
    owner: str, keep_last: int | None, retention: Retention | _Unset = UNSET
) -> Retention:
    """The policy applied after each publish, as the Checkpointer decides it: the job's
    (``RTJ_KEEP_LAST``/``RTJ_KEEP_EVERY``) first, ``keep_last`` when the environment sets
    none, else every step kept. ``retention`` (a ``RetentionPolicy``, None to keep every
    step) is the deprecated spelling, still honoured as before for one release, with a
    DeprecationWarning naming ``keep_last``."""
    if retention is UNSET:
        if keep_last is not None and (isinstance(keep_last, bool) or keep_last < 1):
            raise ValueError(f"{owner}: keep_last={keep_last!r}, expected an int >= 1 or None")
        return merged_retention(retention_from_env(), keep_last, 0, None)
    if keep_last is not None:
        raise TypeError(f"{owner}: pass keep_last= only (retention= is its deprecated name)")
    if retention is not RETENTION_FROM_ENV and not isinstance(retention, RetentionPolicy | None):
        raise TypeError(
            f"{owner}: retention={retention!r}, expected a RetentionPolicy or None "
            "(better: keep_last=N)"
        )
    warnings.warn(
        f"{owner}(retention=...) is deprecated and will be removed in the next release: "
        "use keep_last=N (the steps kept after each publish, as Checkpointer(keep_last=N)); "
        "the job's RTJ_KEEP_LAST still comes first",
        DeprecationWarning,
        stacklevel=3,
    )
    return retention


def publish_step(
    protocol: CommitProtocol, step: int, source: Path, metadata: StepMetadata | None = None
) -> PublishResult | None:
    """Publish the files under ``source`` as ``step``. A step already published that
    verifies (deep) is left as it is and None returned: a framework saving the same global
    step twice (Lightning's ``last.ckpt`` beside a top-k file, a final save right after a
    periodic one, a resumed run saving its resume step again). One that does not verify is
    replaced, as the Checkpointer does."""
    try:
        return protocol.publish_directory(step, source, metadata)
    except StepAlreadyPublished:
        verdict = verify_step(protocol.store, step, Depth.DEEP)
        if verdict.valid:
            log.info("step %d is already published and verifies; not published again", step)
            return None
        log.warning("step %d exists but does not verify (%s); replacing it", step, verdict.reason)
        protocol.store.delete_step_dir(StepDirName(step))
        return protocol.publish_directory(step, source, metadata)


@dataclass(frozen=True)
class LocalStep:
    """A verified step, readable as a local directory."""

    step: int
    directory: Path  # the step's files (plus manifest.json and COMMITTED on a filesystem)
    uri: str  # where it is published
    source: str  # "resume-file" (the operator pinned it), "resolved" or "named"
    skipped: tuple[tuple[int, str], ...]  # newer steps passed over, with the reason
    manifest: Manifest


def resolve_local(
    root: str | CheckpointStore | None,
    *,
    download_dir: str | os.PathLike[str] | None = None,
    resume_file: str | os.PathLike[str] | None = None,
    restored_once: bool = False,
) -> LocalStep | None:
    """The step to resume (None: start fresh) as a local directory.

    ``resume_file``: the operator's pin, honoured unless ``restored_once`` or after an
    in-pod restart (then resolve again: newer steps may exist). ``download_dir``: where a
    non-filesystem root's step is copied, into ``download_dir/step-<12 digits>`` (default:
    a new temporary directory, the caller's to delete)."""
    store = open_root(root)
    pin_file = Path(resume_file or os.environ.get("RTJ_RESUME_FILE") or DEFAULT_RESUME_FILE)
    pinned = pinned_step(store, pin_file, restored_once)
    if pinned is not None:
        step, skipped = pinned[0], tuple(pinned[1])
        source = "resume-file"
        if step is None:
            return None
        # shallow when the resume init container hashed it already (see pinned_step)
        resolution = resolve(store, pinned[2], step=step)
        if resolution.step is None:
            why = "; ".join(s.reason for s in resolution.skipped) or "does not verify"
            raise CheckpointError(f"{pin_file} pins step {step}, which does not verify: {why}")
    else:
        source = "resolved"
        resolution = resolve(store, Depth.DEEP)
        skipped = tuple((s.step, s.reason) for s in resolution.skipped)
        if resolution.hint_problem:
            log.warning("resume: %s", resolution.hint_problem)
        if resolution.step is None:
            return None
        step = resolution.step
    for old, reason in skipped:
        log.warning("resume: skipped step %d: %s", old, reason)
    local = local_step(store, step, download_dir=download_dir, verified=True)
    announce_resume(step, source, local.uri, len(skipped))
    return LocalStep(step, local.directory, local.uri, source, skipped, local.manifest)


def announce_resume(step: int, source: str, uri: str, skipped: int) -> None:
    """One line on stderr (rank 0), whatever the framework's log level, as the Checkpointer
    prints its restore: a resume that says nothing looks like a fresh start. Also logged."""
    why = {"resume-file": "pinned by the operator", "resolved": "newest verified"}.get(
        source, source
    )
    line = f"rtj_shim: resuming step {step} from {uri} ({why}"
    line += f"; {skipped} newer step(s) skipped)" if skipped else ")"
    if os.environ.get("RANK", "0") == "0":
        sys.stderr.write(line + "\n")
    log.info("%s", line)


def local_step(
    root: str | CheckpointStore,
    step: int,
    *,
    download_dir: str | os.PathLike[str] | None = None,
    verified: bool = False,
) -> LocalStep:
    """One published step as a local directory; deep-verified first unless ``verified``."""
    store = open_root(root)
    if not verified:
        verdict = verify_step(store, step, Depth.DEEP)
        if not verdict.valid:
            raise CheckpointError(
                f"step {step} under {store.uri} does not verify: {verdict.reason}"
            )
    manifest = check_commit(
        step,
        store.read(step_key(step, MANIFEST_FILE)),
        store.read(step_key(step, COMMITTED_FILE)),
    )
    if isinstance(store, FilesystemStore):
        directory = store.root / step_key(step)
    else:
        directory = download(store, step, manifest, download_dir)
    return LocalStep(step, directory, store.key_uri(step_key(step)), "named", (), manifest)


def download(
    store: CheckpointStore,
    step: int,
    manifest: Manifest,
    download_dir: str | os.PathLike[str] | None,
) -> Path:
    """Copy a step's files into a new local directory (``download_dir/step-<12 digits>``,
    or a temporary directory), each checked against the manifest's size and sha256."""
    if download_dir is None:
        target = Path(tempfile.mkdtemp(prefix=f"rtj-step-{step}-"))
    else:  # a directory of this step's files only: an earlier copy there is replaced
        target = Path(download_dir) / step_dir_name(step)
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
    for entry in manifest.files:
        data = store.read(step_key(step, entry.path))
        if data is None:
            raise CheckpointError(f"{entry.path} of step {step} is missing")
        if len(data) != entry.bytes or sha256_hex(data) != entry.sha256:
            raise CheckpointError(f"{entry.path} of step {step} does not match its manifest")
        path = target / entry.path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return target


def resolve_everywhere(
    store: CheckpointStore,
    *,
    rank: int,
    world: int,
    broadcast: Callable[[object], object],
    download_dir: Path | None = None,
    restored_once: bool = False,
    check: Callable[[Manifest], None] | None = None,
) -> LocalStep | None:
    """The resume decision taken once, by the first rank, and handed to every rank: each
    gets the step as a local directory (None: start fresh). ``broadcast(value)`` returns
    the first rank's value on every rank (the framework's collective); ``check`` refuses a
    step this world cannot load, before anything is loaded. A decision that fails on the
    first rank raises on every rank (none waits for the others forever)."""
    decided: object = None
    found: LocalStep | None = None
    if rank == 0:
        try:
            found = resolve_local(store, download_dir=download_dir, restored_once=restored_once)
            if found is not None and check is not None:
                check(found.manifest)
            decided = None if found is None else (found.step, found.source, found.skipped)
        except Exception as exc:
            if world == 1:
                raise
            decided = f"{type(exc).__name__}: {exc}"
    decided = broadcast(decided)
    if isinstance(decided, str):
        raise CheckpointError(f"resume failed on the first rank: {decided}")
    if decided is None:
        return None
    if found is None:  # verified by the first rank; a copy is checked file by file
        if not isinstance(decided, tuple) or len(decided) != 3:
            raise CheckpointError(f"resume: the first rank's decision is unreadable: {decided!r}")
        step, source, skipped = int(decided[0]), str(decided[1]), tuple(decided[2])
        local = local_step(store, step, download_dir=download_dir, verified=True)
        found = LocalStep(step, local.directory, local.uri, source, skipped, local.manifest)
    return found


class StepPublisher:
    """What every integration's publisher holds: the store, the commit protocol with the
    retention applied after each publish, where it stages and copies steps, the newest
    publish and the step it resumed. ``retention`` is the deprecated spelling of
    ``keep_last`` (see `retention_policy`)."""

    def __init__(
        self,
        root: str | CheckpointStore | None,
        *,
        attempt: str | None,
        keep_last: int | None,
        staging_dir: str | os.PathLike[str] | None,
        download_dir: str | os.PathLike[str] | None,
        retention: Retention | _Unset = UNSET,
    ) -> None:
        self.store = open_root(root)
        policy = retention_policy(type(self).__name__, keep_last, retention)
        self.protocol = make_protocol(self.store, attempt, policy)
        self.staging_dir = staging_dir
        self.download_dir = download_dir
        self.last_publish: PublishResult | None = None
        self.resumed: LocalStep | None = None

    def published(self, step: int, result: PublishResult | None) -> PublishResult | None:
        """Record a publish (None: not this rank's, or the step was already there)."""
        if result is not None:
            self.last_publish = result
            log.info("published step %d: %s", step, result.uri)
        return result

    def copy_dir(self, rank: int) -> Path | None:
        """This rank's own directory for a copy of a step: ranks on one node never share a
        copy (None: a temporary one, made by the copy)."""
        if self.download_dir is None:
            return None
        return Path(self.download_dir) / f"rank-{rank}"

    def new_staging(self, prefix: str) -> str:
        """A new staging directory (made by the first rank), under ``staging_dir``."""
        if self.staging_dir is not None:
            Path(self.staging_dir).mkdir(parents=True, exist_ok=True)
        return tempfile.mkdtemp(prefix=prefix, dir=self.staging_dir)

    def drop_copy(self, directory: Path) -> None:
        """Delete a temporary copy of a step once loaded (a filesystem root is read in
        place; a ``download_dir`` copy is the caller's)."""
        if not isinstance(self.store, FilesystemStore) and self.download_dir is None:
            shutil.rmtree(directory, ignore_errors=True)
