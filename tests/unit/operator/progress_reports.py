"""Progress reports as `rtj-shim progress-server` writes them (`rtj_shim.agent.progress_report`),
for the tests of the operator's progress policies."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rtj_operator.policy.progress import PodReport

NOW = 10_000.0


def rank(
    r: int,
    step: int | None,
    section: str,
    in_section: float,
    *,
    state: str = "running",
    steps: Sequence[float] = (),
    busy: float | None = None,
    checkpoint: float | None = None,
    completed: int = 100,
    since_update: float | None = None,
) -> dict[str, Any]:
    """One rank as rtj-shim progress-server reports it (``since_update``: its record's age,
    which a pulsing shim keeps under a second; by default, updated when it entered its
    section, as without a pulse)."""
    median = sorted(steps)[len(steps) // 2] if steps else None
    return {
        "rank": r, "local_rank": r % 8, "pid": 100 + r, "restart": 0, "state": state,
        "step": step, "steps_completed": completed, "section": section,
        "seconds_in_section": in_section,
        "seconds_since_update": in_section if since_update is None else since_update,
        "seconds_since_step": in_section, "seconds_since_start": 1000.0,
        "last_step_seconds": steps[-1] if steps else None, "median_step_seconds": median,
        "median_busy_seconds": busy if busy is not None else median,
        "recent_step_seconds": list(steps), "recent_wait_seconds": [0.0] * len(steps),
        "last_checkpoint_seconds": checkpoint, "max_checkpoint_seconds": checkpoint,
        "checkpoints": 1 if checkpoint else 0, "seq": 7, "updated_wall_time": 1.7e9,
    }  # fmt: skip


def pod(name: str, *ranks: dict[str, Any], received_at: float = NOW) -> PodReport:
    body = {"schema": 1, "pod_wall_time": 1.7e9, "hostname": name, "ranks": list(ranks)}
    return PodReport(name, received_at, body)
