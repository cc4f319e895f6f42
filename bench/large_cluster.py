"""What a KWOK cluster of 1,000+ nodes needs to run on a small machine, shared by the
benchmarks that go to 1,250 pods (`bench.in_place_scale`, `bench.operator_scale`).

On 2 CPUs shared with the API server, etcd, KWOK and the controllers (measured in
bench/results/in-place-scale.md, 2026-12-03):

- KWOK's node Leases renewed every few seconds starve the machine: ``--lease`` sets their
  duration (renewed at a quarter of it);
- the operator's node Lease watch then lags so far behind 1,253 nodes that it judges a
  partition: ``--no-lease-signal`` runs it with ``--no-watch-node-leases``;
- the operator's own leader Lease at 15 s missed a renewal deadline: ``--leader-lease``;
- 1,251 pods took 247 s to start, and Kueue's ``waitForPodsReady`` at the harness's 120 s
  evicted the job before its last pods were Ready: ``--pods-ready-timeout``.
"""

from __future__ import annotations

import argparse

from e2e.cluster.cluster import PODS_READY_TIMEOUT
from e2e.operator_proc import SINGLE_REPLICA_LEASE

LARGE_PODS_READY_TIMEOUT = "900s"
"""Kueue's waitForPodsReady timeout for 1,250 pods on 2 CPUs."""


def add_arguments(
    ap: argparse.ArgumentParser, *, lease: int, pods_ready_timeout: str = PODS_READY_TIMEOUT
) -> None:
    """``--lease``, ``--no-lease-signal``, ``--leader-lease`` and ``--pods-ready-timeout``,
    with ``lease`` and ``pods_ready_timeout`` as the defaults."""
    ap.add_argument("--lease", type=int, default=lease, help="KWOK's node Lease seconds")
    ap.add_argument(
        "--no-lease-signal",
        dest="lease_signal",
        action="store_false",
        help="the operator does not watch node Leases (rtj run --no-watch-node-leases): for a "
        "cluster whose Leases this machine cannot keep current (1,250 KWOK nodes on 2 CPUs)",
    )
    ap.add_argument(
        "--leader-lease", type=float, default=15.0, help="the operator's own Lease seconds"
    )
    ap.add_argument(
        "--pods-ready-timeout",
        default=pods_ready_timeout,
        help=f"Kueue's waitForPodsReady timeout ({LARGE_PODS_READY_TIMEOUT} for 1,250 pods here)",
    )


def operator_flags(lease_signal: bool, leader_lease: float) -> tuple[str, ...]:
    """`rtj run` flags: the operator's leader election at ``leader_lease`` seconds (its
    defaults, `SINGLE_REPLICA_LEASE`, at 15 s; else renewed within three quarters of it,
    retried every tenth), and no node Lease watch unless ``lease_signal``."""
    signal = () if lease_signal else ("--no-watch-node-leases",)
    if leader_lease == 15.0:
        return (*SINGLE_REPLICA_LEASE, *signal)
    election = ("--lease-duration", f"{leader_lease:g}", "--renew-deadline",
                f"{leader_lease * 0.75:g}", "--retry-period", f"{leader_lease / 10:g}")  # fmt: skip
    return (*election, *signal)
