"""What the operator does next: a pure function of spec, status, classification and time.

One call returns one action, chosen by the recovery table's row for the job's phase and what
was observed (`rtj_operator.recovery.table`). The reconciler applies it, records it in
status, and calls again; so a failure is a `Restart` (quarantine the nodes it blames, if any
are not yet, record the failure, tear the old world down, wait out the backoff) or a `Fail`,
and later `StartAttempt` once the backoff has elapsed. Budgets:

- infrastructure and unknown failures spend `maxRestarts`: NodeLost, GPUFault (a suspect
  from a trainer's words too: restarted, only node-level evidence quarantines),
  NetworkFault, Evicted, ImagePullFailed (a registry or one node's runtime failed the pull)
  and PodsReadyTimeout (Kueue evicted a group that never became ready: not the job's code,
  but not free either, or a job that can never start would loop forever);
- user failures (OutOfMemory, UserError, ConfigError) spend `userErrorRestarts`;
- preemptions spend nothing unless `countPreemptions`, but restart with a backoff that grows
  with the preemptions so far, so a job preempted again and again does not churn;
- a pod that failed the platform's preflight quarantines its node and restarts at once,
  spending nothing while each failure quarantines a new node (the quarantine limit bounds
  it), then `maxRestarts`;
- the trainers refusing a suspect state (SilentDataCorruption) spend
  `silentDataCorruptionRestarts`, a budget of its own;
- a corrupt checkpoint marks the pinned step bad and restarts at once from an older step;
  it spends nothing, since each one removes a step from the candidates (if it cannot, it
  spends `maxRestarts` so that the loop still ends).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from rtj_operator.api.reasons import FailureCategory, FailureClass, Reason, RecoveryPhase
from rtj_operator.api.spec import FailurePolicy, ResilientTrainingJobSpec
from rtj_operator.api.status import ResilientTrainingJobStatus, RestartCounts
from rtj_operator.policy.classify import Classification
from rtj_operator.recovery.phase import recovery_phase
from rtj_operator.recovery.table import Fact, policy_for

_MAX_EXPONENT = 30


@dataclass(frozen=True)
class Wait:
    """Nothing to do now; look again at `until` (or on the next change)."""

    until: datetime | None
    reason: Reason
    message: str


@dataclass(frozen=True)
class StartAttempt:
    """Render and create attempt `attempt`, resuming from `resume_step` (None: newest valid)."""

    attempt: int
    resume_step: int | None
    reason: Reason
    message: str


@dataclass(frozen=True)
class Quarantine:
    """Taint these nodes (key/effect from the spec, value the job's name) and record them."""

    nodes: tuple[str, ...]
    taint_key: str
    taint_effect: str
    failure_class: FailureClass
    reason: Reason
    message: str


@dataclass(frozen=True)
class Restart:
    """End the failed attempt, tear down its JobSet, start the next one at `not_before`."""

    failed_attempt: int
    failure_class: FailureClass
    not_before: datetime
    backoff_seconds: float
    restarts: RestartCounts
    bad_steps: tuple[int, ...]
    reason: Reason
    message: str
    quarantine: Quarantine | None = None
    """Nodes to quarantine first, in the same plan (recorded before the restart)."""


@dataclass(frozen=True)
class Fail:
    """Stop for good: the budget for this kind of failure is spent."""

    failure_class: FailureClass
    reason: Reason
    message: str
    quarantine: Quarantine | None = None
    """Nodes to quarantine all the same: a bad node is bad for every job."""


Action = Wait | StartAttempt | Restart | Fail


def backoff_seconds(policy: FailurePolicy, failures_so_far: int) -> float:
    """initial * 2^failures, capped at max: fast first retry, no hot loop after many."""
    growth = 2 ** min(max(failures_so_far, 0), _MAX_EXPONENT)
    return float(min(policy.backoff.max_seconds, policy.backoff.initial_seconds * growth))


def resume_step(
    status: ResilientTrainingJobStatus, verified_steps: Iterable[int] = ()
) -> int | None:
    """Newest verified step not marked bad; None lets the init container pick (and verify)."""
    candidates = set(verified_steps)
    if status.last_verified_checkpoint is not None:
        candidates.add(status.last_verified_checkpoint.step)
    return max(candidates - set(status.bad_steps), default=None)


@dataclass(frozen=True)
class Facts:
    """What one decision reads: the job, its status, the failure found (if any), the time
    and the steps known to verify (newest wins)."""

    spec: ResilientTrainingJobSpec
    status: ResilientTrainingJobStatus
    found: Classification | None
    now: datetime
    verified_steps: tuple[int, ...]


def decide(
    spec: ResilientTrainingJobSpec,
    status: ResilientTrainingJobStatus,
    classification: Classification | None,
    now: datetime,
    *,
    verified_steps: Iterable[int] = (),
) -> Action:
    """The next whole-world action: the policy function that the recovery table names for
    the job's phase and what was observed. `verified_steps` are steps known to verify."""
    facts = Facts(spec, status, classification, now, tuple(verified_steps))
    phase = recovery_phase(status, now)
    if phase.terminal:
        return Wait(None, Reason.TERMINAL, f"job is {status.phase.value}")
    if phase is RecoveryPhase.SUSPENDED:
        return Wait(None, Reason.SUSPENDED, "job is suspended (spec.suspend)")
    policy = policy_for(phase, _fact(phase, classification), module=__name__)
    return _POLICIES[policy.rpartition(".")[2]](facts)


def _fact(phase: RecoveryPhase, found: Classification | None) -> Fact:
    if phase is RecoveryPhase.BACKING_OFF:
        return Fact.BACKOFF_ELAPSED
    if phase in (RecoveryPhase.NOT_STARTED, RecoveryPhase.STARTING):
        return Fact.ATTEMPT_DUE
    return Fact.NO_FAILURE if found is None else Fact.FAILURE


def start_first(facts: Facts) -> Action:
    """Attempt 1, from the newest verified step (or what the init container finds)."""
    return _start(facts.status, 1, facts.verified_steps, "first attempt")


def wait_backoff(facts: Facts) -> Action:
    """Until `nextAttemptAt`, wait (the old world is torn down meanwhile)."""
    return _after_backoff(facts.status, facts.now, facts.verified_steps)


def start_next(facts: Facts) -> Action:
    """The next attempt, once the backoff has elapsed."""
    return _after_backoff(facts.status, facts.now, facts.verified_steps)


def keep_running(facts: Facts) -> Action:
    return Wait(None, Reason.NO_FAILURE, f"attempt {facts.status.attempt} has no failed rank")


def on_failure(facts: Facts) -> Action:
    """Quarantine, restart or fail, by the failure's category and its budget."""
    assert facts.found is not None  # the table's FAILURE rows: a classification is present
    return _on_failure(facts.spec, facts.status, facts.found, facts.now)


_POLICIES: dict[str, Callable[[Facts], Action]] = {
    f.__name__: f for f in (start_first, wait_backoff, start_next, keep_running, on_failure)
}
"""The policy functions the recovery table names in this module, by name."""


def _start(
    status: ResilientTrainingJobStatus, attempt: int, verified: Iterable[int], why: str
) -> StartAttempt:
    step = resume_step(status, verified)
    where = f"step {step}" if step is not None else "the newest step that verifies (or scratch)"
    return StartAttempt(
        attempt, step, Reason.ATTEMPT_STARTED, f"{why}: attempt {attempt} from {where}"
    )


def _after_backoff(
    status: ResilientTrainingJobStatus, now: datetime, verified: Iterable[int]
) -> Action:
    until = status.next_attempt_at
    if until is not None and now < until:
        wait = (until - now).total_seconds()
        return Wait(until, Reason.BACKOFF, f"next attempt in {wait:.0f}s (backoff)")
    return _start(status, status.attempt + 1, verified, "backoff elapsed")


def _on_failure(
    spec: ResilientTrainingJobSpec,
    status: ResilientTrainingJobStatus,
    found: Classification,
    now: datetime,
) -> Action:
    category = found.category
    if category is FailureCategory.INFRASTRUCTURE and (pending := _unquarantined(status, found)):
        health, why = spec.node_health, f"{found.failure_class.value}: quarantining"
        first = Quarantine(
            pending, health.taint_key, health.taint_effect, found.failure_class,
            Reason.NODES_QUARANTINED, f"{why} {', '.join(pending)}",
        )  # fmt: skip
        if found.failure_class is FailureClass.PREFLIGHT_FAILED:
            return replace(_preflight_failure(status, found, now), quarantine=first)
        return replace(_infrastructure_failure(spec.failure_policy, status, found, now),
                       quarantine=first)  # fmt: skip
    if found.failure_class is FailureClass.SILENT_DATA_CORRUPTION:
        return _spend(_SUSPECT_STATE, spec.failure_policy, status, found, now)
    if category is FailureCategory.USER:
        return _spend(_USER, spec.failure_policy, status, found, now)
    if category is FailureCategory.PREEMPTION and not spec.failure_policy.count_preemptions:
        seen = status.restarts.preemption
        counts = status.restarts.model_copy(update={"preemption": seen + 1})
        delay = backoff_seconds(spec.failure_policy, seen)
        note = f"not counted (preemption {seen + 1})"
        return _restart(status, found, now, delay, counts, Reason.RESTART_SCHEDULED, note)
    if category is FailureCategory.CHECKPOINT and (bad := _newly_bad(status)) is not None:
        counts = status.restarts.model_copy(update={"checkpoint": status.restarts.checkpoint + 1})
        note = f"step {bad} marked bad; resuming from an older verified step"
        return _restart(status, found, now, 0.0, counts, Reason.CHECKPOINT_MARKED_BAD, note, bad)
    return _infrastructure_failure(spec.failure_policy, status, found, now)


def _preflight_failure(
    status: ResilientTrainingJobStatus, found: Classification, now: datetime
) -> Restart:
    """A pod failed the platform's preflight and its node is being quarantined: the job's
    state was never loaded there, so the next attempt starts at once and spends nothing."""
    counts = status.restarts.model_copy(update={"preflight": status.restarts.preflight + 1})
    note = f"not counted (preflight {counts.preflight}: the node is replaced)"
    return _restart(status, found, now, 0.0, counts, Reason.PREFLIGHT_NODE_REPLACED, note)


def _unquarantined(status: ResilientTrainingJobStatus, found: Classification) -> tuple[str, ...]:
    done = {q.node for q in status.quarantined_nodes}
    return tuple(n for n in found.nodes_to_quarantine if n not in done)


def _newly_bad(status: ResilientTrainingJobStatus) -> int | None:
    """The step the failed attempt pinned (its newest in-place restart's, if it had one),
    if marking it bad is progress."""
    current = status.current
    step = current.resumed_from_step if current is not None else None
    if current is not None and current.in_place_restarts:
        step = current.in_place_restarts[-1].resumed_from_step
    return step if step is not None and step not in status.bad_steps else None


@dataclass(frozen=True)
class _Budget:
    """A budget of its own: the RestartCounts field it counts in, the spec's limit, the
    words for it, and the reason when it is spent."""

    counter: str
    limit: Callable[[FailurePolicy], int]
    words: str
    spent: Reason


_USER = _Budget("user", lambda p: p.user_error_restarts, "user-error",
                Reason.USER_ERROR_BUDGET_EXHAUSTED)  # fmt: skip
_SUSPECT_STATE = _Budget(
    "silent_data_corruption", lambda p: p.silent_data_corruption_restarts,
    "silent-data-corruption", Reason.SDC_BUDGET_EXHAUSTED,
)  # fmt: skip
"""The trainers refused a suspect state (the next attempt keeps off the suspect pod's node,
`render.avoided_nodes`)."""


def _spend(
    budget: _Budget,
    policy: FailurePolicy,
    status: ResilientTrainingJobStatus,
    found: Classification,
    now: datetime,
) -> Action:
    used, limit = getattr(status.restarts, budget.counter), budget.limit(policy)
    if used >= limit:
        why = f"{_what(found)}; {budget.words} restarts spent ({used} of {limit})"
        return Fail(found.failure_class, budget.spent, why)
    counts = status.restarts.model_copy(update={budget.counter: used + 1})
    delay = backoff_seconds(policy, _failures(status))
    note = f"{budget.words} restart {used + 1} of {limit}"
    return _restart(status, found, now, delay, counts, Reason.RESTART_SCHEDULED, note)


def _infrastructure_failure(
    policy: FailurePolicy,
    status: ResilientTrainingJobStatus,
    found: Classification,
    now: datetime,
) -> Restart | Fail:
    used, budget = status.restarts.infrastructure, policy.max_restarts
    if used >= budget:
        why = f"{_what(found)}; restart budget spent ({used} of {budget})"
        return Fail(found.failure_class, Reason.RESTART_BUDGET_EXHAUSTED, why)
    update = {"infrastructure": used + 1}
    if found.category is FailureCategory.PREEMPTION:
        update["preemption"] = status.restarts.preemption + 1
    counts = status.restarts.model_copy(update=update)
    delay = backoff_seconds(policy, _failures(status))
    unknown = found.failure_class is FailureClass.UNKNOWN
    reason = Reason.UNKNOWN_FAILURE_FLAGGED if unknown else Reason.RESTART_SCHEDULED
    note = f"restart {used + 1} of {budget}" + (" (unknown cause: investigate)" if unknown else "")
    return _restart(status, found, now, delay, counts, reason, note)


def _failures(status: ResilientTrainingJobStatus) -> int:
    """Backoff exponent: counted restarts so far (preemptions and bad steps do not slow us)."""
    return status.restarts.infrastructure + status.restarts.user


def _restart(
    status: ResilientTrainingJobStatus,
    found: Classification,
    now: datetime,
    delay: float,
    counts: RestartCounts,
    reason: Reason,
    note: str,
    bad_step: int | None = None,
) -> Restart:
    bad = tuple(sorted({*status.bad_steps, *(() if bad_step is None else (bad_step,))}))
    return Restart(
        failed_attempt=status.attempt,
        failure_class=found.failure_class,
        not_before=now + timedelta(seconds=delay),
        backoff_seconds=delay,
        restarts=counts,
        bad_steps=bad,
        reason=reason,
        message=f"{_what(found)}; {note}; next attempt in {delay:.0f}s",
    )


def _what(found: Classification) -> str:
    first = found.first_failed
    if first is None:
        return found.failure_class.value
    where = f"rank {first.rank}" if first.rank is not None else f"pod {first.pod}"
    return f"{found.failure_class.value} on {where} (pod {first.pod}, node {first.node or '?'})"
