"""The shared cluster survives a node re-created under its old name (issue 41).

KWOK v0.8.0 renews a node's Lease from its cache. When the harness re-creates a faulted
node while the old Node's Lease still exists (its garbage collection is asynchronous, and
slow on a busy machine), KWOK keeps renewing that Lease; once the collector removes it,
KWOK's renewals fail for good (``Precondition failed: UID in precondition``) and the node
goes unreachable for every later test (shared/notes/kwok-lease-recreate.md).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from e2e.cluster import faults
from e2e.cluster.kube import eventually
from e2e.cluster.node_health import NodeTrouble
from e2e.cluster.pytest_plugin import SharedNodesRepaired, guard_shared_nodes
from e2e.cluster.testenv import NODE_LEASE_NAMESPACE, ClusterHandle, TestNamespace
from e2e.operator_proc import client, harness_broken

pytestmark = [pytest.mark.cluster, pytest.mark.local_only]


@contextlib.contextmanager
def cpu_hogs(n: int = 2) -> Iterator[None]:
    """A busy machine: ``n`` processes spinning for as long as the block runs."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


@contextlib.contextmanager
def controller_manager_frozen(cluster: ClusterHandle, seconds: float) -> Iterator[None]:
    """The kube-controller-manager (its garbage collector with it) frozen for ``seconds``,
    as on a machine too busy to run it: the block runs meanwhile and goes on after."""
    assert cluster.local is not None
    pid = cluster.local.proc("kube-controller-manager").pid
    os.killpg(pid, signal.SIGSTOP)
    thaw = threading.Timer(seconds, os.killpg, (pid, signal.SIGCONT))
    thaw.start()
    try:
        yield
    finally:
        thaw.cancel()
        os.killpg(pid, signal.SIGCONT)


def _lease_owner(cluster: ClusterHandle, node: str) -> set[str]:
    lease = cluster.kube.coord.read_namespaced_lease(node, NODE_LEASE_NAMESPACE)
    return {o.uid for o in lease.metadata.owner_references or []}


def test_a_node_recreated_while_its_old_lease_exists_gets_a_lease_of_its_own(
    rtj_cluster: ClusterHandle, rtj_ns: TestNamespace
) -> None:
    node = rtj_cluster.node_names[-1]
    faults.gpu_xid(rtj_cluster.kube, node, 79)
    old_uid = rtj_cluster.kube.core.read_node(node).metadata.uid
    assert _lease_owner(rtj_cluster, node) == {old_uid}
    with cpu_hogs(), controller_manager_frozen(rtj_cluster, 5.0):
        assert rtj_cluster.reset_nodes() == [node]
        new_uid = rtj_cluster.kube.core.read_node(node).metadata.uid
        assert new_uid != old_uid
        # before the fix the reset returned here, the old Node's Lease still in place
        assert _lease_owner(rtj_cluster, node) in ({new_uid}, set())
        assert rtj_cluster.node_problems([node]) == []
    # and it stays renewed once the collector runs again: two renewal periods later
    time.sleep(rtj_cluster.lease_seconds / 2)
    assert rtj_cluster.node_problems([node]) == []


def test_the_guard_repairs_a_lease_nobody_renews(
    rtj_cluster: ClusterHandle, request: pytest.FixtureRequest
) -> None:
    """A Lease another holder took and stopped renewing stands for KWOK's stuck renewals:
    the guard finds it, deletes it, restarts KWOK and the node serves the next test."""
    node = rtj_cluster.node_names[-2]
    stale = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=rtj_cluster.lease_seconds + 5)
    rtj_cluster.kube.coord.patch_namespaced_lease(
        node,
        NODE_LEASE_NAMESPACE,
        {
            "spec": {
                "holderIdentity": "someone-else",
                "leaseDurationSeconds": 3600,
                "renewTime": stale.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            }
        },
    )
    [problem] = rtj_cluster.node_problems()
    assert (problem.node, problem.trouble) == (node, NodeTrouble.LEASE_STALE)
    operator_kube = client(rtj_cluster.kubeconfig)
    assert f"{node}: Lease not renewed" in (harness_broken(operator_kube) or "")
    kwok_before = rtj_cluster.local.proc("kwok").pid if rtj_cluster.local else None
    holders_before = _holders(rtj_cluster)
    with pytest.warns(SharedNodesRepaired, match=f"repaired {node}: Lease not renewed"):
        guard_shared_nodes(rtj_cluster, request.node.nodeid)
    assert rtj_cluster.node_problems() == []
    assert rtj_cluster.local is not None and rtj_cluster.local.proc("kwok").pid != kwok_before
    lease = rtj_cluster.kube.coord.read_namespaced_lease(node, NODE_LEASE_NAMESPACE)
    assert lease.spec.holder_identity != "someone-else"
    # every Lease is the new KWOK's at once (its holder identity is new): none left to the
    # old one, unrenewed until it expires (~20 s in which an operator sees a partition)
    holders = _holders(rtj_cluster)
    assert len(set(holders.values())) == 1 and not set(holders.values()) & set(
        holders_before.values()
    ), (holders_before, holders)
    assert harness_broken(operator_kube) is None
    eventually(
        f"node {node} Ready",
        lambda: faults.node_ready_status(rtj_cluster.kube, node) == "True",
        30,
    )


def _holders(cluster: ClusterHandle) -> dict[str, str]:
    """Each shared node's Lease holder."""
    leases = cluster.kube.coord.list_namespaced_lease(NODE_LEASE_NAMESPACE).items
    names = set(cluster.node_names)
    return {
        lease.metadata.name: lease.spec.holder_identity
        for lease in leases
        if lease.metadata.name in names
    }
