"""The PyTorch state layer: the only part of rtj_shim that imports torch.

``Checkpointer`` saves and restores the complete training state of a (distributed) job
through the verified commit protocol; ``ResumableSampler`` is a ``DistributedSampler``
whose position is part of that state; ``ElasticBatchSampler`` hands out optimizer steps of
a fixed global batch on whatever world size is training (the elastic path);
``init_process_group`` creates the default group with a rendezvous namespace of its own per
restart round (see its docstring);
``isolated_rng`` runs a block (an evaluation) without moving any global generator.
The Checkpointer's option groups (``IoOptions``, ``ResumeOptions``, ``EmergencyOptions``,
``IntegrityOptions``, ``FastTierConfig``) are here too.
"""

from __future__ import annotations

from rtj_shim.alignment import AlignmentCheck, MisalignedResume
from rtj_shim.checkpoint.run_config import ConfigMismatch
from rtj_shim.fast.fast_tier import FastTierConfig
from rtj_shim.integrity import AnomalyGuard, SuspectState
from rtj_shim.torch.checkpointer import (
    Checkpointer,
    CheckpointError,
    NonFiniteStateError,
    RestoreReport,
    SaveReport,
)
from rtj_shim.torch.elastic_batches import ElasticBatchSampler, MicroBatch, StepBatch
from rtj_shim.torch.options import EmergencyOptions, IntegrityOptions, IoOptions, ResumeOptions
from rtj_shim.torch.peek import CheckpointInfo
from rtj_shim.torch.plain import UnsafeStateError
from rtj_shim.torch.rendezvous import init_process_group
from rtj_shim.torch.rng import isolated as isolated_rng
from rtj_shim.torch.sampler import ResumableSampler
from rtj_shim.torch.validation import RestoreValidationError

__all__ = [
    "AlignmentCheck",
    "AnomalyGuard",
    "CheckpointError",
    "CheckpointInfo",
    "Checkpointer",
    "ConfigMismatch",
    "ElasticBatchSampler",
    "EmergencyOptions",
    "FastTierConfig",
    "IntegrityOptions",
    "IoOptions",
    "MicroBatch",
    "MisalignedResume",
    "NonFiniteStateError",
    "RestoreReport",
    "RestoreValidationError",
    "ResumableSampler",
    "ResumeOptions",
    "SaveReport",
    "StepBatch",
    "SuspectState",
    "UnsafeStateError",
    "init_process_group",
    "isolated_rng",
]
