"""How a ResilientTrainingJob's failures are detected: `spec.nodeHealth` (GPU faults on
nodes, quarantine) and `spec.progress` (hangs and stragglers from the ranks' progress).

Part of the spec's models (`rtj_operator.api.spec`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from rtj_operator.api.base import ApiModel
from rtj_operator.api.keys import DEFAULT_PROGRESS_PORT, DEFAULT_TAINT_KEY

DEFAULT_XID_CODES = (
    46, 48, 54, 62, 64, 74, 79, 95, 109, 110, 119, 120, 136, 140, 143,
    144, 145, 146, 147, 148, 149, 150, 151, 155, 156, 158,
)  # fmt: skip
"""NVIDIA XIDs whose catalog immediate action takes the GPU out of service (reset the GPU,
restart the machine or VM, the XID 48 / NVLink workflows, check the mechanicals): the XID
catalog's list, `rtj_operator.policy.xid.catalog_quarantine_codes()`. Application XIDs
(13, 31, 43, 94, ...) and informational ones (63, 92) never quarantine."""

TAINT_KEY_DEPRECATED = (
    "spec.nodeHealth.taintKey is deprecated and ignored: quarantine taints use the platform's "
    "key (the operator's nodeHealth.taintKey); remove it from the job"
)

DEFAULT_XID_CONDITION_TYPES = ("SysLogsXIDError", "GpuXidError")
"""Node condition types NVSentinel's syslog monitor sets (current and older name)."""


class NodeHealth(ApiModel):
    """How GPU faults are recognized on nodes, and how a bad node is quarantined."""

    taint_key: str = Field(
        default=DEFAULT_TAINT_KEY,
        min_length=1,
        max_length=316,
        description="Deprecated and ignored: quarantine taints use the platform's key (the "
        "operator's nodeHealth.taintKey). A job that sets another key than this default gets "
        "a Warning Event (reason DeprecatedField). Accepted for one more release.",
    )
    taint_effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = Field(
        default="NoSchedule",
        description="Used only when no stronger than the platform's nodeHealth.taintEffect.",
    )
    quarantine_ttl_seconds: int | None = Field(
        default=None,
        ge=60,
        le=30 * 86400,
        description="Opt-in: remove this job's taint from a quarantined node this many seconds "
        "after it was set (unset: the node stays tainted until an administrator acts).",
    )
    xid_codes: list[Annotated[int, Field(ge=0)]] = Field(
        default_factory=lambda: list(DEFAULT_XID_CODES),
        max_length=256,
        description="GPU XID codes that quarantine a node: narrows the platform's list "
        "(operator nodeHealth.xidCodes); left at the default, the platform's list applies.",
        json_schema_extra={"default": list(DEFAULT_XID_CODES)},
    )
    xid_label_keys: list[str] = Field(
        default_factory=list,
        max_length=32,
        description="Node label keys whose value lists XID codes: narrows the platform's "
        "nodeHealth.xidLabelKeys (empty: the platform's).",
    )
    xid_condition_types: list[str] = Field(
        default_factory=lambda: list(DEFAULT_XID_CONDITION_TYPES),
        max_length=32,
        description="Node condition types whose message carries XID codes (NVSentinel "
        "SysLogsXIDError): narrows the platform's nodeHealth.xidConditionTypes.",
        json_schema_extra={"default": list(DEFAULT_XID_CONDITION_TYPES)},
    )


class Stragglers(ApiModel):
    """Ranks slower than the rest: busy time per step above the others' median / ratio for
    `windows` consecutive polls."""

    action: Literal["Report", "ReplaceNode"] = Field(
        default="Report",
        description="Report: a condition, an Event and a metric. ReplaceNode: also keep the "
        "next attempt off the straggler's node (after the next restart, whatever its cause; "
        "a straggler never restarts the job by itself).",
    )
    ratio: float = Field(
        default=0.7,
        ge=0.05,
        le=0.99,
        description="A rank is slow when its busy time per step exceeds the median of the "
        "other ranks' divided by this (0.7: more than ~1.43x).",
    )
    windows: int = Field(
        default=3, ge=1, le=100, description="Consecutive slow polls before a rank is reported."
    )


class ProgressMonitoring(ApiModel):
    """Rank progress: each worker pod gets a progress server (a native sidecar) that the
    operator polls; a rank that stops making progress is a Hang, a slow one a straggler."""

    enabled: bool = Field(
        default=True,
        description="Render the progress sidecar and poll it (false: no hang or straggler "
        "detection; failures are seen only when a pod ends).",
    )
    port: int = Field(
        default=DEFAULT_PROGRESS_PORT,
        ge=1024,
        le=65535,
        description="The sidecar's port (change it for hostNetwork pods that share a node).",
    )
    hang_timeout_seconds: int | None = Field(
        default=None,
        ge=10,
        le=86400,
        description="A rank with no progress in its section for this long is a Hang. Unset: "
        "automatic, timeoutFactor x the observed step time (never below 30 s nor the longest "
        "recent step), saves timeoutFactor x the longest save observed.",
    )
    timeout_factor: float = Field(
        default=5.0, ge=2.0, le=100.0, description="Safety factor of the automatic timeout."
    )
    startup_grace_seconds: int = Field(
        default=600,
        ge=0,
        le=86400,
        description="Allowance before a rank's first steps (start-up, compilation, restore, "
        "the first save) in automatic mode; with hangTimeoutSeconds the larger of the two.",
    )
    stragglers: Stragglers = Field(default_factory=Stragglers, json_schema_extra={"default": {}})


class Preflight(ApiModel):
    """The platform's check before a new world trains (`rtj-shim preflight`)."""

    enabled: bool = Field(
        default=True,
        description="Run the platform's preflight in every worker pod before the job's state "
        "is loaded: a ring transfer across the new world (a pod slower than the median by "
        "bandwidthFactor both ways fails) and the platform's node-local check (dcgmi diag "
        "-r 1 by default). A pod that fails has its node quarantined (PreflightFailed) and "
        "the attempt replaced without spending maxRestarts. Rendered only where the platform "
        "has an image for it (the operator's resolver image by default).",
    )
    timeout_seconds: int = Field(
        default=120,
        ge=10,
        le=3600,
        description="Seconds for the whole check (a world that does not gather within it "
        "blames nobody).",
    )
    bandwidth_factor: float = Field(
        default=4.0,
        ge=1.5,
        le=1000.0,
        description="How many times slower than the world's median, sending and receiving "
        "both, a pod's link may be before it fails (judged in worlds of 4 pods or more).",
    )
