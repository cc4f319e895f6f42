"""Deprecated spec fields: a Warning Event (reason DeprecatedField) for each one the job
sets, once per spec generation (the first plan of a generation, before `observedGeneration`
records it), and a line in the operator's log. The field keeps working meanwhile."""

from __future__ import annotations

from collections.abc import Sequence

from rtj_operator.api.reasons import Reason
from rtj_operator.reconcile.builder import PlanBuilder


def warn_deprecated(b: PlanBuilder, found: Sequence[str]) -> None:
    """`found`: the job's own spec's `deprecations()` (read before the platform's policy
    narrows the spec: what the user wrote, not what the plan runs with)."""
    generation = b.rtj.metadata.generation or None  # 0: not from the API server
    if not found or generation is None or b.snap.rtj.status.observed_generation == generation:
        return
    for message in found:
        b.event(True, Reason.DEPRECATED_FIELD, message)
        b.notes.append(message)
