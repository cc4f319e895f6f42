"""Pure decisions: classify a failure, decide the next action, render the next attempt.

Everything here is a plain function over plain data (Kubernetes JSON, the API models and
`now`): no cluster access, no clocks, no logging. Handlers read the world, call these, and
apply what they return.
"""

from rtj_operator.policy.classify import Classification, classify_failure
from rtj_operator.policy.decide import (
    Action,
    Fail,
    Quarantine,
    Restart,
    StartAttempt,
    Wait,
    backoff_seconds,
    decide,
    resume_step,
)
from rtj_operator.policy.render import quarantine_taint, render_jobset

__all__ = [
    "Action",
    "Classification",
    "Fail",
    "Quarantine",
    "Restart",
    "StartAttempt",
    "Wait",
    "backoff_seconds",
    "classify_failure",
    "decide",
    "quarantine_taint",
    "render_jobset",
    "resume_step",
]
