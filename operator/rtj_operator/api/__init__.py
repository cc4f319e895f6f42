"""The ResilientTrainingJob API: pydantic models (the CRD's single source), names, reasons."""

from rtj_operator.api.reasons import (
    ConditionType,
    FailureCategory,
    FailureClass,
    Phase,
    Reason,
)
from rtj_operator.api.resource import ObjectMeta, ResilientTrainingJob
from rtj_operator.api.spec import (
    Backoff,
    Checkpoint,
    FailurePolicy,
    NodeHealth,
    Provenance,
    ResilientTrainingJobSpec,
    Retention,
)
from rtj_operator.api.status import (
    AttemptRecord,
    Condition,
    FirstFailed,
    QuarantinedNode,
    ResilientTrainingJobStatus,
    RestartCounts,
    VerifiedCheckpoint,
)

__all__ = [
    "AttemptRecord",
    "Backoff",
    "Checkpoint",
    "Condition",
    "ConditionType",
    "FailureCategory",
    "FailureClass",
    "FailurePolicy",
    "FirstFailed",
    "NodeHealth",
    "ObjectMeta",
    "Phase",
    "Provenance",
    "QuarantinedNode",
    "Reason",
    "ResilientTrainingJob",
    "ResilientTrainingJobSpec",
    "ResilientTrainingJobStatus",
    "RestartCounts",
    "Retention",
    "VerifiedCheckpoint",
]
