"""`spec.elastic`: train on fewer pods when a replaced pod cannot be had, and grow back
(issue 45). Part of the spec's models (`rtj_operator.api.spec`); the decisions are
`rtj_operator.policy.elastic`'s.
"""

from __future__ import annotations

from pydantic import Field

from rtj_operator.api.base import ApiModel, cel
from rtj_operator.api.keys import MAX_REPLICAS

DEFAULT_WAIT_FOR_REPLACEMENT_SECONDS = 30

ELASTIC_NEEDS_REPLACING = (
    "spec.elastic.minReplicas below spec.replicas needs spec.recovery.inPlace: true and "
    "spec.recovery.inPlaceMaxReplacedPods >= 1: the survivors of a replaced pod restart in "
    "place as a smaller world"
)
ELASTIC_MIN_ABOVE_REPLICAS = "spec.elastic.minReplicas must be at most spec.replicas"
ELASTIC_WAIT_PAST_DEADLINE = (
    "spec.elastic.waitForReplacementSeconds must be less than "
    "spec.recovery.inPlaceDeadlineSeconds: the shrink happens inside the in-place restart, "
    "which falls back to re-creating the whole world at its deadline"
)

_ON = (
    "has(self.elastic) && has(self.elastic.minReplicas) && self.elastic.minReplicas < self.replicas"
)
_IN_PLACE = "has(self.recovery) && has(self.recovery.inPlace) && self.recovery.inPlace"
_REPLACING = (
    "(!has(self.recovery.inPlaceMaxReplacedPods) || self.recovery.inPlaceMaxReplacedPods >= 1)"
)
_WAIT = (
    f"(has(self.elastic.waitForReplacementSeconds) ? self.elastic.waitForReplacementSeconds "
    f": {DEFAULT_WAIT_FOR_REPLACEMENT_SECONDS})"
)
_DEADLINE = (
    "(has(self.recovery.inPlaceDeadlineSeconds) ? self.recovery.inPlaceDeadlineSeconds : 60)"
)

ELASTIC_RULES = (
    cel(
        "!has(self.elastic) || !has(self.elastic.minReplicas) || "
        "self.elastic.minReplicas <= self.replicas",
        ELASTIC_MIN_ABOVE_REPLICAS,
        ".elastic.minReplicas",
    ),
    cel(f"!({_ON}) || ({_IN_PLACE} && {_REPLACING})", ELASTIC_NEEDS_REPLACING, ".elastic"),
    cel(
        f"!({_ON}) || !({_IN_PLACE}) || {_WAIT} < {_DEADLINE}",
        ELASTIC_WAIT_PAST_DEADLINE,
        ".elastic.waitForReplacementSeconds",
    ),
)
"""Rules across spec fields (the matching pydantic validator is on the spec model)."""


class Elastic(ApiModel):
    """Train on fewer pods when a replaced pod cannot be had, and grow back when it can."""

    min_replicas: int | None = Field(
        default=None,
        ge=1,
        le=MAX_REPLICAS,
        description="The fewest pods the job trains on. Unset (or spec.replicas): not "
        "elastic, a replaced pod is waited for as before. Below spec.replicas: when a pod "
        "replaced in an in-place restart (a GPU fault, a lost node) has no replacement "
        "running within waitForReplacementSeconds (unschedulable, not admitted, no spare), "
        "the other pods restart in place as a smaller world (ranks renumbered in their "
        "order, the newest durable step every survivor reads). The training script must "
        "keep its global batch and sample order across world sizes "
        "(rtj_shim.torch.ElasticBatchSampler); tensor- or pipeline-parallel layouts cannot "
        "lose a pod this way. Needs spec.recovery.inPlace with inPlaceMaxReplacedPods >= 1.",
    )
    wait_for_replacement_seconds: int = Field(
        default=DEFAULT_WAIT_FOR_REPLACEMENT_SECONDS,
        ge=0,
        le=3600,
        description="How long an in-place restart waits for a replaced pod's replacement "
        "before the others go on without it; less than spec.recovery.inPlaceDeadlineSeconds.",
    )
    grow_back: bool = Field(
        default=True,
        description="When pods for the missing ranks run again (capacity returned), restart "
        "in place as the whole world at once, from the newest durable step.",
    )

    def minimum(self, replicas: int) -> int:
        return replicas if self.min_replicas is None else min(self.min_replicas, replicas)
