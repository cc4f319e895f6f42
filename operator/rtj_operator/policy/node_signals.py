"""What a pod's node says: node-level evidence, the only evidence that quarantines. Pure.

Understood out of the box (docs/operations.md, "Node signals"):

- the control plane: Ready (Unknown with "Kubelet stopped posting node status.", or False),
  the unreachable/not-ready taints, the node gone, NodeNotReady/RemovingNode events;
- NVIDIA NVSentinel: conditions `SysLogsXIDError` (XID-coded), `SysLogsGPUFallenOff`,
  `SysLogsSXIDError` and the DCGM watches `Gpu<Watch>Watch` (status True = a fatal fault;
  non-fatal findings are only Events, notes here where `node_event_sources` lets them count);
- the EKS node monitoring agent: `AcceleratedHardwareReady` (healthy when True; False with
  reason `NvidiaXID<n>Error`, `NvidiaDoubleBitError`, ... is its fatal verdict; its warnings
  are Events, notes where they count);
- node-problem-detector: conditions the platform names in `xidConditionTypes` (a custom
  kernel-log rule matching `NVRM: Xid`), and the kernel monitor's `OOMKilling` Event;
- the NVIDIA device plugin through the kubelet: `allocatedResourcesStatus` Unhealthy
  (KEP-4680), and labels the platform names in `xidLabelKeys`.

An XID found in any of them quarantines only if it is in the job's `xidCodes` (default:
the catalog's service XIDs, `policy.xid`); other XIDs are notes. Events about a node reach
this module only from the node's own reporters (`node_event_sources`, applied by the
classifier to every Event it is given).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from rtj_operator.api.detection_spec import NodeHealth
from rtj_operator.api.reasons import FailureClass
from rtj_operator.policy import xid
from rtj_operator.policy.findings import CONTROL_PLANE, NODE_AGENT, Finding, iso, who
from rtj_operator.policy.observed import ConditionView, EventView, NodeView, PodView

C = FailureClass
NODE_MONITOR_GRACE = timedelta(seconds=50)
"""kube-controller-manager `--node-monitor-grace-period` (50 s in v1.35, 40 s before): a
node is declared NotReady/Unknown this long after its kubelet's last heartbeat, so its
peers' transport errors come *before* the declaration and must still count as consequences."""

SHUTTING_DOWN = "node is shutting down"  # kubelet Ready=False message (graceful shutdown)
_LIFECYCLE_EVENTS = frozenset({"NodeNotReady", "RemovingNode", "DeletingNode", "NodeShutdown"})
_NVSENTINEL_GPU = frozenset({"SysLogsGPUFallenOff", "SysLogsSXIDError"})
_NVSENTINEL_WATCH = re.compile(r"^Gpu\w+Watch$")
_EKS_ACCELERATED = "AcceleratedHardwareReady"
_EKS_XID_REASON = re.compile(r"^NvidiaXID\d+Error$")
_NPD_OOM = "OOMKilling"
READ_EVENT_REASONS = frozenset({*_LIFECYCLE_EVENTS, _NPD_OOM})


@dataclass(frozen=True)
class NodeContext:
    health: NodeHealth
    nodes: Mapping[str, NodeView] | None
    events: Sequence[EventView]

    @property
    def quarantine_codes(self) -> frozenset[int]:
        return frozenset(self.health.xid_codes)

    def node(self, name: str | None) -> NodeView | None:
        return self.nodes.get(name) if self.nodes is not None and name else None


def loss_onset(node: NodeView) -> datetime | None:
    """When the node most likely died: its last heartbeat, but no earlier than the grace
    period before it was declared (a heartbeat may be minutes old: kubelets post status
    every `nodeStatusReportFrequency`, 5 min, and renew a Lease in between)."""
    declared = node.declared_lost_at
    if declared is None:
        return None
    ready = node.ready
    if ready is not None and ready.status == "False":
        return declared  # the kubelet itself reported NotReady: it was alive to say so
    earliest = declared - NODE_MONITOR_GRACE
    beat = node.last_heartbeat
    return max(beat, earliest) if beat is not None and beat <= declared else earliest


def lost_node(pod: PodView, ctx: NodeContext, planned_shutdown: bool) -> list[Finding]:
    """The pod's node is gone or not ready: the pod failed with it."""
    if pod.node is None or ctx.nodes is None:
        return []
    node = ctx.nodes.get(pod.node)
    if node is None:
        return [
            Finding(
                C.NODE_LOST,
                f"{who(pod)}: node {pod.node} no longer exists",
                source=CONTROL_PLANE,
                signal="node absent from the node list",
            )
        ]
    if not node.lost:
        return []
    ready = node.ready
    state = f"Ready={ready.status} ({ready.reason}: {ready.message})" if ready else "unreachable"
    shutdown = planned_shutdown or (ready is not None and SHUTTING_DOWN in ready.message)
    onset = loss_onset(node)
    beat = f", last heartbeat {iso(node.last_heartbeat)}" if node.last_heartbeat else ""
    return [
        Finding(
            C.NODE_LOST,
            f"{who(pod)}: node {pod.node} {state} since {iso(node.declared_lost_at)}{beat}; "
            f"lost at about {iso(onset)}" + ("; a planned shutdown" if shutdown else ""),
            at=onset,
            quarantine=None if shutdown else pod.node,
            source=CONTROL_PLANE,
            signal=f"node {pod.node} condition Ready={ready.status if ready else '?'}",
        )
    ]


# --- agent conditions, labels, devices, events --------------------------------------------


def _xid_verdict(
    pod: PodView,
    codes: set[int],
    seen: str,
    at: datetime | None,
    ctx: NodeContext,
    signal: str,
    fatal_without_code: bool = False,
) -> Finding:
    bad = codes & ctx.quarantine_codes
    where = f"node {pod.node} {seen}"
    if bad:
        return Finding(
            C.GPU_FAULT,
            f"{where}: XID {xid.describe(bad)}",
            at=at,
            quarantine=pod.node,
            source=NODE_AGENT,
            signal=signal,
        )
    if fatal_without_code and not codes:
        return Finding(
            C.GPU_FAULT,
            f"{where}: the agent's fatal verdict",
            at=at,
            quarantine=pod.node,
            source=NODE_AGENT,
            signal=signal,
        )
    listed = f"XID {xid.describe(codes)}" if codes else "no XID code"
    return Finding(
        None,
        f"note: {where} ({listed}: not an XID that quarantines)",
        source=NODE_AGENT,
        signal=signal,
    )


def _condition(pod: PodView, cond: ConditionView, ctx: NodeContext) -> Finding | None:
    seen = f"condition {cond.type}={cond.status} ({cond.reason}): {cond.message}"
    signal = f"node {pod.node} condition {cond.type}"
    text = f"{cond.reason} {cond.message}"
    if cond.type == _EKS_ACCELERATED:  # healthy when True
        if cond.status != "False":
            return None
        verdict = not _EKS_XID_REASON.match(cond.reason)
        return _xid_verdict(pod, xid.xid_codes(text), seen, cond.since, ctx, signal, verdict)
    if cond.status != "True":
        return None
    if cond.type in ctx.health.xid_condition_types:
        return _xid_verdict(pod, xid.xid_codes(cond.message), seen, cond.since, ctx, signal)
    if cond.type in _NVSENTINEL_GPU or _NVSENTINEL_WATCH.match(cond.type):
        return Finding(
            C.GPU_FAULT,
            f"node {pod.node} {seen}",
            at=cond.since,
            quarantine=pod.node,
            source=NODE_AGENT,
            signal=signal,
        )
    return None


def _conditions(pod: PodView, node: NodeView, ctx: NodeContext) -> list[Finding]:
    return [f for cond in node.conditions if (f := _condition(pod, cond, ctx))]


def _labels(pod: PodView, node: NodeView, ctx: NodeContext) -> list[Finding]:
    found = []
    for key in ctx.health.xid_label_keys:
        value = node.labels.get(key)
        if value:
            codes = {int(c) for c in re.findall(r"\d+", value)}
            found.append(
                _xid_verdict(
                    pod, codes, f"label {key}={value}", None, ctx, f"node {pod.node} label {key}"
                )
            )
    return found


def devices(pod: PodView) -> list[Finding]:
    """Allocated devices the kubelet reports Unhealthy (KEP-4680, from the device plugin)."""
    return [
        Finding(
            C.GPU_FAULT,
            f"{who(pod)}: {d.resource} device {d.device} Unhealthy"
            + (f": {d.message}" if d.message else ""),
            container=d.container,
            quarantine=pod.node,
            source=NODE_AGENT,
            signal=f"pod {pod.name} allocatedResourcesStatus",
        )
        for d in pod.unhealthy_devices
    ]


def _node_events(pod: PodView, ctx: NodeContext) -> list[Finding]:
    """Events about the pod's node since the pod was scheduled. Lifecycle events count only
    where the node object cannot be read (its Ready condition and heartbeat say more)."""
    found: list[Finding] = []
    after = pod.scheduled_at
    node_known = ctx.node(pod.node) is not None
    for e in ctx.events:
        if e.kind != "Node" or e.name != pod.node or (after and e.at and e.at < after):
            continue
        line = f"node {pod.node}: event {e.reason} at {iso(e.at)}: {e.message}"
        signal = f"node {pod.node} event {e.reason}"
        if e.reason in _LIFECYCLE_EVENTS:
            if node_known:
                continue
            at = e.at - NODE_MONITOR_GRACE if e.at and e.reason == "NodeNotReady" else e.at
            found.append(Finding(C.NODE_LOST, line, at, source=CONTROL_PLANE, signal=signal))
        elif e.reason == _NPD_OOM:
            found.append(
                Finding(
                    C.OUT_OF_MEMORY,
                    f"{line} (the kernel's OOM killer)",
                    e.at,
                    source=NODE_AGENT,
                    signal=signal,
                )
            )
        elif codes := xid.xid_codes(f"{e.reason} {e.message}"):
            found.append(
                Finding(
                    None,
                    f"note: {line} (XID {xid.describe(codes)}; an agent's non-fatal report)",
                    source=NODE_AGENT,
                    signal=signal,
                )
            )
    return found


def explanations(pod: PodView, ctx: NodeContext) -> list[Finding]:
    """Node-level evidence about the pod's node and devices (findings and notes)."""
    node = ctx.node(pod.node)
    on_node = _conditions(pod, node, ctx) + _labels(pod, node, ctx) if node is not None else []
    return on_node + devices(pod) + _node_events(pod, ctx)
