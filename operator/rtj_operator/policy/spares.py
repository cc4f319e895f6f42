"""Warm spares (spec.spares, issue 15): which pod serves which rank, and which spare takes a
replaced pod's rank. Pure.

A worker pod serves its completion index. A spare (a pod of the `spare` replicated Job,
rendered by `policy.render`) serves no rank until an in-place restart gives it the rank of a
pod being replaced: the attempt's record keeps that (`status.current.spareRanks`, pod name ->
rank), written before any order goes out. A worker pod whose rank a spare took serves none:
the pod its Job creates again for that index is the new spare. The world of an attempt is
the pods that serve a rank; the others are idle, held by their supervisor (a stop order for
the current generation), and told to finish once the world has.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from rtj_operator.api import keys
from rtj_operator.policy.in_place import node_of
from rtj_shim.wire.supervisor_report import SupervisorReport, SupervisorState

Json = Mapping[str, Any]


def _meta(pod: Json, field: str) -> Mapping[str, Any]:
    value = (pod.get("metadata") or {}).get(field)
    return value if isinstance(value, Mapping) else {}


def _name(pod: Json) -> str:
    return str((pod.get("metadata") or {}).get("name") or "")


def is_spare_pod(pod: Json) -> bool:
    """A pod of the warm spares' replicated Job (JobSet's own label on its pods)."""
    return _meta(pod, "labels").get(keys.REPLICATED_JOB_LABEL) == keys.SPARE_REPLICATED_JOB


def natural_rank(pod: Json) -> int | None:
    """The rank a worker pod was created for (its completion index); None for a spare."""
    if is_spare_pod(pod):
        return None
    index = _meta(pod, "annotations").get(keys.JOB_COMPLETION_INDEX)
    return int(index) if isinstance(index, str) and index.isdigit() else None


def is_idle(pod: Json, assigned: Mapping[str, int], world_size: int | None = None) -> bool:
    """A spare no restart gave a rank, a worker pod whose rank another pod took, or (a
    world shrunk to `world_size` pods: spec.elastic) a worker pod whose rank it lacks."""
    if _name(pod) in assigned:
        return False
    if is_spare_pod(pod):
        return True
    natural = natural_rank(pod)
    if natural is not None and world_size is not None and natural >= world_size:
        return True
    return natural is not None and natural in assigned.values()


def rank_of(pod: Json, assigned: Mapping[str, int], world_size: int | None = None) -> int | None:
    """The rank `pod` serves: the one a restart gave it, else its own (None: idle, or a pod
    with no completion index)."""
    name = _name(pod)
    if name in assigned:
        return assigned[name]
    return None if is_idle(pod, assigned, world_size) else natural_rank(pod)


def serving(
    pods: Iterable[Json], assigned: Mapping[str, int], world_size: int | None = None
) -> list[Json]:
    """The pods of the world (every pod that is not idle), in their order."""
    return [p for p in pods if not is_idle(p, assigned, world_size)]


def idle(
    pods: Iterable[Json], assigned: Mapping[str, int], world_size: int | None = None
) -> list[Json]:
    """The pods that serve no rank: spares, worker pods whose rank another pod took or
    that a shrunk world lacks."""
    return [p for p in pods if is_idle(p, assigned, world_size)]


def renumbered(world: Mapping[str, int], pods: Iterable[Json]) -> dict[str, int]:
    """The `assigned` map (`status.current.spareRanks`) of a world given as pod -> rank:
    an entry for each pod that serves another rank than its own (spec.elastic)."""
    natural = {_name(p): natural_rank(p) for p in pods}
    return {pod: rank for pod, rank in world.items() if natural.get(pod) != rank}


def as_serving(pod: Json, assigned: Mapping[str, int]) -> Json:
    """`pod` as the classifier should read it: a spare serving rank r carries r as its
    completion index (the rank its failure is reported under). An in-memory view; the
    object in the API keeps its own."""
    name = _name(pod)
    if name not in assigned:
        return pod
    meta = dict(pod.get("metadata") or {})
    meta["annotations"] = {**_meta(pod, "annotations"),
                           keys.JOB_COMPLETION_INDEX: str(assigned[name])}  # fmt: skip
    return {**pod, "metadata": meta}


def assign(assigned: Mapping[str, int], pod: Json, rank: int) -> dict[str, int]:
    """`assigned` with `pod` serving `rank` (whoever served it before no longer does); a
    worker pod given its own index back needs no entry."""
    out = {n: r for n, r in assigned.items() if r != rank and n != _name(pod)}
    if natural_rank(pod) != rank:
        out[_name(pod)] = rank
    return out


def ready(pod: Json, report: SupervisorReport | None) -> bool:
    """An idle pod that can take a rank now: running, not being deleted, supervised, and its
    supervisor holding (stopped, its command not started)."""
    if (pod.get("status") or {}).get("phase") != "Running" or (pod.get("metadata") or {}).get(
        "deletionTimestamp"
    ):
        return False
    if _meta(pod, "annotations").get(keys.SUPERVISED_ANNOTATION) != "true":
        return False
    return report is not None and report.state is SupervisorState.STOPPED


def pick(
    candidates: Sequence[Json],
    reports: Mapping[str, SupervisorReport],
    ranks: Mapping[str, int],
    avoid: Collection[str],
) -> dict[str, int] | None:
    """A ready spare for each pod being replaced (`ranks`: its name -> the rank it served),
    each on its own node and none on a node in `avoid` (quarantined or being judged):
    spare name -> rank, the lowest ranks first to the spares in name order. None when there
    are not enough (the Job controller then creates the replaced pods again, as without
    spares)."""
    taken: set[str] = set()
    chosen: list[Json] = []
    for pod in sorted(candidates, key=_name):
        node = node_of(pod)
        if node is None or node in avoid or node in taken:
            continue
        if ready(pod, reports.get(_name(pod))):
            chosen.append(pod)
            taken.add(node)
    wanted = sorted(ranks.values())
    if not wanted or len(chosen) < len(wanted):
        return None
    return {_name(pod): rank for pod, rank in zip(chosen, wanted, strict=False)}


def host(pod: Json) -> str | None:
    """Where the pod's rendezvous store is reached when it holds rank 0: its IPv4 address
    (``status.podIP``, fixed for the pod's life, no DNS record to wait for), else its stable
    DNS name (``<hostname>.<subdomain>``, which JobSet sets with
    ``network.enableDNSHostnames``: a bare IPv6 address breaks commands that build
    ``host:port``), else an IPv6 address; None without any."""
    ip = _ip((pod.get("status") or {}).get("podIP"))
    if ip is not None and ip.version == 4:
        return str(ip)
    spec = pod.get("spec") or {}
    hostname, subdomain = spec.get("hostname"), spec.get("subdomain")
    if isinstance(hostname, str) and hostname and isinstance(subdomain, str) and subdomain:
        return f"{hostname}.{subdomain}"
    return str(ip) if ip is not None else None


def _ip(text: Any) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text) if isinstance(text, str) else None
    except ValueError:
        return None


def moved_master(pods: Iterable[Json], assigned: Mapping[str, int]) -> str | None:
    """The rendezvous host when rank 0 moved to another pod than worker 0 (None: it did
    not, every pod keeps the rendered one)."""
    holder = next((p for p in pods if assigned.get(_name(p)) == 0), None)
    return host(holder) if holder is not None else None
