"""The recovery state machine's transition table: in which phase, on which fact, the job
moves to which phase, decided by which pure policy function and carried out by which
reconcile function.

The table is the specification the plan is held to: every status write checks that the
phase it leaves and the phase it enters are a row of it (`check`), so a new recovery
behaviour is a new row here before it can run, and docs/DESIGN.md prints the table from
this module (`markdown`; a test fails if the two drift).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from rtj_operator.api.reasons import RecoveryPhase as P


class Fact(str, Enum):
    """What a reconcile observed that moves a job on."""

    ATTEMPT_DUE = "AttemptDue"
    """No attempt runs and none waits out a backoff: the next one may start."""
    BACKOFF_ELAPSED = "BackoffElapsed"
    """The clock passed `status.nextAttemptAt`."""
    NO_FAILURE = "NoFailure"
    """The attempt's pods, nodes, events and progress show no failed rank."""
    FAILURE = "Failure"
    """A classified failure: a failed rank, a hang, a supervised exit, a lost JobSet."""
    WORLD_SUCCEEDED = "WorldSucceeded"
    """The attempt's JobSet completed (or every rank finished and only idle pods remain)."""
    TRAINERS_STOPPED = "TrainersStopped"
    """Every pod's supervisor reported the old generation stopped (the barrier)."""
    TRAINERS_STARTED = "TrainersStarted"
    """Every pod's supervisor reported the new generation started."""
    IN_PLACE_OVERDUE = "InPlaceOverdue"
    """spec.recovery.inPlaceDeadlineSeconds passed with a pod short of the stage's goal."""
    SUSPEND = "Suspend"
    """spec.suspend became true."""
    RESUME = "Resume"
    """spec.suspend became false again."""
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    """spec.activeDeadlineSeconds passed since the job was first admitted."""
    REPLACEMENT_MISSING = "ReplacementMissing"
    """Every other pod stopped, and a replaced pod's replacement is not there (spec.elastic)."""
    CAPACITY_RETURNED = "CapacityReturned"
    """A shrunk world's missing ranks have pods running and held again (spec.elastic)."""


@dataclass(frozen=True)
class Transition:
    """One row: from any of `sources` on `fact`, to one of `targets` (none: it stays in
    its phase). `policy`: the pure
    function that decides (dotted path; None where the fact alone decides); `carried_out_by`:
    the reconcile function that applies it."""

    sources: tuple[P, ...]
    fact: Fact
    targets: tuple[P, ...]
    policy: str | None
    carried_out_by: str
    note: str


_ACTIVE = (P.NOT_STARTED, P.RUNNING, P.STOPPING_IN_PLACE, P.STARTING_IN_PLACE, P.BACKING_OFF,
           P.STARTING)  # fmt: skip
_IN_PLACE = (P.STOPPING_IN_PLACE, P.STARTING_IN_PLACE)
_DECIDE = "rtj_operator.policy.decide"
_RECONCILE = "rtj_operator.reconcile"

TRANSITIONS: tuple[Transition, ...] = (
    Transition((P.NOT_STARTED,), Fact.ATTEMPT_DUE, (P.RUNNING,), f"{_DECIDE}.start_first",
               f"{_RECONCILE}.admit.plan_next_attempt",
               "create attempt 1's JobSet, pinned to the newest verified step"),
    Transition((P.BACKING_OFF,), Fact.BACKOFF_ELAPSED, (P.STARTING,), f"{_DECIDE}.wait_backoff",
               "rtj_operator.recovery.phase.recovery_phase",
               "the clock alone; meanwhile the old world is torn down"),
    Transition((P.STARTING,), Fact.ATTEMPT_DUE, (P.RUNNING,), f"{_DECIDE}.start_next",
               f"{_RECONCILE}.admit.plan_next_attempt",
               "once no pod or JobSet of an older attempt remains and the store is read"),
    Transition((P.RUNNING, *_IN_PLACE), Fact.NO_FAILURE, (), f"{_DECIDE}.keep_running",
               f"{_RECONCILE}.healthy_attempt.follow_admission",
               "admission, progress, checkpoint age (in place: waiting at the stage's barrier)"),
    Transition((P.RUNNING,), Fact.FAILURE, (P.STOPPING_IN_PLACE,),
               "rtj_operator.policy.in_place.choose", f"{_RECONCILE}.in_place.begin",
               "no node to blame, or a spare to take a replaced pod's rank: restart the "
               "trainers in the same pods (the restart is paid for here); a pod that failed "
               "first again soon after its restart is re-created, its node judged by the "
               "preflight"),
    Transition((P.RUNNING, *_IN_PLACE), Fact.FAILURE, (P.BACKING_OFF, P.STARTING, P.FAILED),
               f"{_DECIDE}.on_failure", f"{_RECONCILE}.failure.on_failure",
               "quarantine the nodes it blames, then restart the whole world after the "
               "backoff (none for a bad step), or fail when the failure's budget is spent"),
    Transition((P.RUNNING,), Fact.WORLD_SUCCEEDED, (P.SUCCEEDED,), None,
               f"{_RECONCILE}.healthy_attempt.succeed", "every rank finished"),
    Transition((P.STOPPING_IN_PLACE,), Fact.REPLACEMENT_MISSING, (),
               "rtj_operator.policy.elastic.on_missing", f"{_RECONCILE}.elastic.shrink",
               "wait waitForReplacementSeconds, then the pods that stopped are the world "
               "(ranks renumbered, never below minReplicas); the barrier then holds for them"),
    Transition((P.RUNNING,), Fact.CAPACITY_RETURNED, (P.STOPPING_IN_PLACE,),
               "rtj_operator.policy.elastic.on_shrunk", f"{_RECONCILE}.elastic.grow",
               "a new generation as the larger world (whole: every pod at its own rank); "
               "no budget spent"),
    Transition((P.STOPPING_IN_PLACE,), Fact.TRAINERS_STOPPED, (P.STARTING_IN_PLACE,),
               "rtj_operator.policy.fast_tier.pin", f"{_RECONCILE}.in_place.follow",
               "pin the durable step and the fast-tier step every pod holds"),
    Transition((P.STARTING_IN_PLACE,), Fact.TRAINERS_STARTED, (P.RUNNING,), None,
               f"{_RECONCILE}.in_place.follow", "the restart is recorded as Running"),
    Transition(_IN_PLACE, Fact.IN_PLACE_OVERDUE, (P.STARTING,), None,
               f"{_RECONCILE}.in_place.follow",
               "fall back: re-create the whole world now (the restart was paid for)"),
    Transition(_ACTIVE, Fact.SUSPEND, (P.SUSPENDED,), None, f"{_RECONCILE}.lifecycle.hold",
               "the world is torn down; no budget is spent"),
    Transition((P.SUSPENDED,), Fact.RESUME, (P.NOT_STARTED, P.STARTING, P.RUNNING), None,
               f"{_RECONCILE}.lifecycle.hold",
               "no backoff: the next attempt starts in the same plan (Running) unless the old "
               "world or the store holds it"),
    Transition(_ACTIVE, Fact.DEADLINE_EXCEEDED, (P.FAILED,), None,
               f"{_RECONCILE}.lifecycle.hold", "spec.activeDeadlineSeconds"),
)  # fmt: skip


def strict() -> bool:
    """Whether a move no row lists raises (RTJ_STRICT_RECOVERY_TABLE=1: the test suite sets
    it, for the operators it starts too); otherwise the plan goes on and says so in its
    notes: a job is not held for the table's omission."""
    return os.environ.get("RTJ_STRICT_RECOVERY_TABLE") == "1"


class UnlistedTransition(RuntimeError):
    """A plan moved a job between two phases that no row of the table joins."""


def allowed(source: P, target: P) -> bool:
    """Whether some row moves a job from `source` to `target` (staying is always allowed)."""
    return source is target or any(source in t.sources and target in t.targets for t in TRANSITIONS)


def check(source: P, target: P) -> None:
    if not allowed(source, target):
        raise UnlistedTransition(
            f"recovery phase {source.value} -> {target.value} is no row of "
            "rtj_operator.recovery.table.TRANSITIONS"
        )


def policy_for(source: P, fact: Fact, *, module: str = "") -> str:
    """The policy function the table names for `fact` in `source`, of those in `module`."""
    for t in TRANSITIONS:
        if t.policy is None or (module and not t.policy.startswith(f"{module}.")):
            continue
        if source in t.sources and t.fact is fact:
            return t.policy
    raise UnlistedTransition(f"no policy row in {module} for {fact.value} in {source.value}")


def ways_out(phase: P) -> set[P]:
    """The other phases a job in `phase` can move to."""
    return {target for t in TRANSITIONS if phase in t.sources for target in t.targets} - {phase}


def markdown(rows: Iterable[Transition] = TRANSITIONS) -> str:
    """The table as docs/DESIGN.md prints it."""
    lines = [
        "| from | on | to | decided by | carried out by |",
        "| --- | --- | --- | --- | --- |",
    ]
    for t in rows:
        policy = f"`{_short(t.policy)}`" if t.policy else "the fact"
        lines.append(
            f"| {', '.join(p.value for p in t.sources)} | {t.fact.value} | "
            f"{', '.join(p.value for p in t.targets) or '(stays)'} | {policy} | "
            f"`{_short(t.carried_out_by)}`: {t.note} |"
        )
    return "\n".join(lines) + "\n"


def _short(path: str) -> str:
    return path.removeprefix("rtj_operator.")
