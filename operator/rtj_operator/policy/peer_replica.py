"""The fast tier's peer replica, decided (spec.checkpoint.fastTier.peerReplicas, issue 16).
Pure.

Each pod's fast steps live in its own memory and are lost with its node. With a peer
replica the progress sidecar of a *holder* pod keeps a copy of its *source* pod's fast steps
(``rtj_shim.fast.peer_replica``). The operator decides who holds whom (:func:`ring`): a ring over
the running pods' completion indexes, the smallest shift that puts every holder on another
node than its source. Each holder is sent its assignment (``POST /replica``) until its
report (``replica`` in ``GET /progress``) shows it (:func:`unassigned`), so a re-created
source (a new address) is followed. At an in-place restart's barrier the holders' reports
tell which steps a pod that lost its own can copy back (:func:`holders`,
``policy.fast_tier.pin``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Member:
    """A running pod of the attempt that can hold and be held."""

    pod: str
    index: int
    node: str | None
    address: str
    """Its progress sidecar, ``ip:port`` (:func:`address`)."""


@dataclass(frozen=True)
class Holding:
    """One holder's assignment: keep a copy of `source`'s fast steps."""

    holder: str
    source: str
    source_index: int
    source_address: str


@dataclass(frozen=True)
class Ring:
    """Who holds whom this round; `shift` (None: no ring) and why it is not a perfect one."""

    holdings: tuple[Holding, ...] = ()
    shift: int | None = None
    note: str | None = None


@dataclass(frozen=True)
class PeerView:
    """What the operator knows of the replicas at an in-place restart's barrier."""

    indexes: Mapping[str, int] = field(default_factory=dict)
    """Per live pod, its completion index."""
    replicas: Mapping[str, Mapping[str, Any] | None] = field(default_factory=dict)
    """Per live pod, its sidecar's last ``replica`` report (None: it holds none)."""
    addresses: Mapping[str, str] = field(default_factory=dict)
    """Per live pod, its progress sidecar (``ip:port``)."""
    replaced: Collection[int] = ()
    """Completion indexes whose pod this restart replaced (their new pods hold nothing)."""


def address(ip: str, port: int) -> str:
    """A progress sidecar's address as the shim reads it (``HOST:PORT``, ``[v6]:PORT``)."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def ring(members: Iterable[Member]) -> Ring:
    """Each member's source: the member k places after it in completion-index order holds
    it, with the smallest k >= 1 that puts every holder on another node than its source (k
    = 1 when none does: the note says so). Two pods claiming one index are both left out
    this round (one is on its way out); fewer than 2 members: no ring."""
    by_index: dict[int, list[Member]] = {}
    for m in members:
        by_index.setdefault(m.index, []).append(m)
    ordered = [ms[0] for _, ms in sorted(by_index.items()) if len(ms) == 1]
    n = len(ordered)
    if n < 2:
        return Ring()
    note = None
    shift = next(
        (k for k in range(1, n)
         if all(_apart(ordered[j], ordered[(j + k) % n]) for j in range(n))),
        None,
    )  # fmt: skip
    if shift is None:
        nodes = len({m.node for m in ordered})
        shift = 1
        note = (
            f"no ring over {n} pods on {nodes} nodes puts every holder on another node than "
            "its source: each pod's replica is held by the next index, some on their own node "
            "(a lost node can take a pod and its replica)"
        )
    holdings = tuple(
        Holding(
            holder=ordered[(j + shift) % n].pod,
            source=m.pod,
            source_index=m.index,
            source_address=m.address,
        )
        for j, m in enumerate(ordered)
    )
    return Ring(holdings, shift, note)


def _apart(source: Member, holder: Member) -> bool:
    return source.node is None or holder.node is None or source.node != holder.node


def unassigned(
    holdings: Iterable[Holding], replicas: Mapping[str, Mapping[str, Any] | None]
) -> tuple[Holding, ...]:
    """The holdings whose holder's last report does not show them (no report, another
    source index or another address): the assignments to send (again)."""
    out = []
    for h in holdings:
        report = replicas.get(h.holder)
        shown = isinstance(report, Mapping) and (
            report.get("source_index") == h.source_index
            and report.get("source") == h.source_address
        )
        if not shown:
            out.append(h)
    return tuple(out)


def steps(value: object) -> frozenset[int]:
    """The steps in a reported list (anything that is not a step is ignored)."""
    if not isinstance(value, list):
        return frozenset()
    return frozenset(s for s in value if isinstance(s, int) and not isinstance(s, bool) and s >= 0)


def holders(view: PeerView) -> dict[int, list[tuple[str, frozenset[int]]]]:
    """Per source index, the live pods holding its replica and the steps each holds (by
    pod name). A holder at a replaced index is not one (its new pod's copy is not the one
    the lost pod kept); a pod holding itself is not either."""
    out: dict[int, list[tuple[str, frozenset[int]]]] = {}
    for pod in sorted(view.indexes):
        report = view.replicas.get(pod)
        if not isinstance(report, Mapping) or view.indexes[pod] in view.replaced:
            continue
        source = report.get("source_index")
        if not isinstance(source, int) or isinstance(source, bool) or source < 0:
            continue
        if source != view.indexes[pod]:
            out.setdefault(source, []).append((pod, steps(report.get("steps"))))
    return out


def holder_index(view: PeerView, index: int) -> int | None:
    """The index that should hold `index`'s replica, from the ring the live holders report
    (None: they report none, or no single shift, or the indexes are not 0..n-1)."""
    n = len(view.indexes)
    if set(view.indexes.values()) != set(range(n)):
        return None
    shifts = {
        (view.indexes[pod] - report["source_index"]) % n
        for pod, report in view.replicas.items()
        if pod in view.indexes and isinstance(report, Mapping)
        and isinstance(report.get("source_index"), int)
        and view.indexes[pod] not in view.replaced
    }  # fmt: skip
    return (index + shifts.pop()) % n if len(shifts) == 1 else None


def replicated_step(
    replicas: Mapping[str, Mapping[str, Any] | None], indexes: Mapping[str, int]
) -> int | None:
    """The newest step whose replica every pod (`indexes`: pod -> completion index) has
    complete in another pod: what a pod replaced now could copy back. None while a pod's
    replica holds none."""
    if not indexes:
        return None
    held = holders(PeerView(indexes=indexes, replicas=replicas))
    common: frozenset[int] | None = None
    for index in set(indexes.values()):
        mine = frozenset().union(*(s for _, s in held.get(index, [])))
        common = mine if common is None else common & mine
    return max(common or (), default=None)
