"""Node quarantine: who holds which taint on a node, claimed and released idempotently.

Kubernetes allows one taint per key and effect on a node, so when several jobs quarantine
the same node they share one taint. Ownership lives beside it, in the node annotation
`training.resilient.dev/quarantined-by`: a JSON object keyed by `<taint key>:<effect>`,
each entry listing the jobs (namespace/name and uid) that hold it and whether one of them
placed the taint (a taint an administrator placed with the same key is never removed by
us). A job's release removes only its own claim; the taint goes with the last claim.

Both edits are pure functions of the node's taints and annotation; `kube.edit_node` runs
them under the node's resourceVersion. Records in `status.quarantinedNodes` carry the key,
value and effect placed, so a later change of the taint settings never strands a taint.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from rtj_operator.api import keys
from rtj_operator.api.reasons import ConditionType, Reason
from rtj_operator.api.status import QuarantinedNode
from rtj_operator.policy.render import quarantine_taint
from rtj_operator.reconcile.actions import SetFinalizer, TaintNode, UntaintNode
from rtj_operator.reconcile.builder import PlanBuilder
from rtj_operator.reconcile.world import Json, get_in

MAX_CLAIMS_PER_TAINT = 128
"""Jobs recorded as holding one taint of one node (the annotation must stay small)."""


@dataclass(frozen=True)
class Claimant:
    """The job that claims (or releases) a quarantine taint."""

    job: str
    """namespace/name, for people reading the annotation."""
    uid: str


@dataclass(frozen=True)
class NodeEdit:
    """The node's new taints and ownership annotation (None: remove the annotation)."""

    taints: list[dict[str, Any]]
    annotation: str | None


def taint_slot(taint: Json) -> str:
    return f"{taint['key']}:{taint['effect']}"


def read_claims(annotation: str | None) -> dict[str, dict[str, Any]] | None:
    """The ownership annotation; {} when absent, None when unreadable (then never release:
    we cannot tell whose the taint is)."""
    if not annotation:
        return {}
    try:
        claims = json.loads(annotation)
    except ValueError:
        return None
    if not isinstance(claims, dict):
        return None
    out: dict[str, dict[str, Any]] = {}
    for slot, entry in claims.items():
        if not isinstance(entry, Mapping):
            return None
        owners = [
            {"job": str(o.get("job", "")), "uid": str(o.get("uid", ""))}
            for o in entry.get("owners") or []
            if isinstance(o, Mapping) and o.get("uid")
        ]
        out[str(slot)] = {"placed": bool(entry.get("placed")), "owners": owners}
    return out


def _dump(claims: Mapping[str, Mapping[str, Any]]) -> str | None:
    kept = {slot: entry for slot, entry in sorted(claims.items()) if entry["owners"]}
    return json.dumps(kept, separators=(",", ":"), sort_keys=True) if kept else None


def _same_slot(existing: Json, taint: Json) -> bool:
    return bool(existing.get("key") == taint["key"] and existing.get("effect") == taint["effect"])


def _legacy_taint(taints: Sequence[Json], taint: Json) -> bool:
    """The taint itself, its value naming the job, with no claims recorded (an operator
    version before claims wrote only that)."""
    return any(
        _same_slot(t, taint) and t.get("value", "") == taint.get("value", "") for t in taints
    )


def claim(
    taints: Sequence[Json], annotation: str | None, taint: Json, who: Claimant
) -> NodeEdit | None:
    """Add `who`'s claim on `taint`, placing the taint if the node lacks one of that key and
    effect; None when `who` holds a claim already. A claim recorded without its taint means
    an administrator lifted the taint by hand: that is respected, not undone."""
    claims = read_claims(annotation)
    if claims is None:
        return None  # unreadable: whose taints these are cannot be told; touch nothing
    slot = taint_slot(taint)
    present = any(_same_slot(t, taint) for t in taints)
    entry = claims.setdefault(slot, {"placed": False, "owners": []})
    if any(o["uid"] == who.uid for o in entry["owners"]):
        return None
    if len(entry["owners"]) >= MAX_CLAIMS_PER_TAINT and present:
        return None  # held by enough jobs; it stays until they all release it
    if not present:
        entry["placed"] = True
    entry["owners"].append({"job": who.job, "uid": who.uid})
    new_taints = [dict(t) for t in taints] + ([] if present else [dict(taint)])
    return NodeEdit(new_taints, _dump(claims))


def release(
    taints: Sequence[Json], annotation: str | None, taint: Json, who: Claimant
) -> NodeEdit | None:
    """Remove `who`'s claim on `taint`; the taint goes when no claim remains and we placed
    it. A taint with no recorded claims at all (placed by an operator version before claims
    were recorded) is removed when its value names this job, as that version did."""
    claims = read_claims(annotation)
    if claims is None:
        return None
    slot = taint_slot(taint)
    entry = claims.get(slot)

    def without_taint() -> list[dict[str, Any]]:
        return [dict(t) for t in taints if not _same_slot(t, taint)]

    if entry is None:  # legacy: the taint alone, its value the job's name
        return NodeEdit(without_taint(), annotation) if _legacy_taint(taints, taint) else None
    owners = [o for o in entry["owners"] if o["uid"] != who.uid]
    if len(owners) == len(entry["owners"]):
        return None
    entry["owners"] = owners
    new_taints = without_taint() if not owners and entry["placed"] else [dict(t) for t in taints]
    return NodeEdit(new_taints, _dump(claims))


def holds_claim(node: Json, taint: Json, who: Claimant) -> bool:
    """Whether the node (as cached) records `who`'s claim on `taint` (or cannot tell: an
    unreadable annotation, or a legacy taint naming the job with no claims recorded)."""
    annotation = get_in(node, "metadata", "annotations", keys.QUARANTINE_OWNERS_ANNOTATION)
    claims = read_claims(annotation)
    if claims is None:
        return True
    entry = claims.get(taint_slot(taint))
    if entry is None:
        return _legacy_taint(get_in(node, "spec", "taints") or [], taint)
    return any(o["uid"] == who.uid for o in entry["owners"])


# --- in the plan --------------------------------------------------------------------------


def claimant(b: PlanBuilder) -> Claimant:
    meta = b.rtj.metadata
    return Claimant(f"{meta.namespace}/{meta.name}", meta.uid)


def record_taint(b: PlanBuilder, q: QuarantinedNode) -> dict[str, str]:
    """The taint a record placed (the job's current settings for records without one)."""
    current = quarantine_taint(b.rtj)
    return {
        "key": q.taint_key or current["key"],
        "value": q.taint_value if q.taint_value is not None else current["value"],
        "effect": q.taint_effect or current["effect"],
    }


def ensure_quarantines(b: PlanBuilder) -> None:
    """Every quarantine recorded in status holds on its node: a taint is placed only after
    the record is committed (the intent first), and a later leader that finds a record
    whose taint or claim is missing (a crash, a lost request) places it again."""
    who = claimant(b)
    claims = []
    for q in b.status.quarantined_nodes:
        node = b.snap.nodes.get(q.node)
        if node is None:
            continue  # not in the cache (deleted, or not listed yet): nothing to taint
        taint = record_taint(b, q)
        if not holds_claim(node, taint, who):
            claims.append(TaintNode(q.node, taint, who.job, who.uid))
    if b.status.quarantined_nodes and keys.RELEASE_FINALIZER not in b.rtj.metadata.finalizers:
        b.after.append(SetFinalizer(keys.RELEASE_FINALIZER, present=True))  # before any claim
    b.after.extend(claims)


def lift_expired_quarantines(b: PlanBuilder) -> None:
    ttl = b.rtj.spec.node_health.quarantine_ttl_seconds
    if ttl is None or not b.status.quarantined_nodes:
        return
    who = claimant(b)
    kept: list[QuarantinedNode] = []
    for q in b.status.quarantined_nodes:
        expires = q.since + timedelta(seconds=ttl)
        if expires > b.now:
            kept.append(q)
            b.requeue_in((expires - b.now).total_seconds())
            continue
        # before the patch: a repeat by any leader releases the same claim (idempotent)
        b.before.append(UntaintNode(q.node, record_taint(b, q), who.job, who.uid))
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


def release_all(b: PlanBuilder) -> None:
    """The job is being deleted: release every claim it recorded (before its finalizer goes)."""
    who = claimant(b)
    for q in b.status.quarantined_nodes:
        b.before.append(UntaintNode(q.node, record_taint(b, q), who.job, who.uid))
