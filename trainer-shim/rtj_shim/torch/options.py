"""The Checkpointer's options beyond its schedule and retention, in groups. Pure.

``Checkpointer(root, every_steps=..., keep_last=..., ...)`` takes what most jobs set as
keywords; the rest comes in one object per concern::

    Checkpointer(
        every_steps=100,
        io=IoOptions(io_workers=8, staging_dir="/local/nvme/rtj"),
        resume=ResumeOptions(probe=probe),
        emergency=EmergencyOptions(deadline_s=20),
        fast_tier=FastTierConfig(directory="/dev/shm/rtj", every_steps=10, keep=2),
        integrity=IntegrityOptions(anomaly_guard=AnomalyGuard(), every_steps=50),
    )

The flat keywords these replaced (``io_workers=``, ``probe=``, ``fast_tier_dir=``, ...) are
accepted for one release with a DeprecationWarning naming the new spelling
(`group_legacy_options`); an unknown keyword is a TypeError naming it.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from rtj_shim.alignment import AlignmentCheck
from rtj_shim.integrity import AnomalyGuard
from rtj_shim.torch.validation import Probe
from rtj_shim.wire import pod_env
from rtj_shim.wire.resume_file import DEFAULT_PATH

MiB = 1 << 20
DEFAULT_RESUME_FILE = DEFAULT_PATH


@dataclass(frozen=True)
class IoOptions:
    """How a save is written: ``io_workers`` threads per rank, files cut into shards of
    ``shard_bytes`` (at most ``max_shards`` a file), tensors staged for a background save in
    ``staging_dir`` (None: ``RTJ_STAGING_DIR``, else memory), every collective of the
    Checkpointer's own groups bounded by ``collective_timeout_s``."""

    io_workers: int = 4
    shard_bytes: int = 32 * MiB
    max_shards: int = 64
    staging_dir: str | os.PathLike[str] | None = None
    collective_timeout_s: float = 600.0
    max_write_bytes_per_second: int | None = None
    """Pace durable saves' writes to this many bytes a second (None:
    ``RTJ_MAX_WRITE_BYTES_PER_SECOND``, else no limit); an emergency save is never paced."""


@dataclass(frozen=True)
class ResumeOptions:
    """How a restore resumes: ``allow_unsafe_pickle`` (only for checkpoints you wrote: restore
    then unpickles arbitrary objects), a ``probe`` whose outputs on the restored model must
    match the saved ones within ``probe_rtol``/``probe_atol``, the init container's decision
    in ``resume_file`` (None: ``RTJ_RESUME_FILE``, else ``/var/run/rtj/resume.json``), and
    whether the restore prints its one-line report (``report``)."""

    allow_unsafe_pickle: bool = False
    probe: Probe | None = None
    probe_rtol: float = 1e-3
    probe_atol: float = 1e-6
    resume_file: str | os.PathLike[str] | None = None
    report: bool = True


@dataclass(frozen=True)
class EmergencyOptions:
    """The save after a SIGTERM: within ``deadline_s`` (None: ``RTJ_EMERGENCY_SAVE_SECONDS``
    from the operator, else 30 s), then exit with ``exit_code``."""

    deadline_s: float | None = None
    exit_code: int = 143


DEFAULT_ALIGNMENT = AlignmentCheck()


@dataclass(frozen=True)
class IntegrityOptions:
    """Silent-corruption checks (:mod:`rtj_shim.integrity`): ``check_finite`` refuses to
    publish NaN or inf; ``anomaly_guard`` judges the losses and gradient norms
    ``step_boundary`` is given; ``every_steps`` takes the same verdict between saves;
    ``data_alignment`` compares the ranks' losses after every resume with their spread
    before it (:mod:`rtj_shim.alignment`; None: no check)."""

    check_finite: bool = True
    anomaly_guard: AnomalyGuard | None = None
    every_steps: int | None = None
    data_alignment: AlignmentCheck | None = DEFAULT_ALIGNMENT


@dataclass(frozen=True)
class FastTierArgs:
    """The flat fast-tier keywords, kept until they go (`FastTierConfig` replaces them)."""

    directory: str | os.PathLike[str] | None = None
    every_steps: int | None = None
    keep: int | None = None


LEGACY: Mapping[str, tuple[str, str]] = {
    "io_workers": ("io", "io_workers"),
    "shard_bytes": ("io", "shard_bytes"),
    "max_shards": ("io", "max_shards"),
    "staging_dir": ("io", "staging_dir"),
    "collective_timeout_s": ("io", "collective_timeout_s"),
    "allow_unsafe_pickle": ("resume", "allow_unsafe_pickle"),
    "probe": ("resume", "probe"),
    "probe_rtol": ("resume", "probe_rtol"),
    "probe_atol": ("resume", "probe_atol"),
    "resume_file": ("resume", "resume_file"),
    "restore_report": ("resume", "report"),
    "emergency_deadline_s": ("emergency", "deadline_s"),
    "emergency_exit_code": ("emergency", "exit_code"),
    "check_finite": ("integrity", "check_finite"),
    "anomaly_guard": ("integrity", "anomaly_guard"),
    "integrity_every_steps": ("integrity", "every_steps"),
    "fast_tier_dir": ("fast_tier", "directory"),
    "fast_every_steps": ("fast_tier", "every_steps"),
    "fast_keep": ("fast_tier", "keep"),
}
"""Each flat keyword that moved: (the group's keyword, its field)."""

_SPELLING = {
    "io": "IoOptions",
    "resume": "ResumeOptions",
    "emergency": "EmergencyOptions",
    "integrity": "IntegrityOptions",
    "fast_tier": "FastTierConfig",
}
_FAST_FIELDS = {"directory": "directory", "every_steps": "every_steps", "keep": "keep"}


@dataclass(frozen=True)
class Options:
    """Every group, as the Checkpointer uses them."""

    io: IoOptions = IoOptions()
    resume: ResumeOptions = ResumeOptions()
    emergency: EmergencyOptions = EmergencyOptions()
    integrity: IntegrityOptions = IntegrityOptions()
    fast_args: FastTierArgs = FastTierArgs()


def group_legacy_options(options: Options, legacy: Mapping[str, Any]) -> Options:
    """`options` with the deprecated flat keywords applied (each with a DeprecationWarning
    naming its new spelling). A keyword that never existed: TypeError, naming it."""
    unknown = sorted(set(legacy) - set(LEGACY))
    if unknown:
        raise TypeError(f"Checkpointer() got unexpected keyword argument(s): {', '.join(unknown)}")
    changes: dict[str, dict[str, Any]] = {}
    for name, value in legacy.items():
        group, field = LEGACY[name]
        changes.setdefault(group, {})[field] = value
        warnings.warn(
            f"Checkpointer({name}=...) is deprecated: pass "
            f"{group}={_SPELLING[group]}({field}=...); the flat keyword goes in the next release",
            DeprecationWarning,
            stacklevel=3,
        )
    groups = {f.name: getattr(options, f.name) for f in fields(options)}
    for group, values in changes.items():
        if group == "fast_tier":
            groups["fast_args"] = replace(groups["fast_args"], **values)
        else:
            groups[group] = replace(groups[group], **values)
    return Options(**groups)


def with_pod_defaults(options: Options, env: Mapping[str, str] = os.environ) -> Options:
    """`options` with what the operator's pod says filled in where the caller said nothing:
    the emergency deadline (``RTJ_EMERGENCY_SAVE_SECONDS``), the resume file
    (``RTJ_RESUME_FILE``), the staging directory (``RTJ_STAGING_DIR``) and the write limit
    (``RTJ_MAX_WRITE_BYTES_PER_SECOND``)."""
    deadline = options.emergency.deadline_s
    if deadline is None:  # the operator's spec.checkpoint.emergencySaveSeconds
        deadline = pod_env.emergency_save_seconds(env)
    resume_file = options.resume.resume_file or env.get("RTJ_RESUME_FILE") or DEFAULT_RESUME_FILE
    staging = options.io.staging_dir or env.get("RTJ_STAGING_DIR") or None
    limit = options.io.max_write_bytes_per_second
    if limit is None:  # the operator's spec.checkpoint.maxWriteBytesPerSecond
        limit = pod_env.max_write_bytes_per_second(env)
    elif limit <= 0:
        raise ValueError(f"io.max_write_bytes_per_second: expected bytes > 0, got {limit!r}")
    return replace(
        options,
        io=replace(
            options.io,
            staging_dir=staging,
            io_workers=max(1, options.io.io_workers),
            max_write_bytes_per_second=limit,
        ),
        resume=replace(options.resume, resume_file=Path(resume_file)),
        emergency=replace(options.emergency, deadline_s=deadline),
    )
