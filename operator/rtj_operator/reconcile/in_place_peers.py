"""What an in-place restart's barrier knows of the fast tier's peer replicas
(`policy.peer_replica.PeerView`): the live pods' indexes and sidecar addresses, the holders'
last reports, and the indexes the restart replaced."""

from __future__ import annotations

from collections.abc import Sequence

from rtj_operator.api.attempts import InPlacePhase
from rtj_operator.policy import peer_replica
from rtj_operator.policy.peer_replica import PeerView
from rtj_operator.reconcile.builder import PlanBuilder
from rtj_operator.reconcile.ranks import completion_index, progress_port
from rtj_operator.reconcile.world import Json, get_in, pod_name


def peer_view(b: PlanBuilder, live: Sequence[Json], state: InPlacePhase) -> PeerView:
    """What the barrier knows of the peer replicas: the live pods' indexes and sidecar
    addresses, the holders' last reports, and the indexes this restart replaced."""
    readings = b.snap.ranks
    current = readings is not None and readings.attempt == b.status.attempt
    indexes, addresses = {}, {}
    for pod in live:
        name, index = pod_name(pod), completion_index(pod)
        ip, port = get_in(pod, "status", "podIP"), progress_port(pod)
        if index is not None:
            indexes[name] = index
        if isinstance(ip, str) and ip and port is not None:
            addresses[name] = peer_replica.address(ip, port)
    old = {pod_name(p): completion_index(p) for p in (*b.snap.pods, *b.snap.gone_pods)}
    replaced = set(state.replaced_ranks) or {
        i for n in state.replacing if (i := old.get(n, index_in_name(n))) is not None
    }  # a status written before the ranks were recorded: the pods' own indexes
    return PeerView(
        indexes=indexes,
        replicas=readings.replicas if readings is not None and current else {},
        addresses=addresses,
        replaced=frozenset(replaced),
    )


def index_in_name(pod: str) -> int | None:
    """The completion index in a worker pod's name (``<jobset>-worker-0-<index>-<suffix>``,
    as the Job controller names it), for a replaced pod no longer seen."""
    parts = pod.rsplit("-", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None
