"""Orphaned quarantine claims: claims recorded on nodes whose job no longer exists. Pure.

A job releases its own claims when it is deleted: the finalizer
`training.resilient.dev/release-quarantines` holds the deletion until the operator has. But a
tenant may patch its own job, and one that drops that finalizer and then deletes the job
leaves its taint and claim on the node for good (issue 42). The operator's periodic sweep
(`claim_sweep`) releases such claims, as the job's deletion would have; this module decides
which claims those are.

A claim is an orphan only when all of these hold:

- its job's uid is among no jobs the API server listed (a fresh LIST, not only the cache)
  *after* the nodes' claims were read: a claim on a node was made by a job that existed
  before that LIST, so a live job is in it however new it is;
- its job's namespace is one the operator watches (`namespaces`; None: every namespace). A
  namespaced operator cannot list the others' jobs, so it never judges their claims;
- it was an orphan already `grace` ago, in an earlier sweep of this operator: a LIST that
  lags, or a job another replica was creating, gets a second look before anything goes.

Legacy taints (no claims recorded) and an unreadable claims annotation name no uid: a sweep
never touches them (`quarantine.read_claims`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from rtj_operator.api import keys
from rtj_operator.reconcile.quarantine import Claimant, NodeEdit, read_claims, release
from rtj_operator.reconcile.world import Json, get_in


@dataclass(frozen=True)
class NodeClaim:
    """One job's claim on one taint (`<key>:<effect>`) of one node, as the node records it."""

    node: str
    slot: str
    job: str
    """namespace/name, as recorded (for people; the uid is what identifies the job)."""
    uid: str

    @property
    def namespace(self) -> str | None:
        """The job's namespace, None when the record does not say one."""
        namespace, sep, name = self.job.partition("/")
        return namespace if sep and namespace and name else None

    @property
    def taint(self) -> dict[str, str]:
        key, _, effect = self.slot.rpartition(":")
        return {"key": key, "effect": effect}

    @property
    def claimant(self) -> Claimant:
        return Claimant(self.job, self.uid)


def claims_in(node: str, annotation: str | None) -> list[NodeClaim]:
    """Every claim a node's ownership annotation records ([] when unreadable)."""
    return [
        NodeClaim(node, slot, owner["job"], owner["uid"])
        for slot, entry in sorted((read_claims(annotation) or {}).items())
        for owner in entry["owners"]
    ]


def node_claims(node: Json) -> list[NodeClaim]:
    """The claims recorded on a node object (as the API server or the cache holds it)."""
    name = str(get_in(node, "metadata", "name") or "")
    annotation = get_in(node, "metadata", "annotations", keys.QUARANTINE_OWNERS_ANNOTATION)
    return claims_in(name, annotation if isinstance(annotation, str) else None)


@dataclass(frozen=True)
class Sweep:
    """One sweep's verdict: the claims to release now, and the orphans still in their grace
    (each with when a sweep first found it orphaned), for the next sweep to judge."""

    release: tuple[NodeClaim, ...] = ()
    waiting: Mapping[NodeClaim, datetime] = field(default_factory=dict)


def orphan_claims(
    claims: Iterable[NodeClaim],
    live_uids: Collection[str],
    namespaces: Collection[str] | None,
    waiting: Mapping[NodeClaim, datetime],
    now: datetime,
    grace: timedelta,
) -> Sweep:
    """Which `claims` to release: those of no live job, in a watched namespace, found
    orphaned by a sweep at least `grace` before `now` (`waiting`: the last verdict's)."""
    release_now: list[NodeClaim] = []
    still: dict[NodeClaim, datetime] = {}
    for claim in dict.fromkeys(claims):
        if claim.uid in live_uids:
            continue
        if namespaces is not None and claim.namespace not in namespaces:
            continue  # not a job this operator may judge
        since = waiting.get(claim, now)
        if now - since >= grace:
            release_now.append(claim)
        else:
            still[claim] = since
    return Sweep(tuple(release_now), still)


def release_orphan(
    taints: Sequence[Json], annotation: str | None, claim: NodeClaim
) -> NodeEdit | None:
    """The node edit that releases `claim` (`kube.edit_node` runs it on the node as read
    then); None when the node no longer records it: then nothing is touched, never a taint
    with no claims recorded beside it, whoever placed it."""
    if claim not in claims_in(claim.node, annotation):
        return None
    return release(taints, annotation, claim.taint, claim.claimant)
