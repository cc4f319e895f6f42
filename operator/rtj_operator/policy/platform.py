"""The platform team's node-health policy, and what a job may narrow of it.

Which node signals count, which XID codes quarantine, the taint key and the taint effect
are platform decisions: a taint changes what runs on a node that other tenants share. They
come from the operator's configuration (`--platform-config`, the chart's `nodeHealth`
values). A job's `spec.nodeHealth` can only narrow them:

- `taintKey`: always the platform's (a job cannot pick `kubernetes.io/hostname`, or a key
  another system acts on). A different value in the job is ignored.
- `taintEffect`: the job's when it is no stronger than the platform's
  (PreferNoSchedule < NoSchedule < NoExecute); never NoExecute unless the platform chose
  it (NoExecute evicts other tenants' pods and the node's DaemonSets).
- `xidCodes`, `xidConditionTypes`, `xidLabelKeys`: the job's list intersected with the
  platform's. A job that leaves them at the CRD defaults (or empty, for label keys) gets
  the platform's lists.
- `quarantineTtlSeconds`: the job's (it only lifts the job's own claims sooner).

Pure: `effective_node_health` is a function of two plain values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from rtj_operator.api.detection_spec import (
    DEFAULT_XID_CODES,
    DEFAULT_XID_CONDITION_TYPES,
    NodeHealth,
)
from rtj_operator.api.keys import DEFAULT_TAINT_KEY
from rtj_operator.policy.intervals import IntervalConfigError, IntervalPolicy
from rtj_operator.policy.preflight import PreflightConfigError, PreflightPolicy

TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]
EFFECT_STRENGTH: Mapping[str, int] = {"PreferNoSchedule": 0, "NoSchedule": 1, "NoExecute": 2}


class PlatformConfigError(ValueError):
    """The platform configuration is malformed; the message names the field."""


@dataclass(frozen=True)
class NodeHealthPolicy:
    """The platform team's node-health settings (operator configuration)."""

    taint_key: str = DEFAULT_TAINT_KEY
    taint_effect: TaintEffect = "NoSchedule"
    xid_codes: frozenset[int] = field(default_factory=lambda: frozenset(DEFAULT_XID_CODES))
    xid_condition_types: tuple[str, ...] = DEFAULT_XID_CONDITION_TYPES
    xid_label_keys: tuple[str, ...] = ()

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> NodeHealthPolicy:
        """From the `nodeHealth` block of the platform configuration (camelCase keys)."""
        known = {"taintKey", "taintEffect", "xidCodes", "xidConditionTypes", "xidLabelKeys"}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise PlatformConfigError(
                f"nodeHealth: unknown field(s) {', '.join(unknown)}; expected {sorted(known)}"
            )
        out = cls()
        key = raw.get("taintKey", out.taint_key)
        if not isinstance(key, str) or not key or key == "kubernetes.io/hostname":
            raise PlatformConfigError(f"nodeHealth.taintKey: expected a taint key, got {key!r}")
        effect = raw.get("taintEffect", out.taint_effect)
        if effect not in EFFECT_STRENGTH:
            raise PlatformConfigError(
                f"nodeHealth.taintEffect: expected one of {sorted(EFFECT_STRENGTH)}, got {effect!r}"
            )
        codes = raw.get("xidCodes", sorted(out.xid_codes))
        if not isinstance(codes, list) or not all(
            isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in codes
        ):
            raise PlatformConfigError(
                f"nodeHealth.xidCodes: expected non-negative integers, got {codes!r}"
            )
        return cls(
            taint_key=key,
            taint_effect=effect,
            xid_codes=frozenset(codes),
            xid_condition_types=_names(raw, "xidConditionTypes", out.xid_condition_types),
            xid_label_keys=_names(raw, "xidLabelKeys", out.xid_label_keys),
        )


def _names(raw: Mapping[str, Any], name: str, default: tuple[str, ...]) -> tuple[str, ...]:
    value = raw.get(name, list(default))
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise PlatformConfigError(f"nodeHealth.{name}: expected a list of names, got {value!r}")
    if "kubernetes.io/hostname" in value:
        raise PlatformConfigError(f"nodeHealth.{name}: kubernetes.io/hostname is no health signal")
    return tuple(value)


def effective_node_health(job: NodeHealth, platform: NodeHealthPolicy) -> NodeHealth:
    """The settings this job's failures are judged and quarantined with."""
    effect = job.taint_effect
    if EFFECT_STRENGTH[effect] > EFFECT_STRENGTH[platform.taint_effect]:
        effect = platform.taint_effect
    codes = (
        sorted(platform.xid_codes)
        if tuple(job.xid_codes) == DEFAULT_XID_CODES
        else sorted(set(job.xid_codes) & platform.xid_codes)
    )
    conditions = (
        list(platform.xid_condition_types)
        if tuple(job.xid_condition_types) == DEFAULT_XID_CONDITION_TYPES
        else [c for c in job.xid_condition_types if c in platform.xid_condition_types]
    )
    labels = (
        list(platform.xid_label_keys)
        if not job.xid_label_keys
        else [k for k in job.xid_label_keys if k in platform.xid_label_keys]
    )
    return job.model_copy(
        update={
            "taint_key": platform.taint_key,
            "taint_effect": effect,
            "xid_codes": codes,
            "xid_condition_types": conditions,
            "xid_label_keys": labels,
        }
    )


def load_platform_config(text: str) -> NodeHealthPolicy:
    """The platform configuration file (YAML or JSON): `{nodeHealth: {...}}`."""
    import yaml  # the file format only; the policy itself stays plain data

    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise PlatformConfigError(f"platform configuration: not YAML: {exc}") from exc
    if not isinstance(raw, Mapping):
        raise PlatformConfigError("platform configuration: expected a mapping at the top")
    unknown = sorted(set(raw) - {"nodeHealth", "preflight", "checkpointIntervals"})
    if unknown:
        raise PlatformConfigError(
            f"platform configuration: unknown field(s) {', '.join(unknown)}; expected "
            "nodeHealth, preflight, checkpointIntervals"
        )
    block = raw.get("nodeHealth") or {}
    if not isinstance(block, Mapping):
        raise PlatformConfigError("nodeHealth: expected a mapping")
    return NodeHealthPolicy.from_mapping(block)


def _block(text: str, name: str) -> Mapping[str, Any] | None:
    """The platform configuration's block `name` (None: the file has none)."""
    import yaml

    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise PlatformConfigError(f"platform configuration: not YAML: {exc}") from exc
    block = raw.get(name) if isinstance(raw, Mapping) else None
    if block is not None and not isinstance(block, Mapping):
        raise PlatformConfigError(f"{name}: expected a mapping")
    return block


def load_preflight_policy(text: str) -> PreflightPolicy:
    """The ``preflight`` block of the platform configuration (`policy.preflight`); the
    default policy when the file has none."""
    block = _block(text, "preflight")
    if block is None:
        return PreflightPolicy()
    try:
        return PreflightPolicy.from_mapping(block)
    except PreflightConfigError as exc:
        raise PlatformConfigError(str(exc)) from exc


def load_interval_policy(text: str) -> IntervalPolicy:
    """The ``checkpointIntervals`` block of the platform configuration (`policy.intervals`,
    for `plannedIntervalSeconds: auto`); the default policy when the file has none."""
    block = _block(text, "checkpointIntervals")
    if block is None:
        return IntervalPolicy()
    try:
        return IntervalPolicy.from_mapping(block)
    except IntervalConfigError as exc:
        raise PlatformConfigError(str(exc)) from exc
