"""Rank 0's log records (the example trainer's JSON lines) from the pod runner's per-pod
directories: the newest step trained, and the first step trained after a resume. Pure over
the files read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def records(root: Path, pattern: str) -> list[dict[str, Any]]:
    """Every timed record of the logs under `root` matching `pattern`, in time order."""
    out = []
    for log in root.glob(pattern):
        for line in log.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # the line a killed rank was writing
    return sorted((r for r in out if "time" in r), key=lambda r: float(r["time"]))


def last_step(recs: list[dict[str, Any]]) -> int:
    steps = [int(r["step"]) for r in recs if "loss" in r and "event" not in r]
    return max(steps, default=0)


def resumed(recs: list[dict[str, Any]], after: float) -> tuple[int, float, str] | None:
    """(the step restored after `after`, when the first step after it completed, the
    restore's source)."""
    restore = next((r for r in recs
                    if r.get("event") == "restore" and float(r["time"]) > after), None)  # fmt: skip
    if restore is None:
        return None
    first = next((r for r in recs if "loss" in r and "event" not in r
                  and float(r["time"]) > float(restore["time"])), None)  # fmt: skip
    if first is None:
        return None
    return int(restore["step"]), float(first["time"]), str(restore.get("source", ""))
