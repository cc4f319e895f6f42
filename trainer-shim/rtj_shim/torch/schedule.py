"""When ``step_boundary()`` saves: every N steps, every T seconds, when the metric improved.

Pure decisions over values every rank holds identically after one collective (the
Checkpointer all-reduces this rank's "T seconds have passed" flag and rank 0's metric with
the SIGTERM flag, in the one reduction it already does per step): so every rank takes the
same decision without extra user code, and a save is collective as it must be.

``Best`` is the best metric published so far; it rides in every manifest written once a
metric was seen (``extra.best``), so a resumed run knows it (and retention's keep-best
reads ``extra.metric`` of each step).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from rtj_shim.checkpoint.retention import merged_retention as merged_retention

Mode = Literal["min", "max"]


@dataclass(frozen=True)
class Best:
    name: str
    mode: Mode
    value: float
    step: int

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "mode": self.mode, "value": self.value, "step": self.step}


@dataclass(frozen=True)
class Schedule:
    every_steps: int | None = None
    every_seconds: float | None = None
    monitor: str | None = None  # the metric whose improvement saves (None: no such saves)
    mode: Mode = "min"

    def __post_init__(self) -> None:
        if self.every_steps is not None and self.every_steps < 1:
            raise ValueError(f"every_steps must be >= 1, got {self.every_steps}")
        if self.every_seconds is not None and not self.every_seconds > 0:
            raise ValueError(f"every_seconds must be > 0, got {self.every_seconds}")
        if self.mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {self.mode!r}")
        if self.monitor is not None and not self.monitor:
            raise ValueError("monitor must name the metric (or be None), got ''")

    def time_due(self, seconds_since_save: float) -> bool:
        return self.every_seconds is not None and seconds_since_save >= self.every_seconds

    def step_due(self, step: int) -> bool:
        return self.every_steps is not None and step % self.every_steps == 0


def improved(best: Best | None, value: float, mode: Mode) -> bool:
    """A finite ``value`` better than ``best`` (strictly); the first finite value is."""
    if not math.isfinite(value):
        return False
    if best is None:
        return True
    return value < best.value if mode == "min" else value > best.value


def updated(
    best: Best | None, name: str, mode: Mode, value: float | None, step: int
) -> Best | None:
    """The best after publishing ``step`` with ``value`` (None: no metric at this step)."""
    if value is None or not improved(best, value, mode):
        return best
    return Best(name, mode, float(value), step)


def best_from(extra: dict[str, Any], name: str) -> Best | None:
    """The best a manifest recorded for metric ``name`` (None if absent or malformed)."""
    raw = extra.get("best")
    if not isinstance(raw, dict) or raw.get("name") != name:
        return None
    try:
        mode = raw["mode"]
        if mode not in ("min", "max"):
            return None
        return Best(name, mode, float(raw["value"]), int(raw["step"]))
    except (KeyError, TypeError, ValueError):
        return None


@dataclass(frozen=True)
class Decision:
    save: bool
    why: str  # "steps", "time", "improved" (comma-separated when several), or ""


def save_decision(
    schedule: Schedule, step: int, time_due: bool, metric: float | None, best: Best | None
) -> Decision:
    reasons = []
    if schedule.step_due(step):
        reasons.append(f"every {schedule.every_steps} steps")
    if time_due:
        reasons.append(f"every {schedule.every_seconds:g}s")
    if metric is not None and improved(best, metric, schedule.mode):
        reasons.append(f"{schedule.monitor} improved to {metric:g}")
    return Decision(bool(reasons), ", ".join(reasons))


def metric_flag(value: float | None) -> float:
    """1: a finite metric; 2: a metric that is NaN or infinite; 0: none."""
    if value is None:
        return 0.0
    return 1.0 if math.isfinite(value) else 2.0


def scores(
    schedule: Schedule, best: Best | None, step: int, value: float | None
) -> tuple[dict[str, Any], Best | None]:
    """Manifest extra for a save (``metric`` at this step, ``best`` so far) and the new best."""
    out: dict[str, Any] = {}
    if schedule.monitor is None:  # no metric is recorded (the Checkpointer refuses one)
        return out, best
    if value is not None and math.isfinite(value):
        out["metric"] = {"name": schedule.monitor, "mode": schedule.mode, "value": value}
    best = updated(best, schedule.monitor, schedule.mode, value, step)
    if best is not None:
        out["best"] = best.to_json()
    return out, best
