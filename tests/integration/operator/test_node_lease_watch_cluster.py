"""The operator's node Lease watch against the real API server, reached through a loopback
TCP forwarder whose open connections can go dead (no FIN, no error: as behind a load
balancer that dropped its state). KWOK renews every shared node's Lease all along.

A watch that stopped delivering looks exactly like a partition; the operator holds every
job during a partition, so believing it would stall them all (stop 62's CI: two tests held
for 90 s under "most nodes stopped renewing their Leases at once")."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import urlsplit

import pytest
from kubernetes import client, config
from loop_thread import LoopThread

from e2e.tcp_proxy import TcpProxy
from rtj_operator import node_leases
from rtj_operator.kube import Kube
from rtj_operator.node_leases import NodeLeases

pytestmark = [pytest.mark.cluster, pytest.mark.operator]


@pytest.fixture
def proxied(rtj_cluster: Any) -> Iterator[tuple[Kube, TcpProxy, list[str]]]:
    """The operator's API adapter reaching the API server through the forwarder, and the
    kinds of the requests it made."""
    configuration = client.Configuration()
    config.load_kube_config(config_file=rtj_cluster.kubeconfig, client_configuration=configuration)
    upstream = urlsplit(configuration.host)
    proxy = TcpProxy(upstream.port or 443).up()
    configuration.host = f"https://127.0.0.1:{proxy.port}"
    requests: list[str] = []
    kube = Kube(client.ApiClient(configuration), on_request=lambda verb, *_: requests.append(verb))
    yield kube, proxy, requests
    proxy.down()


class Watching(LoopThread):
    """`NodeLeases.run` on an event loop of its own (a thread), as the operator runs it."""

    def __init__(self, kube: Kube, nodes: set[str]) -> None:
        self.leases = NodeLeases(
            lambda name: None,
            lambda: None,
            lambda: datetime.now(timezone.utc),
            node_exists=nodes.__contains__,
        )
        super().__init__(lambda: self.leases.run(kube))


def _until(what: str, check: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _newest_renewal(watching: Watching, nodes: set[str]) -> datetime:
    """The newest renewal the watcher knows of among the shared nodes."""
    known = watching.leases.of(sorted(nodes))
    return max(lease.renewed_at for lease in known.values())


def test_a_lease_watch_gone_dead_is_no_partition_a_fresh_list_says_so(
    rtj_cluster: Any, proxied: tuple[Kube, TcpProxy, list[str]]
) -> None:
    """The watch's connection goes dead: every Lease looks overdue within ~6 s (KWOK's 20 s
    Lease, renewed every 5 s), which would hold every job for the minute until the watch's
    idle limit. A fresh LIST over a new connection shows the renewals: the watcher's view
    keeps up with KWOK and says the watch is behind. (Whether a loaded machine's KWOK is
    itself late by more than a second, a brief real partition, is not this test's.)"""
    kube, proxy, _ = proxied
    nodes = set(rtj_cluster.node_names)
    watching = Watching(kube, nodes)
    try:
        _until("every shared node's Lease known", lambda: nodes <= set(watching.leases.leases))
        assert proxy.stall() >= 1, "the watch's connection was open"
        stalled_at = datetime.now(timezone.utc)
        time.sleep(15)  # past the overdue point twice over; the idle limit is 60 s
        assert watching.leases.confirmations >= 1, "the watch's view looked like a partition"
        newest = _newest_renewal(watching, nodes)
        assert newest > stalled_at + timedelta(seconds=5), (
            f"the watcher's newest renewal is {newest}, the watch died at {stalled_at}"
        )
    finally:
        watching.stop()


def test_a_lease_watch_idle_past_its_limit_is_listed_and_watched_again(
    rtj_cluster: Any, proxied: tuple[Kube, TcpProxy, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a 2 s idle limit, a dead watch connection is dropped, the Leases listed and
    watched again: the watcher's view keeps up with KWOK."""
    monkeypatch.setattr(node_leases, "WATCH_IDLE_SECONDS", 2.0)
    kube, proxy, requests = proxied
    nodes = set(rtj_cluster.node_names)
    watching = Watching(kube, nodes)
    try:
        _until("every shared node's Lease known", lambda: nodes <= set(watching.leases.leases))
        watches = requests.count("watch")
        proxy.stall()
        stalled_at = datetime.now(timezone.utc)
        _until("a new watch", lambda: requests.count("watch") > watches, timeout=40)
        _until(
            "a renewal seen after the stall",
            lambda: _newest_renewal(watching, nodes) > stalled_at + timedelta(seconds=3),
            timeout=30,
        )
    finally:
        watching.stop()
