"""The commit protocol: the order in which a step becomes durable and then visible.

1. claim run ownership (``run.json``): one run per root, and a stale attempt of the run
   (a zombie rank of a world the operator already replaced) may not publish;
2. write every shard into the in-progress area, hashing while writing;
3. write ``manifest.json``, then ``COMMITTED`` holding the manifest's sha256, and make the
   step visible atomically (rename on a filesystem; the COMMITTED object on S3);
4. advance ``latest.json`` with a conditional write; it never moves backwards;
5. apply the retention policy (from the operator's environment by default; none: keep
   everything), best effort: a step that cannot be deleted is logged, never a failed save.

A crash anywhere before 3 completes leaves nothing a resolver accepts.

Retention runs here, in ``publish``, because every publisher passes through it exactly once
per step (``rtj-shim commit`` through ``publish_directory``; the torch Checkpointer on the
rank that commits), right after the step and the hint are durable, so the newest step the
plan sees is the one just published. The stores only move bytes and the retention plan is
pure; the trainer-facing layers above would each need their own copy.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import secrets
import stat
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from rtj_shim.checkpoint.layout import (
    LATEST_FILE,
    RESERVED_FILES,
    RUN_FILE,
    step_key,
    validate_attempt,
)
from rtj_shim.checkpoint.manifest import (
    FileEntry,
    Framework,
    Manifest,
    committed_marker,
    confine_path,
    encode_manifest,
    utc_now,
    with_lineage,
)
from rtj_shim.checkpoint.pruning import PruneResult, prune
from rtj_shim.checkpoint.retention import RetentionPolicy, policy_from_env
from rtj_shim.checkpoint.run_config import with_run_config
from rtj_shim.checkpoint.selection import parse_latest_hint
from rtj_shim.checkpoint.storage.base import CheckpointStore, StepWriter
from rtj_shim.errors import Refused, RunOwnershipConflict, StoreError

log = logging.getLogger("rtj_shim")

_CAS_RETRIES = 8
# Files publish_directory copies at once: the hash of one overlaps the copy, the fsync and
# the hash of the other (every file is still durable before its entry exists).
PUBLISH_STREAMS = 2


class _FromEnv(enum.Enum):
    ENVIRONMENT = "RTJ_KEEP_LAST, RTJ_KEEP_EVERY, RTJ_PROTECT_STEP"


RETENTION_FROM_ENV: Final = _FromEnv.ENVIRONMENT


@dataclass(frozen=True)
class StepMetadata:
    """What a manifest records besides its files."""

    world_size: int = 1
    parallelism: dict[str, int] = field(default_factory=dict)
    framework: Framework = field(default_factory=Framework)
    code_commit: str | None = None
    image_digest: str | None = None
    dataset_snapshot: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_env(cls, world_size: int = 1, **overrides: Any) -> StepMetadata:
        """Provenance the operator injects into pods (RTJ_CODE_COMMIT, ...)."""
        env = os.environ
        values: dict[str, Any] = {
            "world_size": world_size,
            "code_commit": env.get("RTJ_CODE_COMMIT") or None,
            "image_digest": env.get("RTJ_IMAGE_DIGEST") or None,
            "dataset_snapshot": env.get("RTJ_DATASET_SNAPSHOT") or None,
        }
        values.update(overrides)
        return cls(**values)


@dataclass(frozen=True)
class PublishResult:
    step: int
    uri: str
    files: int
    bytes: int
    manifest: Manifest
    retention: PruneResult | None = None  # None: no policy, or the listing failed (logged)

    def to_json(self) -> dict[str, object]:
        body: dict[str, object] = {
            "step": self.step,
            "uri": self.uri,
            "files": self.files,
            "bytes": self.bytes,
        }
        if self.retention is not None:
            body["retention"] = self.retention.to_json()
        return body


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    writer_attempt: str

    def encode(self) -> bytes:
        now = utc_now().isoformat()
        body = {"run_id": self.run_id, "writer_attempt": self.writer_attempt, "updated_at": now}
        return (json.dumps(body, sort_keys=True) + "\n").encode()

    @classmethod
    def decode(cls, raw: bytes, source: str) -> RunRecord:
        try:
            data = json.loads(raw)
            run_id, attempt = data["run_id"], str(data["writer_attempt"])
        except (ValueError, TypeError, KeyError) as exc:
            raise Refused(
                f"{source}: expected JSON with 'run_id' and 'writer_attempt' ({exc})"
            ) from exc
        if not isinstance(run_id, str) or not run_id:
            raise Refused(f"{source}: field 'run_id' must be a non-empty string")
        return cls(run_id, attempt)


def check_ownership(record: RunRecord, run_id: str, attempt: str, source: str) -> bool:
    """Pure: may ``run_id``/``attempt`` write here? Returns True when run.json must move on."""
    if record.run_id != run_id:
        raise RunOwnershipConflict(
            f"{source} belongs to run {record.run_id!r}, not {run_id!r}: "
            "each run needs its own checkpoint root"
        )
    if record.writer_attempt == attempt:
        return False
    mine, owner = attempt_order(attempt), attempt_order(record.writer_attempt)
    if mine is not None and owner is not None and mine < owner:
        raise RunOwnershipConflict(
            f"{source}: attempt {attempt} is stale; attempt {record.writer_attempt} of run "
            f"{run_id!r} owns this root now (an old world must not keep writing)"
        )
    return True


def attempt_order(attempt: str) -> tuple[int, int] | None:
    """``"4"`` (attempt 4) or ``"4.2"`` (attempt 4, trainer generation 2 of an in-place
    restart) as a comparable pair; None for any other name (no order: never refused)."""
    head, dot, tail = attempt.partition(".")
    if not head.isdigit() or (dot and not tail.isdigit()):
        return None
    return int(head), int(tail) if dot else 0


def new_run_id() -> str:
    return f"run-{utc_now():%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


def retention_from_env() -> RetentionPolicy | None:
    """The operator's retention for this pod; a malformed value keeps everything (logged)."""
    try:
        return policy_from_env(os.environ)
    except ValueError as exc:
        log.warning("retention is off, every step is kept: %s", exc)
        return None


class CommitProtocol:
    """``retention``: applied after every publish; by default read from the environment
    (``RTJ_KEEP_LAST`` unset: keep everything); ``None`` keeps everything."""

    def __init__(
        self,
        store: CheckpointStore,
        run_id: str | None = None,
        attempt: str = "0",
        retention: RetentionPolicy | _FromEnv | None = RETENTION_FROM_ENV,
    ) -> None:
        self.store = store
        self._run_id = run_id or os.environ.get("RTJ_RUN_ID") or None
        self.attempt = validate_attempt(attempt)
        self.retention = retention_from_env() if retention is RETENTION_FROM_ENV else retention
        self.lineage: str | None = None  # recorded in every manifest published (.lineage)
        self.run_config: dict[str, Any] | None = None  # likewise (.run_config)

    @property
    def run_id(self) -> str:
        if self._run_id is None:
            self.claim_run()
        assert self._run_id is not None
        return self._run_id

    def claim_run(self) -> RunRecord:
        """Create run.json, or confirm this run owns it (advancing the writer attempt)."""
        source = self.store.key_uri(RUN_FILE)
        for _ in range(_CAS_RETRIES):
            raw, version = self.store.read_versioned(RUN_FILE)
            if raw is None:
                record = RunRecord(self._run_id or new_run_id(), self.attempt)
                if self.store.put_if(RUN_FILE, record.encode(), None):
                    self._run_id = record.run_id
                    return record
                continue
            current = RunRecord.decode(raw, source)
            run_id = self._run_id or current.run_id
            if not check_ownership(current, run_id, self.attempt, source):
                self._run_id = run_id
                return current
            record = RunRecord(run_id, self.attempt)
            if self.store.put_if(RUN_FILE, record.encode(), version):
                self._run_id = run_id
                return record
        raise StoreError(f"{source} kept changing during {_CAS_RETRIES} conditional writes")

    def check_still_owner(self) -> None:
        """Refuse (RunOwnershipConflict) when a newer attempt of the run has claimed the
        root since this one did: a rank of an old world (a partitioned node whose pods were
        force-deleted, a zombie woken from SIGSTOP) must not publish a step the new world
        could resume from. Checked right before COMMITTED is written."""
        raw, _ = self.store.read_versioned(RUN_FILE)
        if raw is not None:
            check_ownership(
                RunRecord.decode(raw, self.store.key_uri(RUN_FILE)),
                self.run_id,
                self.attempt,
                self.store.key_uri(RUN_FILE),
            )

    def begin(self, step: int) -> StepWriter:
        """Claim the run and open a fresh in-progress area for ``step`` (refused if published)."""
        self.claim_run()
        return self.store.begin_step(step, self.attempt, fresh=True)

    def join(self, step: int) -> StepWriter:
        """Another rank joins the in-progress area the coordinator opened with ``begin``."""
        return self.store.begin_step(step, self.attempt, fresh=False)

    def publish(
        self, writer: StepWriter, files: Sequence[FileEntry], metadata: StepMetadata
    ) -> PublishResult:
        """Write manifest and COMMITTED, make the step visible, then advance the hint."""
        manifest = Manifest(
            run_id=self.run_id,
            step=writer.step,
            world_size=metadata.world_size,
            parallelism=metadata.parallelism,
            framework=metadata.framework,
            code_commit=metadata.code_commit,
            image_digest=metadata.image_digest,
            dataset_snapshot=metadata.dataset_snapshot,
            created_at=utc_now(),
            files=tuple(sorted(files, key=lambda f: f.path)),
            extra=with_run_config(
                with_lineage(dict(metadata.extra), self.lineage), self.run_config
            ),
        )
        raw = encode_manifest(manifest)
        self.check_still_owner()  # a zombie of an old attempt never publishes
        writer.commit(raw, committed_marker(raw))
        self.advance_hint(writer.step)
        return PublishResult(
            writer.step,
            self.store.key_uri(step_key(writer.step)),
            len(manifest.files),
            manifest.total_bytes,
            manifest,
            self.apply_retention(writer.step),
        )

    def apply_retention(self, published: int) -> PruneResult | None:
        """Best effort after publishing ``published``: never raises, logs what failed."""
        if self.retention is None:
            return None
        try:
            result = prune(self.store, self.retention)
        except Exception as exc:
            log.warning("retention after step %d skipped: %s", published, exc)
            return None
        for name, why in result.failed:
            log.warning("retention: could not delete %s: %s", name, why)
        if result.deleted:
            steps = ", ".join(str(name.step) for name in result.deleted)
            log.info("retention after step %d deleted step(s) %s", published, steps)
        return result

    def advance_hint(self, step: int) -> bool:
        """Point latest.json at ``step`` unless it already names a newer one."""
        body = {"step": step, "path": step_key(step), "run_id": self.run_id}
        for _ in range(_CAS_RETRIES):
            raw, version = self.store.read_versioned(LATEST_FILE)
            current = parse_latest_hint(raw)
            if current.step is not None and current.step >= step:
                return False
            body["updated_at"] = utc_now().isoformat()
            data = (json.dumps(body, sort_keys=True) + "\n").encode()
            if self.store.put_if(LATEST_FILE, data, version):
                return True
        raise StoreError(f"{LATEST_FILE} kept changing during {_CAS_RETRIES} conditional writes")

    def publish_directory(
        self, step: int, source: Path, metadata: StepMetadata | None = None
    ) -> PublishResult:
        """Publish the files under ``source`` (left untouched) as ``step``."""
        files = collect_directory(source)
        writer = self.begin(step)
        try:
            with ThreadPoolExecutor(PUBLISH_STREAMS, thread_name_prefix="rtj-copy") as pool:
                entries = list(pool.map(lambda item: writer.copy_file(*item), files))
            return self.publish(writer, entries, metadata or StepMetadata.from_env())
        except BaseException:
            writer.abort()
            raise


def collect_directory(source: Path) -> list[tuple[str, Path]]:
    """Every regular file under ``source``; symlinks, special files and reserved names refused."""
    try:
        mode = source.lstat().st_mode
    except OSError as exc:
        raise Refused(f"--from {source}: {exc.strerror}") from exc
    if not stat.S_ISDIR(mode):
        raise Refused(f"--from {source}: expected a directory")
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(source):
        for entry in sorted(dirnames + filenames):
            path = Path(dirpath) / entry
            rel = path.relative_to(source).as_posix()
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                raise Refused(f"{path}: symlinks are refused (a step must be self-contained)")
            if stat.S_ISDIR(mode):
                continue
            if not stat.S_ISREG(mode):
                raise Refused(f"{path}: not a regular file (special files are refused)")
            if rel in RESERVED_FILES:
                raise Refused(f"{path}: the name {rel!r} is reserved by the checkpoint protocol")
            found.append((confine_path(rel), path))
    if not found:
        raise Refused(f"--from {source}: the directory has no files to publish")
    return found
