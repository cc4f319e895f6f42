"""What a pod's progress sidecar reports: its ranks' records, read and aged, as JSON.

`report` is the whole ``GET /progress`` body (`rtj_shim.agent.progress_server` serves it, and
answers a restart order with it). Ages are computed here, with this machine's
``CLOCK_MONOTONIC`` (the one the records use), at the moment of the call.

The JSON (``schema`` 1)::

    {"schema": 1, "pod_wall_time": 1717000000.123, "hostname": "job-worker-0-1-x7k2p",
     "ranks": [{"rank": 5, "local_rank": 1, "pid": 311, "restart": 0, "state": "running",
                "step": 812, "steps_completed": 40, "section": "forward",
                "seconds_in_section": 94.2, "seconds_since_update": 94.2,
                "seconds_since_step": 94.3, "seconds_since_start": 130.0,
                "last_step_seconds": 0.051, "median_step_seconds": 0.050,
                "median_busy_seconds": 0.031, "recent_step_seconds": [...],
                "recent_wait_seconds": [...], "last_checkpoint_seconds": 4.1,
                "max_checkpoint_seconds": 4.3, "checkpoints": 2, "seq": 9131,
                "updated_wall_time": 1717000000.0,
                "milestones": {"restored": {"at": 1717000001.9, "step": 400}, ...}}],
     "errors": [{"file": "rank-00007.progress", "error": "..."}]}

``step`` is null before the first completed step; durations are null until observed.
``milestones`` (absent before the first, and from an older shim): when the rank's process
formed the world, restored and completed its first step (`rtj_shim.wire.milestones`).
``save_costs`` (absent before its first save): per tier, the seconds a save held it and how
many it made (`rtj_shim.wire.save_costs`).
``median_busy_seconds``: the median of (step time minus time in waiting sections).
"""

from __future__ import annotations

import os
import socket
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rtj_shim.fast import fast_tier
from rtj_shim.wire import control, milestones, save_costs
from rtj_shim.wire.progress_record import (
    FILE_PREFIX,
    FILE_SUFFIX,
    STATES,
    Record,
    RecordError,
    read_file,
)

SCHEMA = 1
MAX_FILES = 1024  # ranks per pod read per request; bounds the response and the work
NS = 1e9


def _seconds(ns: int) -> float | None:
    return round(ns / NS, 6) if ns > 0 else None


def _median(values: Sequence[int]) -> float | None:
    return round(statistics.median(values) / NS, 6) if values else None


def rank_json(record: Record, now_ns: int) -> dict[str, Any]:
    """One rank's entry, with ages as of ``now_ns`` (CLOCK_MONOTONIC)."""

    def age(at: int) -> float | None:
        return round(max(0, now_ns - at) / NS, 6) if at > 0 else None

    busy = [max(0, s - w) for s, w in zip(record.step_ns, record.wait_ns, strict=True)]
    return {
        "rank": record.rank,
        "local_rank": record.local_rank,
        "pid": record.pid,
        "restart": record.restart,
        "state": STATES.get(record.state, f"unknown-{record.state}"),
        "step": record.step,
        "steps_completed": record.steps_completed,
        "section": record.section,
        "seconds_in_section": age(record.section_started_ns),
        "seconds_since_update": age(record.updated_ns),
        "seconds_since_step": age(record.step_done_ns),
        "seconds_since_start": age(record.started_ns),
        "last_step_seconds": _seconds(record.last_step_ns),
        "median_step_seconds": _median(record.step_ns),
        "median_busy_seconds": _median(busy),
        "recent_step_seconds": [round(s / NS, 6) for s in record.step_ns],
        "recent_wait_seconds": [round(w / NS, 6) for w in record.wait_ns],
        "last_checkpoint_seconds": _seconds(record.last_checkpoint_ns),
        "max_checkpoint_seconds": _seconds(record.max_checkpoint_ns),
        "checkpoints": record.checkpoints,
        "seq": record.seq,
        "updated_wall_time": round(record.updated_wall_ns / NS, 6),
    }


def record_files(directory: Path, limit: int = MAX_FILES) -> list[Path]:
    """The record files in ``directory`` (at most ``limit``, by name), none if it is absent."""
    try:
        names = sorted(
            entry.name
            for entry in os.scandir(directory)
            if entry.name.startswith(FILE_PREFIX)
            and entry.name.endswith(FILE_SUFFIX)
            and entry.is_file(follow_symlinks=False)
        )
    except FileNotFoundError:
        return []
    return [directory / name for name in names[:limit]]


def report(
    directory: Path,
    *,
    limit: int = MAX_FILES,
    control_dir: Path | None = None,
    fast_tier_dir: Path | None = None,
) -> dict[str, Any]:
    """The whole ``GET /progress`` body for the records in ``directory``, now."""
    ranks: list[dict[str, Any]] = []
    errors: list[dict[str, str]] = []
    for path in record_files(directory, limit):
        try:
            record = read_file(path)
        except FileNotFoundError:
            continue  # replaced by a new process between the listing and the read
        except (OSError, RecordError) as exc:
            errors.append({"file": path.name, "error": str(exc)[:200]})
            continue
        entry = rank_json(record, time.monotonic_ns())
        entry.update(_beside(path, record.pid, errors))
        ranks.append(entry)
    ranks.sort(key=lambda r: int(r["rank"]))
    body = {
        "schema": SCHEMA,
        "pod_wall_time": round(time.time(), 6),
        "hostname": socket.gethostname(),
        "ranks": ranks,
        "errors": errors,
    }
    if control_dir is not None:
        body["supervisor"] = control.read_json(control_dir / control.STATE_FILE)
    if fast_tier_dir is not None:
        body["fast_tier"] = fast_tier.newest_held(fast_tier_dir)
    return body


def _beside(path: Path, pid: int, errors: list[dict[str, str]]) -> dict[str, Any]:
    """The rank's milestones and save costs (the files beside its record), while they are
    its process's (`pid`); an unreadable one is an error of the body, not of the rank."""
    out: dict[str, Any] = {}
    try:
        marks = milestones.read(milestones.path_for(path))
    except (OSError, milestones.MilestonesError) as exc:
        errors.append({"file": milestones.path_for(path).name, "error": str(exc)[:200]})
        marks = None
    if marks is not None and marks.pid == pid:  # else an older process's
        out["milestones"] = marks.encode()["marks"]
    try:
        costs = save_costs.read(save_costs.path_for(path))
    except (OSError, save_costs.SaveCostsError) as exc:
        errors.append({"file": save_costs.path_for(path).name, "error": str(exc)[:200]})
        costs = None
    if costs is not None and costs.pid == pid and costs.tiers:
        out["save_costs"] = costs.encode()["tiers"]
    return out
