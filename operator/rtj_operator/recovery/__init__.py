"""Recovery as one state machine: `phase` derives where a job stands from its status,
`table` lists every move between phases with the policy that decides it and the reconcile
function that carries it out. Pure: no cluster, metrics or storage I/O."""

from rtj_operator.recovery.phase import recovery_phase
from rtj_operator.recovery.table import (
    TRANSITIONS,
    Fact,
    Transition,
    UnlistedTransition,
    allowed,
    check,
    markdown,
    policy_for,
    ways_out,
)

__all__ = [
    "TRANSITIONS",
    "Fact",
    "Transition",
    "UnlistedTransition",
    "allowed",
    "check",
    "markdown",
    "policy_for",
    "recovery_phase",
    "ways_out",
]
