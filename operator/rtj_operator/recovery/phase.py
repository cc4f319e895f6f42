"""Where a job stands in recovery: a pure function of its status and the time.

The status fields that carry the state (`phase`, `attempt`, `nextAttemptAt`, `inPlace`)
are read in one place, here; `status.recoveryPhase` records the answer on every status
write, and `recovery.table` lists the moves between the answers.
"""

from __future__ import annotations

from datetime import datetime

from rtj_operator.api.reasons import InPlaceStage, Phase, RecoveryPhase
from rtj_operator.api.status import ResilientTrainingJobStatus

_TERMINAL = {Phase.SUCCEEDED: RecoveryPhase.SUCCEEDED, Phase.FAILED: RecoveryPhase.FAILED}
_IN_PLACE = {
    InPlaceStage.STOPPING: RecoveryPhase.STOPPING_IN_PLACE,
    InPlaceStage.STARTING: RecoveryPhase.STARTING_IN_PLACE,
}


def recovery_phase(status: ResilientTrainingJobStatus, now: datetime) -> RecoveryPhase:
    """The recovery phase `status` is in at `now` (the backoff ends by the clock alone)."""
    if (terminal := _TERMINAL.get(status.phase)) is not None:
        return terminal
    if status.phase is Phase.SUSPENDED:
        return RecoveryPhase.SUSPENDED
    if status.attempt == 0:
        return RecoveryPhase.NOT_STARTED
    if status.phase is Phase.RESTARTING:
        until = status.next_attempt_at
        waiting = until is not None and now < until
        return RecoveryPhase.BACKING_OFF if waiting else RecoveryPhase.STARTING
    if status.in_place is not None:
        return _IN_PLACE[InPlaceStage(status.in_place.phase)]
    return RecoveryPhase.RUNNING
