"""The environment contract between the operator and the trainer's container: every variable
the operator renders into it, who in the pod reads it, and what it means. Pure data.

One table, tested from both sides: the operator's rendered trainer container holds exactly
these names (`tests/unit/operator/test_env_contract.py`), the library reads the ones it
names as their reader (`tests/unit/shim/test_pod_env.py`), and docs/shim.md's table lists
them (`Environment the operator injects`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

CHECKPOINT_URI = "RTJ_CHECKPOINT_URI"
EMERGENCY_SAVE_SECONDS = "RTJ_EMERGENCY_SAVE_SECONDS"
MAX_WRITE_BYTES_PER_SECOND = "RTJ_MAX_WRITE_BYTES_PER_SECOND"
DEFAULT_EMERGENCY_SAVE_SECONDS = 30.0
"""The trainer's SIGTERM deadline outside the operator (the operator's default is the same)."""


class Reader(Enum):
    """Who in the trainer's container reads a variable."""

    CHECKPOINTER = "the Checkpointer (rtj_shim.torch)"
    PROGRESS = "the progress record (rtj_shim.progress)"
    SUPERVISOR = "rtj-shim supervise"
    FAST_TIER = "the fast tier (rtj_shim.fast.fast_tier)"
    SCRIPT = "the training script, if it wants it"
    TORCHRUN = "torchrun (and torch.distributed)"


@dataclass(frozen=True)
class EnvVar:
    name: str
    reader: Reader
    meaning: str
    when: str = ""  # the spec field that turns it on; empty: always


TRAINER_ENV: tuple[EnvVar, ...] = (
    EnvVar(CHECKPOINT_URI, Reader.CHECKPOINTER,
           "the durable checkpoint root (`spec.checkpoint.uri`); `Checkpointer()` with no "
           "root uses it"),
    EnvVar("RTJ_RUN_ID", Reader.CHECKPOINTER, "run id recorded in `run.json` and manifests"),
    EnvVar("RTJ_ATTEMPT", Reader.CHECKPOINTER,
           "writer attempt; an older attempt than the one in `run.json` is refused"),
    EnvVar("RTJ_RESUME_FILE", Reader.CHECKPOINTER,
           "the init container's resume decision (`/var/run/rtj/resume.json`)"),
    EnvVar("RTJ_RESUME_STEP", Reader.SCRIPT,
           "the step the operator pinned for this attempt (empty: the newest that verifies)"),
    EnvVar("RTJ_PROTECT_STEP", Reader.CHECKPOINTER,
           "the step this attempt resumed from; retention never deletes it"),
    EnvVar(EMERGENCY_SAVE_SECONDS, Reader.CHECKPOINTER,
           "the SIGTERM deadline of the emergency save (`spec.checkpoint."
           "emergencySaveSeconds`); the pod's grace period covers it plus 15 s"),
    EnvVar(MAX_WRITE_BYTES_PER_SECOND, Reader.CHECKPOINTER,
           "the most bytes a second a durable save writes (emergency saves are not paced)",
           "spec.checkpoint.maxWriteBytesPerSecond"),
    EnvVar("RTJ_KEEP_LAST", Reader.CHECKPOINTER,
           "retention after each publish; unset: keep every step",
           "spec.checkpoint.retention.keepLast"),
    EnvVar("RTJ_KEEP_EVERY", Reader.CHECKPOINTER, "also keep every step that is a multiple",
           "spec.checkpoint.retention.keepEvery"),
    EnvVar("RTJ_CODE_COMMIT", Reader.CHECKPOINTER, "provenance in the manifest",
           "spec.provenance.codeCommit"),
    EnvVar("RTJ_IMAGE_DIGEST", Reader.CHECKPOINTER, "provenance in the manifest",
           "spec.provenance.imageDigest"),
    EnvVar("RTJ_DATASET_SNAPSHOT", Reader.CHECKPOINTER, "provenance in the manifest",
           "spec.provenance.datasetSnapshot"),
    EnvVar("RTJ_PROGRESS_DIR", Reader.PROGRESS,
           "where each rank writes its progress record (the progress sidecar serves it)",
           "progress monitoring (on by default)"),
    EnvVar("RTJ_INDEX_FAILURES", Reader.SUPERVISOR,
           "the Job controller's count of this index's earlier failures: > 0 marks a "
           "replacement pod, held until ordered", "spec.recovery.inPlace"),
    EnvVar("RTJ_CONTROL_DIR", Reader.SUPERVISOR,
           "where the supervisor reads restart orders and writes its reports",
           "spec.recovery.inPlace"),
    EnvVar("RTJ_SPARE", Reader.SUPERVISOR, "`1` in a warm spare: its trainer is held",
           "spec.spares (the spares' pods only)"),
    EnvVar("RTJ_FAST_TIER_DIR", Reader.FAST_TIER, "the pod-local fast checkpoint tier",
           "spec.checkpoint.fastTier"),
    EnvVar("RTJ_FAST_EVERY_STEPS", Reader.FAST_TIER, "steps between fast saves",
           "spec.checkpoint.fastTier"),
    EnvVar("RTJ_FAST_KEEP", Reader.FAST_TIER, "fast steps kept per rank",
           "spec.checkpoint.fastTier"),
    EnvVar("MASTER_ADDR", Reader.TORCHRUN, "rank 0's pod address (headless Service)"),
    EnvVar("MASTER_PORT", Reader.TORCHRUN, "the rendezvous port"),
    EnvVar("WORLD_SIZE", Reader.TORCHRUN, "the number of pods (nodes)"),
    EnvVar("NNODES", Reader.TORCHRUN, "the number of pods (nodes)"),
    EnvVar("NODE_RANK", Reader.TORCHRUN, "this pod's index (the Job's completion index)"),
    EnvVar("RANK", Reader.TORCHRUN, "this pod's index (the Job's completion index)"),
    EnvVar("PET_MASTER_ADDR", Reader.TORCHRUN, "torchrun's `--master-addr`"),
    EnvVar("PET_MASTER_PORT", Reader.TORCHRUN, "torchrun's `--master-port`"),
    EnvVar("PET_NNODES", Reader.TORCHRUN, "torchrun's `--nnodes`"),
    EnvVar("PET_NODE_RANK", Reader.TORCHRUN, "torchrun's `--node-rank`"),
    EnvVar("PET_NPROC_PER_NODE", Reader.TORCHRUN,
           "torchrun's `--nproc-per-node` (the GPUs the container requests)",
           "a GPU request"),
)  # fmt: skip


def names() -> frozenset[str]:
    return frozenset(v.name for v in TRAINER_ENV)


def checkpoint_uri(environ: Mapping[str, str] | None = None) -> str:
    """The operator's ``RTJ_CHECKPOINT_URI``, for a ``Checkpointer()`` given no root;
    ValueError naming both when it is not set (never a silent default root)."""
    uri = (os.environ if environ is None else environ).get(CHECKPOINT_URI, "")
    if not uri:
        raise ValueError(
            f"root: none given and {CHECKPOINT_URI} is not set (the operator sets it from "
            "spec.checkpoint.uri); pass the checkpoint root, e.g. Checkpointer('s3://bucket/run')"
        )
    return uri


def emergency_save_seconds(environ: Mapping[str, str] | None = None) -> float:
    """The SIGTERM deadline the operator gave this pod (0: exit at once, no emergency save, as
    `spec.checkpoint.emergencySaveSeconds: 0` asks); ValueError naming the variable when it is
    not a number of seconds >= 0."""
    raw = (os.environ if environ is None else environ).get(EMERGENCY_SAVE_SECONDS, "")
    if not raw:
        return DEFAULT_EMERGENCY_SAVE_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"{EMERGENCY_SAVE_SECONDS}={raw!r}: expected a number of seconds >= 0")
    return value


def max_write_bytes_per_second(environ: Mapping[str, str] | None = None) -> int | None:
    """The operator's write limit for durable saves (None: unset, no limit); ValueError
    naming the variable when it is not a whole number of bytes > 0."""
    raw = (os.environ if environ is None else environ).get(MAX_WRITE_BYTES_PER_SECOND, "")
    if not raw:
        return None
    if not raw.isdigit() or int(raw) <= 0:
        raise ValueError(
            f"{MAX_WRITE_BYTES_PER_SECOND}={raw!r}: expected a whole number of bytes > 0"
        )
    return int(raw)
