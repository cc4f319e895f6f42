"""What a rank notes beside its progress record, for the operator's recovery ledger and
its checkpoint intervals: its start-up milestones (each once: `rtj_shim.wire.milestones`)
and the seconds its saves held the training thread (`rtj_shim.wire.save_costs`).
Neither ever fails training: a file that cannot be written is logged."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from rtj_shim.wire import milestones as ms
from rtj_shim.wire import save_costs as sc

log = logging.getLogger("rtj_shim.progress")


class RankNotes:
    """The notes of one process. ``fresh``: this process started the record (a record
    continued from another process, as ``rtj-shim heartbeat`` does, marks no milestones)."""

    def __init__(self, record: Path, pid: int, *, fresh: bool) -> None:
        self._milestones_path = ms.path_for(record)
        self._milestones = ms.Milestones(pid) if fresh else None
        self._first_step_pending = fresh
        if fresh:
            self._milestones_path.unlink(missing_ok=True)  # an older process's
        self._save_costs = sc.Recorder(sc.path_for(record), pid)

    def step_done(self, step: int) -> None:
        """The first completed step is a milestone; every later one costs a flag test."""
        if self._first_step_pending:
            self._first_step_pending = False
            self.mark(ms.Milestone.FIRST_STEP, step)

    def mark(self, name: ms.Milestone, step: int | None = None) -> None:
        found = self._milestones
        if found is None or name in found.marks:
            return
        self._milestones = found = found.with_mark(name, time.time_ns() / 1e9, step)
        try:
            ms.write(self._milestones_path, found)
        except OSError as exc:
            log.warning("progress: milestone %s not written: %s", name, exc)

    def note_save(self, tier: sc.SaveTier, seconds: float) -> None:
        self._save_costs.note(tier, seconds)
