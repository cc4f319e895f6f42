"""Is each shared KWOK node fit for the next test? Pure: plain views in, problems out.

A shared node is fit when it exists, is pristine (Ready, no taint, no fault label or
condition a test left) and its Lease in ``kube-node-lease`` is KWOK's: owned by the node as
it is now (its UID) and renewed within the Lease's duration. A Lease owned by an earlier
Node of the same name, or one nobody renews, is how KWOK v0.8.0 breaks after a node is
re-created under the same name (shared/notes/kwok-lease-recreate.md): the node lifecycle
controller then marks the node unreachable, and every later test that needs it times out.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any


class NodeTrouble(enum.Enum):
    MISSING = "missing"
    NOT_PRISTINE = "not pristine"
    NO_LEASE = "no Lease"
    LEASE_OF_OLD_NODE = "Lease owned by an earlier Node of that name"
    LEASE_STALE = "Lease not renewed"


REPAIRED_BY_RESET = frozenset({NodeTrouble.MISSING, NodeTrouble.NOT_PRISTINE})
"""Troubles `ClusterHandle.reset_nodes` mends (it re-creates the node); the others are
KWOK's lease handling, mended by restarting KWOK."""


@dataclass(frozen=True)
class NodeView:
    name: str
    uid: str
    pristine: bool


@dataclass(frozen=True)
class LeaseView:
    node: str
    owner_uids: tuple[str, ...]
    renewed_seconds_ago: float | None
    """None: the Lease was never renewed (no renewTime)."""


@dataclass(frozen=True)
class NodeProblem:
    node: str
    trouble: NodeTrouble
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.node}: {self.trouble.value}" + (f" ({self.detail})" if self.detail else "")


def node_problems(
    names: Sequence[str],
    nodes: Mapping[str, NodeView],
    leases: Mapping[str, LeaseView],
    *,
    lease_seconds: float,
) -> list[NodeProblem]:
    """What keeps each of ``names`` from serving the next test (empty: all fit)."""
    problems: list[NodeProblem] = []
    for name in names:
        node = nodes.get(name)
        if node is None:
            problems.append(NodeProblem(name, NodeTrouble.MISSING))
            continue
        if not node.pristine:
            problems.append(NodeProblem(name, NodeTrouble.NOT_PRISTINE))
        lease = leases.get(name)
        if lease is None:
            problems.append(NodeProblem(name, NodeTrouble.NO_LEASE))
        elif lease.owner_uids and node.uid not in lease.owner_uids:
            owners = ",".join(lease.owner_uids)
            problems.append(NodeProblem(name, NodeTrouble.LEASE_OF_OLD_NODE, f"owner {owners}"))
        elif lease.renewed_seconds_ago is None or lease.renewed_seconds_ago > lease_seconds:
            age = lease.renewed_seconds_ago
            problems.append(
                NodeProblem(
                    name,
                    NodeTrouble.LEASE_STALE,
                    "never" if age is None else f"last renewed {age:.0f}s ago",
                )
            )
    return problems


def _seconds_since(stamp: str | None, now: datetime) -> float | None:
    if not stamp:
        return None
    return (now - datetime.fromisoformat(stamp.replace("Z", "+00:00"))).total_seconds()


def kwok_lease_troubles(
    nodes: Sequence[Mapping[str, Any]],
    leases: Sequence[Mapping[str, Any]],
    *,
    now: datetime,
    lease_seconds: float,
) -> list[NodeProblem]:
    """The Lease troubles of the nodes KWOK should be renewing (labelled ``type=kwok``), from
    the API's JSON. Never what a test meant: a lost node is relabelled, and every other fault
    helper leaves KWOK renewing the Lease. So any trouble here is the harness's."""
    managed = [n for n in nodes if (n["metadata"].get("labels") or {}).get("type") == "kwok"]
    views = {
        n["metadata"]["name"]: NodeView(n["metadata"]["name"], n["metadata"]["uid"], True)
        for n in managed
    }
    lease_views = {
        lease["metadata"]["name"]: LeaseView(
            lease["metadata"]["name"],
            tuple(o["uid"] for o in lease["metadata"].get("ownerReferences") or []),
            _seconds_since((lease.get("spec") or {}).get("renewTime"), now),
        )
        for lease in leases
    }
    return node_problems(sorted(views), views, lease_views, lease_seconds=lease_seconds)
