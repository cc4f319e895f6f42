"""What the progress poller posts to each pod's progress sidecar before reading it: the
restart order of an in-place restart (``/control``, `reconcile.in_place`), the pod's
peer-replica assignment (``/replica``, `policy.peer_replica`) and, to the pod holding rank 0,
the fast tier's drain order (``/drain``, `policy.fast_drain`) and, to every pod of a job with
`plannedIntervalSeconds: auto`, the checkpoint interval chosen (``/intervals``), each signed
with the job's control key. Pure: decided from the snapshot, sent by `rtj_operator.rank_polls`.

All are idempotent and bounded: a restart order goes out in the close rounds of a restart
until the pod's report shows it carried out, then stands (sent whenever the pod is read, at
the usual pace; the sidecar takes the same one again), as an idle pod's (held, or finish)
does; an
assignment or a drain order only to a sidecar whose last report does not show it (one small
POST per such pod and round, until it does).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rtj_operator.api import keys
from rtj_operator.api.reasons import Phase
from rtj_operator.policy import fast_drain, fast_tier, peer_replica
from rtj_operator.reconcile.in_place import restart_orders
from rtj_operator.reconcile.world import (
    CONTROL_PATH,
    DRAIN_PATH,
    INTERVALS_PATH,
    REPLICA_PATH,
    PollMessage,
    PollTarget,
    Snapshot,
    get_in,
    pod_name,
)
from rtj_shim.fast.peer_replica import Assignment
from rtj_shim.wire.control import Order, sign
from rtj_shim.wire.drain_order import DrainOrder
from rtj_shim.wire.interval_order import IntervalOrder
from rtj_shim.wire.supervisor_report import (
    STARTED_STATES,
    STOPPED_STATES,
    SupervisorReport,
    SupervisorState,
)


@dataclass(frozen=True)
class PodMessages:
    """Per pod, the signed messages to post before reading it; and what the ring says
    about itself (a note when it cannot put every holder on another node)."""

    messages: Mapping[str, tuple[PollMessage, ...]] = field(default_factory=dict)
    ring_note: str | None = None


def pod_messages(snap: Snapshot, targets: Sequence[PollTarget]) -> PodMessages:
    """The messages for this round's `targets` (nothing without the job's control key)."""
    key = snap.control_key
    if not key:
        return PodMessages()
    out: dict[str, list[PollMessage]] = {}
    readings = snap.ranks
    current = readings is not None and readings.attempt == snap.rtj.status.attempt
    supervisors = readings.supervisors if readings is not None and current else {}
    orders = restart_orders(snap, targets)
    for target in targets:
        order = orders.get(target.pod)
        if order is not None:
            body = order.encode()
            standing = not _unheeded(order, supervisors.get(target.pod), idle=target.idle)
            message = PollMessage(CONTROL_PATH, body, sign(key, body), standing=standing)
            out.setdefault(target.pod, []).append(message)
    ring = replica_ring(snap, targets)
    reports = readings.replicas if readings is not None else {}
    if readings is not None and readings.attempt != snap.rtj.status.attempt:
        reports = {}
    for holding in peer_replica.unassigned(ring.holdings, reports):
        assignment = Assignment(snap.rtj.metadata.uid, holding.source_address, holding.source_index)
        raw = assignment.encode()
        out.setdefault(holding.holder, []).append(PollMessage(REPLICA_PATH, raw, sign(key, raw)))
    drain = drain_order(snap, targets)
    if drain is not None:
        raw = DrainOrder(snap.rtj.metadata.uid, drain.attempt, drain.every_steps,
                         drain.peers).encode()  # fmt: skip
        out.setdefault(drain.pod, []).append(PollMessage(DRAIN_PATH, raw, sign(key, raw)))
    for pod, raw in interval_orders(snap, targets).items():
        out.setdefault(pod, []).append(PollMessage(INTERVALS_PATH, raw, sign(key, raw)))
    return PodMessages({pod: tuple(ms) for pod, ms in out.items()}, ring.note)


def interval_orders(snap: Snapshot, targets: Sequence[PollTarget]) -> dict[str, bytes]:
    """Per pod of the current attempt whose last report does not show it, the interval
    `plannedIntervalSeconds: auto` chose (`status.checkpointIntervals`); none before it
    chose one. A pod not read yet gets it too (one small POST per round until it shows)."""
    rtj = snap.rtj
    chosen = rtj.status.checkpoint_intervals
    if not rtj.spec.checkpoint.auto_interval or chosen is None:
        return {}
    readings = snap.ranks
    shown: dict[str, object] = {}
    if readings is not None and readings.attempt == rtj.status.attempt:
        for report in readings.reports:
            held = report.body.get("intervals")
            shown[report.pod] = held.get("durable_seconds") if isinstance(held, Mapping) else None
    raw = IntervalOrder(rtj.metadata.uid, chosen.durable_seconds).encode()
    return {
        t.pod: raw
        for t in targets
        if t.attempt == rtj.status.attempt and shown.get(t.pod) != chosen.durable_seconds
    }


def _unheeded(order: Order, report: SupervisorReport | None, *, idle: bool) -> bool:
    """Whether the pod's last report does not yet show `order` carried out: its order then
    goes out in close rounds (and the pod is read in each); once it does, the order stands
    (posted whenever the pod is read, at the usual pace), so a round of a restart costs
    what the pods still to move cost, not what the world costs. A pod of the world that
    has not answered is waited for (the restart's deadline bounds it); an idle one (a pod
    the Job just created again, held at generation 0; a finish not yet carried out) waits
    for the usual pace, since a dead idle pod must not keep the rounds close for ever."""
    if report is None:
        return not idle
    if order.action == "finish":
        return report.state is not SupervisorState.FINISHED
    shown = STOPPED_STATES if order.action == "stop" else STARTED_STATES
    return not report.shows(order.generation, shown)


def drain_order(snap: Snapshot, targets: Sequence[PollTarget]) -> fast_drain.DrainTarget | None:
    """The drain order for the sidecar of the pod holding rank 0, when its last report does
    not show it. None while an in-place restart runs (the trainers' attempt label changes
    when it ends), before every pod of the attempt has an address, or without a drain."""
    rtj = snap.rtj
    if not fast_drain.drained(rtj) or rtj.status.in_place is not None:
        return None
    if rtj.status.phase not in (Phase.ADMITTED, Phase.RUNNING):
        return None
    members = {
        t.index: (t.pod, peer_replica.address(t.ip, t.port))
        for t in targets
        if t.index is not None and t.attempt == rtj.status.attempt
    }
    target = fast_drain.order(rtj, rtj.status.attempt_generation, members)
    if target is None:
        return None
    readings = snap.ranks
    report = None
    if readings is not None and readings.attempt == rtj.status.attempt:
        report = readings.drains.get(target.pod)
    return None if fast_drain.shown(target, report) else target


def replica_ring(snap: Snapshot, targets: Sequence[PollTarget]) -> peer_replica.Ring:
    """Who holds whom among the running pods rendered with a peer replica, while the job
    runs. None is (re)assigned while an in-place restart is under way: the holders' copies
    are what its barrier pins from, and a replaced pod's holder must keep the old one."""
    rtj = snap.rtj
    if not fast_tier.replicated(rtj) or rtj.status.in_place is not None:
        return peer_replica.Ring()
    if rtj.status.phase not in (Phase.ADMITTED, Phase.RUNNING):
        return peer_replica.Ring()
    rendered = {
        pod_name(p)
        for p in snap.pods
        if get_in(p, "metadata", "annotations", keys.PEER_REPLICA_ANNOTATION) == "true"
        and get_in(p, "metadata", "deletionTimestamp") is None
    }  # fmt: skip
    members = [
        peer_replica.Member(t.pod, t.index, t.node, peer_replica.address(t.ip, t.port))
        for t in targets
        if t.index is not None and t.pod in rendered and t.attempt == rtj.status.attempt
    ]
    return peer_replica.ring(members)
