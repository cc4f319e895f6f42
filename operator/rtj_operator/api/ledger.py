"""The recovery ledger (`status.recoveries`, issue 48): one record per recovery, newest
first, with the moment each of its phases ended, so an SRE reads after an incident where
the seconds went. The operator writes the phases it sees itself; the last three
(rendezvous, restored, first step) are the trainers' milestones (`rtj_shim.wire.milestones`),
trusted no further than the operator's own polls bracket them (`policy.ledger`)."""

from __future__ import annotations

from datetime import datetime
from enum import Enum

from pydantic import Field

from rtj_operator.api.base_status import StatusModel
from rtj_operator.api.reasons import FailureClass

MAX_RECOVERY_RECORDS = 16


class RecoveryPath(str, Enum):
    """How the world was brought back."""

    IN_PLACE = "InPlace"
    """The trainers restarted in the pods they ran in (spec.recovery.inPlace)."""
    WHOLE_WORLD = "WholeWorld"
    """A new attempt: every pod created again (a new JobSet)."""


class Replacement(str, Enum):
    """What took the place of a failed pod."""

    NONE = "None"
    """No pod was replaced (the same pods restarted)."""
    POD = "Pod"
    """A pod created again (its Job's, or a whole new world's)."""
    SPARE = "Spare"
    """A warm spare already running took the rank (spec.spares)."""


class LedgerPhase(str, Enum):
    """The phases of a recovery, in order; each ends at its record's field of that name."""

    DETECTED = "detected"
    DECIDED = "decided"
    STOPPED = "stopped"
    REPLACEMENT_READY = "replacementReady"
    PREFLIGHT = "preflight"
    STARTED = "started"
    RENDEZVOUS = "rendezvous"
    RESTORED = "restored"
    FIRST_STEP = "firstStep"


class RecoveryRecord(StatusModel):
    """One recovery: when each phase ended (null: not part of this recovery, or not seen)."""

    attempt: int = Field(ge=1, description="The attempt the world was brought back in.")
    generation: int = Field(
        default=0, ge=0, description="The trainers' generation it started (0: a new attempt's)."
    )
    path: RecoveryPath
    failure_class: FailureClass | None = None
    replacement: Replacement = Field(default=Replacement.NONE)
    failed_at: datetime | None = Field(
        default=None, description="The onset: the first failed rank's end (the kubelet's time)."
    )
    detected_at: datetime | None = Field(default=None, description="Failure classified.")
    decided_at: datetime | None = Field(default=None, description="Recovery path chosen.")
    stopped_at: datetime | None = Field(
        default=None, description="Every trainer of the old world had stopped."
    )
    replacement_ready_at: datetime | None = Field(
        default=None, description="The replacement pod or spare was there (null: none needed)."
    )
    preflight_at: datetime | None = Field(
        default=None, description="The new world's preflight checks passed (null: none ran)."
    )
    started_at: datetime | None = Field(
        default=None, description="Every pod's trainer was started (in place) or ran (a new world)."
    )
    rendezvous_at: datetime | None = Field(
        default=None, description="The last rank joined the new world (its milestone)."
    )
    restored_at: datetime | None = Field(
        default=None, description="The last rank finished restoring the checkpoint."
    )
    first_step_at: datetime | None = Field(
        default=None, description="The last rank completed its first step: recovered."
    )
    step_at_failure: int | None = Field(
        default=None, ge=0, description="The step every rank had completed when last read."
    )
    resumed_step: int | None = Field(
        default=None, ge=0, description="The step the trainers restored (their milestone)."
    )
    steps_retrained: int | None = Field(
        default=None, ge=0, description="stepAtFailure minus resumedStep: work done twice."
    )
    complete: bool = Field(
        default=False, description="Every rank reached its first step (the phases are final)."
    )
