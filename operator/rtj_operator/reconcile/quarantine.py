"""Node quarantine bookkeeping: taints added and removed idempotently, TTL expiry."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from rtj_operator.api.reasons import ConditionType, Reason
from rtj_operator.api.status import (
    QuarantinedNode,
)
from rtj_operator.policy.render import quarantine_taint
from rtj_operator.reconcile.actions import UntaintNode
from rtj_operator.reconcile.builder import PlanBuilder
from rtj_operator.reconcile.world import Json


def add_taint(taints: Sequence[Json], taint: Json) -> list[dict[str, Any]] | None:
    """The node's taints with `taint` added; None when nothing changes.

    A node holds one taint per key and effect: if another job already quarantined it
    (same key and effect, other value), the node stays quarantined and nothing changes.
    """
    same = [
        t for t in taints if t.get("key") == taint["key"] and t.get("effect") == taint["effect"]
    ]
    if same:
        return None
    return [dict(t) for t in taints] + [dict(taint)]


def remove_taint(taints: Sequence[Json], taint: Json) -> list[dict[str, Any]] | None:
    """The node's taints without ours (key, value and effect all match); None: unchanged."""
    kept = [
        dict(t)
        for t in taints
        if not (
            t.get("key") == taint["key"]
            and t.get("effect") == taint["effect"]
            and t.get("value", "") == taint.get("value", "")
        )
    ]
    return kept if len(kept) != len(taints) else None


def lift_expired_quarantines(b: PlanBuilder) -> None:
    ttl = b.rtj.spec.node_health.quarantine_ttl_seconds
    if ttl is None or not b.status.quarantined_nodes:
        return
    taint = quarantine_taint(b.rtj)
    kept: list[QuarantinedNode] = []
    for q in b.status.quarantined_nodes:
        expires = q.since + timedelta(seconds=ttl)
        if expires > b.now:
            kept.append(q)
            b.requeue_in((expires - b.now).total_seconds())
            continue
        b.before.append(UntaintNode(q.node, taint))
        b.event(
            False,
            Reason.QUARANTINE_LIFTED,
            f"node {q.node}: quarantine TTL of {ttl}s expired "
            f"(quarantined at {q.since.isoformat()} for {q.failure_class.value})",
        )
        b.notes.append(f"lift quarantine of {q.node}")
    b.update(quarantined_nodes=kept)
    if not kept:
        b.condition(
            ConditionType.NODES_QUARANTINED,
            False,
            Reason.QUARANTINE_LIFTED,
            "no node is quarantined by this job",
        )
