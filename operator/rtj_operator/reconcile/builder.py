"""The plan builder: accumulates status changes, actions, Events and metrics, then emits
one `Plan` with at most one status patch (a JSON merge patch from the stored status)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from rtj_operator.api.attempts import AttemptRecord
from rtj_operator.api.reasons import ConditionType, Reason
from rtj_operator.api.resource import ResilientTrainingJob
from rtj_operator.api.status import Condition, ResilientTrainingJobStatus
from rtj_operator.reconcile.actions import (
    Action,
    KubeAction,
    MetricRecord,
    PatchStatus,
    Plan,
    PostEvent,
    merge_patch,
)
from rtj_operator.reconcile.world import Snapshot
from rtj_operator.recovery.phase import recovery_phase
from rtj_operator.recovery.table import allowed, check, strict

MAX_EVIDENCE_LINES = 16


MAX_EVIDENCE_CHARS = 1024


MAX_EVENT_MESSAGE = 1024


def set_condition(
    conditions: Sequence[Condition],
    type_: ConditionType,
    status: bool | None,
    reason: Reason | str,
    message: str,
    now: datetime,
    generation: int | None = None,
) -> list[Condition]:
    """metav1 semantics: lastTransitionTime moves only when `status` changes (None:
    Unknown, the operator cannot tell)."""
    value: Literal["True", "False", "Unknown"] = (
        "Unknown" if status is None else "True" if status else "False"
    )
    reason_text = reason.value if isinstance(reason, Reason) else reason
    old = next((c for c in conditions if c.type == type_.value), None)
    since = old.last_transition_time if old is not None and old.status == value else now
    new = Condition(
        type=type_.value,
        status=value,
        reason=reason_text,
        message=message[:MAX_EVIDENCE_CHARS],
        last_transition_time=since,
        observed_generation=generation,
    )
    out = [c for c in conditions if c.type != type_.value]
    out.append(new)
    return sorted(out, key=lambda c: c.type)


def condition_true(status: ResilientTrainingJobStatus, type_: ConditionType) -> bool:
    return any(c.type == type_.value and c.status == "True" for c in status.conditions)


def trim_evidence(lines: Iterable[str]) -> list[str]:
    out = []
    for line in list(lines)[:MAX_EVIDENCE_LINES]:
        out.append(
            line if len(line) <= MAX_EVIDENCE_CHARS else line[: MAX_EVIDENCE_CHARS - 1] + "…"
        )
    return out


def event_message(text: str) -> str:
    return text if len(text) <= MAX_EVENT_MESSAGE else text[: MAX_EVENT_MESSAGE - 1] + "…"


STATUS_KEYS = frozenset(
    info.alias or name for name, info in ResilientTrainingJobStatus.model_fields.items()
)
"""The status fields this operator writes (and may remove); any other is left alone."""


@dataclass
class PlanBuilder:
    snap: Snapshot
    status: ResilientTrainingJobStatus
    before: list[KubeAction] = field(default_factory=list)
    after: list[KubeAction] = field(default_factory=list)
    events: list[PostEvent] = field(default_factory=list)
    metrics: list[MetricRecord] = field(default_factory=list)
    requeue: float | None = None
    needs_store: bool = False
    needs_events: bool = False
    needs_queue: str | None = None
    """The LocalQueue to look up (the one the waiting JobSet is labelled with)."""
    notes: list[str] = field(default_factory=list)

    @property
    def now(self) -> datetime:
        return self.snap.now

    @property
    def rtj(self) -> ResilientTrainingJob:
        return self.snap.rtj

    def update(self, **fields: Any) -> None:
        self.status = self.status.model_copy(update=fields)

    def condition(
        self, type_: ConditionType, status: bool | None, reason: Reason | str, message: str
    ) -> None:
        conditions = set_condition(
            self.status.conditions,
            type_,
            status,
            reason,
            message,
            self.now,
            self.rtj.metadata.generation or None,
        )
        self.update(conditions=conditions)

    def event(self, warning: bool, reason: Reason | str, message: str) -> None:
        text = reason.value if isinstance(reason, Reason) else reason
        self.events.append(
            PostEvent("Warning" if warning else "Normal", text, event_message(message))
        )

    def requeue_in(self, seconds: float) -> None:
        seconds = max(seconds, 0.0)
        self.requeue = seconds if self.requeue is None else min(self.requeue, seconds)

    def replace_current(self, record: AttemptRecord) -> None:
        attempts = list(self.status.attempts)
        attempts[-1] = record
        self.update(attempts=attempts)

    def _record_derived(self, original: ResilientTrainingJobStatus) -> None:
        """With every status write (a plan that changes nothing writes nothing), what is
        derived from the rest: where the plan leaves the job in the recovery state machine,
        held to its table (a move no row lists raises under `strict()`, in tests, else is
        noted), and `workers`."""
        if self.status.to_json() == original.to_json():
            return
        source = recovery_phase(original, self.now)
        target = recovery_phase(self.status, self.now)
        if not allowed(source, target):
            if strict():
                check(source, target)
            self.notes.append(f"recovery phase {source.value} -> {target.value}: no table row")
        if self.status.recovery_phase is not target:
            self.update(recovery_phase=target)
        workers = worker_count(self.status, self.rtj.spec.replicas)
        if self.status.workers != workers:
            self.update(workers=workers)

    def build(self) -> Plan:
        if self.needs_store:  # incomplete: plan again with a fresh reading of the store
            return Plan((), None, True, (), "reading the checkpoint store")
        if self.needs_events:  # incomplete: plan again with the events about the failure
            return Plan((), None, False, (), "reading events", needs_events=True)
        if self.needs_queue:  # incomplete: plan again with the LocalQueue looked up
            return Plan(
                (), None, False, (), "looking up the LocalQueue", needs_queue=self.needs_queue
            )
        original = self.snap.rtj.status
        self._record_derived(original)
        generation = self.rtj.metadata.generation or None
        if generation is not None and self.status.observed_generation != generation:
            self.update(observed_generation=generation)
        actions: list[Action] = [*self.before]
        new = self.status.to_json()
        if new != original.to_json():
            # top-level status fields a newer operator wrote are kept, not nulled
            kept = {k: v for k, v in self.snap.stored_status.items() if k not in STATUS_KEYS}
            new = {**kept, **new}
            patch = merge_patch(self.snap.stored_status, new)
            actions.append(PatchStatus(new, patch, self.snap.resource_version))
        actions += self.after
        actions += self.events
        return Plan(
            tuple(actions),
            self.requeue,
            self.needs_store,
            tuple(self.metrics),
            "; ".join(self.notes),
        )


def worker_count(status: ResilientTrainingJobStatus, replicas: int) -> str | None:
    """`status.workers`: the current world size / spec.replicas (None before an attempt)."""
    if status.attempt == 0:
        return None
    return f"{status.world_size or replicas}/{replicas}"
