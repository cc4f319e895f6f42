"""A rank's start-up milestones: when its process formed the world, began and finished its
restore, and completed its first step. The recovery ledger's last phases (issue 48) are
read from them; nothing else is.

One small JSON file per rank beside its progress record, ``<dir>/rank-NNNNN.milestones``,
written whole (a temporary file, then renamed) at each milestone, a handful of writes per
process and none per step. The progress sidecar serves it as the rank's ``"milestones"``
when its ``pid`` is the record's (a file left by an older process of the rank is not this
one's)::

    {"schema": 1, "pid": 311, "marks": {"rendezvous": {"at": 1717000000.5},
     "restore_began": {"at": 1717000000.6}, "restored": {"at": 1717000001.9, "step": 400},
     "first_step": {"at": 1717000002.1, "step": 401}}}

``at`` is the pod's wall clock (Unix seconds); the operator places it on its own clock with
the report's ``pod_wall_time`` and trusts it no further than the bracket its own polls saw
(the file is the tenant speaking). Pure but for `write` and `read`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from rtj_shim.wire import rank_files

SCHEMA = 1
SUFFIX = ".milestones"
MAX_BYTES = 1024
MAX_STEP = 2**62


class Milestone(str, Enum):
    """What a rank's process reached, in the order it reaches them."""

    RENDEZVOUS = "rendezvous"
    """The process group formed (``rtj_shim.torch.init_process_group`` returned)."""
    RESTORE_BEGAN = "restore_began"
    """The rank entered its ``restore`` section (a collective: the world had formed)."""
    RESTORED = "restored"
    """The restore returned, with the step it resumed from (0: a fresh start)."""
    FIRST_STEP = "first_step"
    """The process completed its first step, with the step's number."""

    def __str__(self) -> str:
        return self.value


class MilestonesError(ValueError):
    """A file or body that is not a milestones record; the message names the field."""


@dataclass(frozen=True)
class Mark:
    at: float
    step: int | None = None


@dataclass(frozen=True)
class Milestones:
    pid: int
    marks: Mapping[Milestone, Mark] = field(default_factory=dict)

    def with_mark(self, name: Milestone, at: float, step: int | None = None) -> Milestones:
        return Milestones(self.pid, {**self.marks, name: Mark(at, step)})

    def encode(self) -> dict[str, Any]:
        marks: dict[str, Any] = {}
        for name, mark in self.marks.items():
            marks[name.value] = {"at": mark.at} | ({} if mark.step is None else {"step": mark.step})
        return {"schema": SCHEMA, "pid": self.pid, "marks": marks}

    @classmethod
    def parse(cls, body: object) -> Milestones:
        body = rank_files.header(body, "milestones", SCHEMA, MilestonesError)
        pid = body["pid"]
        raw = body.get("marks")
        if not isinstance(raw, Mapping):
            raise MilestonesError("milestones.marks: expected an object")
        marks: dict[Milestone, Mark] = {}
        for key, value in raw.items():
            try:
                name = Milestone(key)
            except ValueError:
                continue  # a newer shim's milestone: not this reader's
            marks[name] = _mark(f"milestones.marks.{key}", value)
        return cls(pid, marks)


def _mark(where: str, value: object) -> Mark:
    if not isinstance(value, Mapping):
        raise MilestonesError(f"{where}: expected an object")
    at, step = value.get("at"), value.get("step")
    if not isinstance(at, int | float) or isinstance(at, bool) or not math.isfinite(at) or at < 0:
        raise MilestonesError(f"{where}.at: expected Unix seconds, got {at!r}")
    if step is not None and (
        not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= MAX_STEP
    ):
        raise MilestonesError(f"{where}.step: expected a step number >= 0, got {step!r}")
    return Mark(float(at), step)


def path_for(record: Path) -> Path:
    """The milestones file beside a rank's progress record."""
    return record.with_suffix(SUFFIX)


def write(path: Path, milestones: Milestones) -> None:
    """Replace ``path`` with ``milestones`` whole (a reader sees the old file or the new)."""
    rank_files.write_whole(path, milestones.encode())


def read(path: Path) -> Milestones | None:
    """The file's milestones; None when there is none (an older shim writes no file).
    Raises MilestonesError for a file that is not one (the message names the field)."""
    body = rank_files.read_bounded(path, MAX_BYTES, "milestones", MilestonesError)
    return None if body is None else Milestones.parse(body)
