"""The operator's signed order of a checkpoint interval (issue 48, `plannedIntervalSeconds:
auto`): how many seconds of training the trainers leave between durable saves.

The operator sends it to every pod's progress sidecar, ``POST /intervals``, signed with the
job's control key like a restart order, and again whenever the sidecar's report
(``"intervals"`` in ``GET /progress``) does not show the interval in
``status.checkpointIntervals``. The sidecar writes it whole into the progress directory
(`FILE`); a Checkpointer built with ``every_seconds="auto"`` reads it there
(:class:`FollowedInterval`, a stat every `RECHECK_S`, never a read per step). The ranks need
not switch at one step: a time-due save is agreed as any rank's flag (`rtj_shim.torch.agreement`),
so while some have the new interval and some the old, every rank still takes the same
decision.

Pure but for the file's read and write.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rtj_shim.wire.control import (
    OrderError,
    accept_signed,
    count,
    json_object,
    read_json,
    write_json,
)

log = logging.getLogger("rtj_shim.intervals")

FILE = "intervals.json"
MAX_INTERVAL_ORDER_BYTES = 1024
MAX_SECONDS = 7 * 86400
RECHECK_S = 5.0
"""How often a following Checkpointer looks at the file (a stat; a read when it changed)."""
START_SECONDS = 600.0
"""A following Checkpointer's interval before the operator's first order (the CRD's default
`plannedIntervalSeconds`; the first order comes within a progress poll of the sidecar's start)."""


class IntervalOrderError(OrderError):
    """An interval order that must not be followed (the message names the field)."""


@dataclass(frozen=True)
class IntervalOrder:
    job_uid: str
    durable_seconds: int

    def to_json(self) -> dict[str, Any]:
        return {"job_uid": self.job_uid, "durable_seconds": self.durable_seconds}

    def encode(self) -> bytes:
        import json

        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":")).encode()


def parse_interval_order(raw: bytes) -> IntervalOrder:
    data = json_object(raw, MAX_INTERVAL_ORDER_BYTES, "interval order", IntervalOrderError)
    return _from_json(data)


def _from_json(data: dict[str, Any]) -> IntervalOrder:
    uid, seconds = data.get("job_uid"), data.get("durable_seconds")
    if not isinstance(uid, str) or not uid:
        raise IntervalOrderError(f"intervals.job_uid: expected a non-empty string, got {uid!r}")
    if not count(seconds) or not 1 <= seconds <= MAX_SECONDS:
        raise IntervalOrderError(
            f"intervals.durable_seconds: expected 1 to {MAX_SECONDS} seconds, got {seconds!r}"
        )
    return IntervalOrder(uid, seconds)


def accept_interval_order(
    raw: bytes, signature: str | None, *, key: str, job_uid: str
) -> IntervalOrder:
    """The interval order a sidecar may follow, or IntervalOrderError: signed with this
    job's key, for this job."""
    return accept_signed(
        raw, signature, key=key, job_uid=job_uid, parse=parse_interval_order,
        error=IntervalOrderError, name="intervals", off="no interval for its job",
    )  # fmt: skip


def write(directory: Path, order: IntervalOrder) -> None:
    """The sidecar's part: the order, whole, where the trainers read it."""
    write_json(directory / FILE, order.to_json())


def read(directory: Path) -> IntervalOrder | None:
    """The order in `directory`; None without one, or one that is not an order (logged)."""
    data = read_json(directory / FILE)
    if data is None:
        return None
    try:
        return _from_json(data)
    except IntervalOrderError as exc:
        log.warning("%s: ignored (%s)", directory / FILE, exc)
        return None


class FollowedInterval:
    """A trainer's view of the operator's interval: `seconds()` is cheap at every boundary
    (a clock read), and looks at the file every `RECHECK_S`."""

    def __init__(self, directory: Path | None, start: float = START_SECONDS) -> None:
        self.directory = directory
        self._seconds = start
        self._checked = -RECHECK_S
        self._mtime: int | None = None

    def seconds(self, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        if self.directory is not None and now - self._checked >= RECHECK_S:
            self._checked = now
            self._look()
        return self._seconds

    def _look(self) -> None:
        assert self.directory is not None
        try:
            mtime = (self.directory / FILE).stat().st_mtime_ns
        except OSError:
            return
        if mtime == self._mtime:
            return
        self._mtime = mtime
        order = read(self.directory)
        if order is not None and order.durable_seconds != self._seconds:
            log.info("checkpoint interval from the operator: every %d s", order.durable_seconds)
            self._seconds = float(order.durable_seconds)
