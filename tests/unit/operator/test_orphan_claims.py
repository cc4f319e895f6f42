"""Which quarantine claims on nodes no live job holds (issue 42: a tenant that drops the
`release-quarantines` finalizer and deletes its job leaves its taint behind), and the edit
that releases one. Pure: claims, live uids, the watched namespaces, the last verdict, now."""

from __future__ import annotations

from datetime import datetime, timedelta

from rtj_test_support import NOW

from rtj_operator import reconcile as rc
from rtj_operator.api import keys
from rtj_operator.reconcile.orphan_claims import (
    NodeClaim,
    Sweep,
    claims_in,
    node_claims,
    orphan_claims,
    release_orphan,
)

TAINT = {"key": keys.DEFAULT_TAINT_KEY, "value": "llm", "effect": "NoSchedule"}
SLOT = f"{keys.DEFAULT_TAINT_KEY}:NoSchedule"
GRACE = timedelta(minutes=2)
GONE = NodeClaim("gpu-node-002", SLOT, "team-a/llm", "uid-gone")
LIVE = NodeClaim("gpu-node-002", SLOT, "team-b/big", "uid-live")


def _claimed(*who: NodeClaim) -> tuple[list[dict[str, str]], str | None]:
    """A node's taints and annotation after `who` claimed the taint, in that order."""
    taints: list[dict[str, str]] = []
    annotation = None
    for claim in who:
        edit = rc.claim(taints, annotation, TAINT, claim.claimant)
        assert edit is not None
        taints, annotation = edit.taints, edit.annotation
    return taints, annotation


def _sweep(
    claims: list[NodeClaim],
    live: set[str],
    *,
    namespaces: set[str] | None = None,
    waiting: dict[NodeClaim, datetime] | None = None,
    at: timedelta = timedelta(0),
) -> Sweep:
    return orphan_claims(claims, live, namespaces, waiting or {}, NOW + at, GRACE)


def test_a_node_records_each_jobs_claim_by_uid() -> None:
    taints, annotation = _claimed(GONE, LIVE)
    node = {
        "metadata": {"name": "gpu-node-002",
                     "annotations": {keys.QUARANTINE_OWNERS_ANNOTATION: annotation}},
        "spec": {"taints": taints},
    }  # fmt: skip
    assert node_claims(node) == [GONE, LIVE]
    assert GONE.namespace == "team-a"
    assert GONE.taint == {"key": TAINT["key"], "effect": "NoSchedule"}
    # nothing recorded, or unreadable: no claim to judge (a legacy taint is never swept)
    assert node_claims({"metadata": {"name": "n"}, "spec": {"taints": [TAINT]}}) == []
    assert claims_in("n", "{not json") == []


def test_a_claim_of_a_gone_job_is_released_only_after_its_grace() -> None:
    first = _sweep([GONE, LIVE], {"uid-live"})
    assert first.release == () and dict(first.waiting) == {GONE: NOW}, "seen, not released yet"
    early = _sweep([GONE, LIVE], {"uid-live"}, waiting=dict(first.waiting), at=GRACE / 2)
    assert early.release == () and dict(early.waiting) == {GONE: NOW}, "first sighting kept"
    due = _sweep([GONE, LIVE], {"uid-live"}, waiting=dict(early.waiting), at=GRACE)
    assert due.release == (GONE,) and not due.waiting
    # a new operator (nothing remembered) starts the grace again: never at first sight
    assert _sweep([GONE], set(), at=GRACE * 10).release == ()


def test_a_live_job_keeps_its_claim_whenever_it_was_suspected() -> None:
    """The job the last sweep missed (a lagging read) is in this LIST: forgotten, kept."""
    verdict = _sweep([GONE], {"uid-gone"}, waiting={GONE: NOW}, at=GRACE * 3)
    assert verdict.release == () and not verdict.waiting


def test_a_namespaced_operator_never_judges_another_namespaces_claims() -> None:
    """It listed only its own namespaces: a job elsewhere may well exist."""
    elsewhere = _sweep([GONE, LIVE], set(), namespaces={"team-b"}, waiting={GONE: NOW,
                       LIVE: NOW}, at=GRACE)  # fmt: skip
    assert elsewhere.release == (LIVE,) and not elsewhere.waiting
    nameless = NodeClaim("gpu-node-002", SLOT, "", "uid-x")
    assert _sweep([nameless], set(), namespaces={"team-a"}).waiting == {}
    assert _sweep([nameless], set()).waiting == {nameless: NOW}, "cluster-wide: every claim"


def test_a_claim_gone_from_its_node_is_forgotten() -> None:
    verdict = _sweep([], set(), waiting={GONE: NOW}, at=GRACE)
    assert verdict == Sweep()


def test_releasing_an_orphan_keeps_the_others_claims_and_is_idempotent() -> None:
    taints, annotation = _claimed(GONE, LIVE)
    edit = release_orphan(taints, annotation, GONE)
    assert edit is not None and edit.taints == [TAINT], "the live job still holds the taint"
    assert claims_in("gpu-node-002", edit.annotation) == [LIVE]
    assert release_orphan(edit.taints, edit.annotation, GONE) is None, "released already"
    last = release_orphan(edit.taints, edit.annotation, LIVE)
    assert last is not None and last.taints == [] and last.annotation is None


def test_an_orphan_release_never_takes_a_taint_no_claim_records() -> None:
    """The claims annotation gone (an administrator's cleanup) but a taint of our key left,
    e.g. placed by hand with an empty value: the sweep's stale claim must not remove it (a
    job's own release would, as a legacy taint)."""
    by_hand = {"key": keys.DEFAULT_TAINT_KEY, "value": "", "effect": "NoSchedule"}
    assert release_orphan([by_hand], None, NodeClaim("n", SLOT, "team-a/", "uid-gone")) is None
    assert release_orphan([TAINT], None, GONE) is None
