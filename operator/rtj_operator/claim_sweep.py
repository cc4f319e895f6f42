"""The periodic sweep of orphaned quarantine claims: claims on nodes whose job is gone
without releasing them (its finalizer removed by the tenant, issue 42). What is an orphan is
decided in `reconcile.orphan_claims`; this reads the world for it and applies the verdict.

Blocking: the controller runs `ClaimSweep.run` in its thread pool, with the nodes from its
cache (read first) and the uids of the jobs it holds; the jobs are then listed afresh from
the API server. A failed LIST raises: nothing is released on a partial view.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Sequence
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from rtj_operator.api import keys
from rtj_operator.cache import uid_of
from rtj_operator.kube import Kube
from rtj_operator.reconcile.orphan_claims import (
    NodeClaim,
    node_claims,
    orphan_claims,
    release_orphan,
)

log = logging.getLogger("rtj_operator.claim_sweep")


def _uid_only(body: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"uid": uid_of(body)}}


class ClaimSweep:
    """Releases orphaned claims; remembers, between runs, the orphans still in their grace."""

    def __init__(
        self,
        kube: Kube,
        namespaces: Sequence[str] | None,
        grace: timedelta,
        clock: Callable[[], datetime],
    ) -> None:
        self.kube = kube
        self.namespaces = tuple(namespaces) if namespaces else None
        self.grace = grace
        self.clock = clock
        self.waiting: dict[NodeClaim, datetime] = {}

    def run(self, nodes: Iterable[dict[str, Any]], known_uids: Collection[str]) -> list[NodeClaim]:
        """One sweep (blocking): `nodes` as cached (read before the jobs are listed) and the
        uids of the jobs the cache holds. Returns the claims it released."""
        claims = [c for node in nodes for c in node_claims(node)]
        if not claims:
            self.waiting = {}
            return []  # no claim anywhere: no LIST either
        live = set(known_uids) | self._listed_uids()
        sweep = orphan_claims(claims, live, self.namespaces, self.waiting, self.clock(), self.grace)
        self.waiting = dict(sweep.waiting)
        released = []
        for claim in sweep.release:
            edit = partial(release_orphan, claim=claim)
            edited = self.kube.edit_node(claim.node, edit, keys.QUARANTINE_OWNERS_ANNOTATION)
            if edited:
                log.info(
                    "node %s: released the quarantine claim (%s) of job %s (uid %s): the job "
                    "no longer exists and did not release it",
                    claim.node, claim.slot, claim.job, claim.uid,
                )  # fmt: skip
                released.append(claim)
        return released

    def _listed_uids(self) -> set[str]:
        """The uid of every job in the operator's namespaces, from the API server."""
        uids: set[str] = set()
        for namespace in self.namespaces or (None,):
            items, _ = self.kube.list_kind("rtjs", namespace, _uid_only)
            uids |= {uid_of(item) for item in items}
        return uids
