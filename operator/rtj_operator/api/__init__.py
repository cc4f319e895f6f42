"""The ResilientTrainingJob API: pydantic models (the CRD's single source), names, reasons."""

from rtj_operator.api.attempts import AttemptRecord, FirstFailed
from rtj_operator.api.checkpoint_spec import Checkpoint, Retention
from rtj_operator.api.detection_spec import NodeHealth
from rtj_operator.api.reasons import (
    ConditionType,
    FailureCategory,
    FailureClass,
    Phase,
    Reason,
)
from rtj_operator.api.resource import ObjectMeta, ResilientTrainingJob
from rtj_operator.api.spec import Backoff, FailurePolicy, Provenance, ResilientTrainingJobSpec
from rtj_operator.api.status import (
    Condition,
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
