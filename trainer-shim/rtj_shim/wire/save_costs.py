"""What a rank's saves cost it: per tier, how long a save held the training thread (a moving
average) and how many it has made. The operator chooses `plannedIntervalSeconds: auto` from
it (`rtj_operator.policy.intervals`): a save's cost is half of Young/Daly's optimum.

One small JSON file per rank beside its progress record, ``<dir>/rank-NNNNN.saves``, written
whole (a temporary file renamed over it) by the thread that finished the save, never by a
step that saves nothing: at most one write per `MIN_WRITE_GAP_S` once a tier has made
`EAGER_SAVES` saves, so a fast tier saving every few steps adds no file write per save. The
progress sidecar serves it as the rank's ``"save_costs"`` only while the file's ``pid`` is
the record's (an older process's costs are not this one's).

    {"schema": 1, "pid": 4242,
     "tiers": {"durable": {"seconds": 1.9, "saves": 3}, "fast": {"seconds": 0.04, "saves": 80}}}

The tenant's word: the operator bounds what it reads (`MAX_SECONDS`) and the interval it
chooses from it (the platform's floor and ceiling), and it only sets this job's interval.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from rtj_shim.wire import rank_files

log = logging.getLogger("rtj_shim.progress")

SCHEMA = 1
SUFFIX = ".saves"
MAX_BYTES = 1024
MAX_SECONDS = 86400.0
"""A save said to hold its rank longer than a day is no measurement."""
SMOOTHING = 0.3
"""The weight of the newest save in the moving average."""
EAGER_SAVES = 3
MIN_WRITE_GAP_S = 10.0


class SaveTier(str, Enum):
    """Which tier a save wrote."""

    DURABLE = "durable"
    """The checkpoint store (`spec.checkpoint.uri`)."""
    FAST = "fast"
    """The pod-local fast tier (`spec.checkpoint.fastTier`)."""

    def __str__(self) -> str:
        return self.value


class SaveCostsError(ValueError):
    """A file or body that is not a save-costs record; the message names the field."""


@dataclass(frozen=True)
class TierCost:
    seconds: float
    """The moving average of the seconds a save held the training thread."""
    saves: int


@dataclass(frozen=True)
class SaveCosts:
    pid: int
    tiers: Mapping[SaveTier, TierCost] = field(default_factory=dict)

    def with_save(self, tier: SaveTier, seconds: float) -> SaveCosts:
        """These costs after one more save of `tier` that held the thread `seconds`."""
        seconds = min(max(float(seconds), 0.0), MAX_SECONDS)
        old = self.tiers.get(tier)
        if old is None:
            new = TierCost(seconds, 1)
        else:
            average = (1 - SMOOTHING) * old.seconds + SMOOTHING * seconds
            new = TierCost(average, old.saves + 1)
        return SaveCosts(self.pid, {**self.tiers, tier: new})

    def encode(self) -> dict[str, Any]:
        tiers = {t.value: {"seconds": c.seconds, "saves": c.saves} for t, c in self.tiers.items()}
        return {"schema": SCHEMA, "pid": self.pid, "tiers": tiers}

    @classmethod
    def parse(cls, body: object) -> SaveCosts:
        body = rank_files.header(body, "save_costs", SCHEMA, SaveCostsError)
        pid = body["pid"]
        raw = body.get("tiers")
        if not isinstance(raw, Mapping):
            raise SaveCostsError("save_costs.tiers: expected an object")
        tiers: dict[SaveTier, TierCost] = {}
        for key, value in raw.items():
            try:
                tier = SaveTier(key)
            except ValueError:
                continue  # a newer shim's tier: not this reader's
            tiers[tier] = _tier_cost(f"save_costs.tiers.{key}", value)
        return cls(pid, tiers)


def _tier_cost(where: str, value: object) -> TierCost:
    if not isinstance(value, Mapping):
        raise SaveCostsError(f"{where}: expected an object")
    seconds, saves = value.get("seconds"), value.get("saves")
    if (
        not isinstance(seconds, int | float)
        or isinstance(seconds, bool)
        or not math.isfinite(seconds)
        or not 0 <= seconds <= MAX_SECONDS
    ):
        raise SaveCostsError(f"{where}.seconds: expected 0 to {MAX_SECONDS:.0f}, got {seconds!r}")
    if not isinstance(saves, int) or isinstance(saves, bool) or saves < 1:
        raise SaveCostsError(f"{where}.saves: expected a count >= 1, got {saves!r}")
    return TierCost(float(seconds), saves)


def path_for(record: Path) -> Path:
    """The save-costs file beside a rank's progress record."""
    return record.with_suffix(SUFFIX)


def write(path: Path, costs: SaveCosts) -> None:
    """Replace ``path`` with ``costs`` whole (a reader sees the old file or the new)."""
    rank_files.write_whole(path, costs.encode())


def read(path: Path) -> SaveCosts | None:
    """The file's costs; None when there is none (no save yet, or an older shim). Raises
    SaveCostsError for a file that is not one (the message names the field)."""
    body = rank_files.read_bounded(path, MAX_BYTES, "save_costs", SaveCostsError)
    return None if body is None else SaveCosts.parse(body)


class Recorder:
    """One process's save costs and their file (a new process starts afresh: it removes an
    older process's file). Thread-safe: saves finish on writer threads."""

    def __init__(self, path: Path, pid: int) -> None:
        self.path = path
        self._costs = SaveCosts(pid)
        self._lock = threading.Lock()
        self._written_at = -math.inf
        path.unlink(missing_ok=True)

    @property
    def costs(self) -> SaveCosts:
        return self._costs

    def note(self, tier: SaveTier, seconds: float) -> None:
        """One more save of `tier`; written now unless a write was recent (a file that cannot
        be written is logged: costs never fail training)."""
        with self._lock:
            self._costs = costs = self._costs.with_save(tier, seconds)
            now = time.monotonic()
            if costs.tiers[tier].saves > EAGER_SAVES and now - self._written_at < MIN_WRITE_GAP_S:
                return
            self._written_at = now
            try:
                write(self.path, costs)
            except OSError as exc:
                log.warning("progress: save costs not written: %s", exc)
