"""pytest fixtures for the local cluster. Register from the root conftest.py with
``pytest_plugins = ["e2e.cluster.pytest_plugin"]``.

- ``rtj_cluster`` (session): builds what is missing, starts the cluster once (8 nodes of 8
  GPUs unless ``RTJ_E2E_NODES``), tears it down at the end and fails if a process or a port is
  left. With ``RTJ_E2E_KUBECONFIG`` set it attaches to a running cluster instead (e.g. one
  from ``make cluster-up``) and leaves it running.
- ``rtj_real_node`` (session, on first use): a real kubelet with containerd in that cluster,
  our images (``make images``) imported; see e2e/cluster/real_node.py.
- ``rtj_ns`` (function): a fresh namespace with LocalQueue ``team-a`` bound to its own
  ClusterQueue (GPU quota: the whole cluster unless the test is marked
  ``@pytest.mark.gpu_quota(n)``); deleted afterwards, and faulted nodes are recreated.
"""

from __future__ import annotations

import itertools
import os
import shutil
import warnings
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .cluster import LocalCluster
from .cluster_state import state_root
from .diagnosis import failure_report
from .kube import Kube
from .node_health import NodeProblem
from .processes import pid_alive
from .real_node import RealNode, real_node, remove_stale
from .testenv import ClusterHandle, TestNamespace, create_test_namespace, delete_test_namespace

PYTEST_CLUSTER_NAME = "rtj-pytest"
_SEQ = itertools.count()
_CALL_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Remember whether a test's own body failed, for its fixtures' teardown to read."""
    report: pytest.TestReport = yield
    if report.when == "call":
        item.stash[_CALL_FAILED] = report.failed
    return report


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cluster: needs the local Kubernetes cluster (e2e.cluster)")
    config.addinivalue_line("markers", "gpu_quota(n): GPU quota of the test's ClusterQueue")
    config.addinivalue_line(
        "markers", "local_only: needs KWOK nodes (deselected by make e2e-kind, not skipped)"
    )


@pytest.fixture(scope="session")
def rtj_cluster() -> Iterator[ClusterHandle]:
    nodes = int(os.environ.get("RTJ_E2E_NODES", "8"))
    attach = os.environ.get("RTJ_E2E_KUBECONFIG")
    if attach:
        kube = Kube(attach)
        backend = os.environ.get("RTJ_E2E_BACKEND", "local")
        yield ClusterHandle(
            attach, kube, nodes=nodes, gpus_per_node=8, managed=False, backend=backend
        )
        kube.close()
        return
    _remove_stale_pytest_clusters()
    # one cluster per pytest process (and per fixture definition, should a conftest re-export
    # this fixture): concurrent sessions on one machine do not collide
    cluster = LocalCluster(f"{PYTEST_CLUSTER_NAME}-{os.getpid()}-{next(_SEQ)}", nodes=nodes)
    kubeconfig = cluster.up()
    kube = Kube(kubeconfig)
    try:
        yield ClusterHandle(
            str(kubeconfig),
            kube,
            nodes=nodes,
            gpus_per_node=8,
            local=cluster,
        )
    finally:
        kube.close()
        cluster.down(check=True)
        shutil.rmtree(cluster.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def rtj_real_node(rtj_cluster: ClusterHandle) -> Iterator[RealNode]:
    from images import build as images

    if not rtj_cluster.managed:
        pytest.fail("the real node joins the harness's own cluster (its CA signs the kubelet)")
    info = images.build(images.DEFAULT_OUT)
    archives = {
        name: images.DEFAULT_OUT / info["images"][name]["archive"]
        for name in ("rtj-resolver", "rtj-operator")
    }
    kubeconfig = Path(rtj_cluster.kubeconfig)
    with real_node(kubeconfig.parent, kubeconfig, archives) as node:
        yield node


def _remove_stale_pytest_clusters() -> None:
    """Stop and remove clusters of pytest processes that no longer exist."""
    root = state_root()
    if not root.is_dir():
        return
    for d in root.glob(f"{PYTEST_CLUSTER_NAME}-*"):
        pid = d.name.removeprefix(f"{PYTEST_CLUSTER_NAME}-").split("-")[0]
        if pid.isdigit() and pid_alive(int(pid)):
            continue
        if pid.isdigit() and os.geteuid() == 0:
            remove_stale(d, int(pid))  # a real node of that session, if it had one
        LocalCluster(d.name).down(check=False)
        shutil.rmtree(d, ignore_errors=True)


class SharedNodesRepaired(UserWarning):
    """The guard found shared nodes unfit and repaired them before a test."""


@dataclass
class NodeLedger:
    """Which test last left each shared node to be reset, and the repairs the guard made:
    a broken node is blamed on the test that touched it, not on the next one to need it."""

    reset_after: dict[str, str] = field(default_factory=dict)
    last_test: str = ""
    repairs: list[str] = field(default_factory=list)

    def blame(self, problems: list[NodeProblem]) -> str:
        touched = sorted({f"{self.reset_after[p.node]} ({p.node})" for p in problems
                          if p.node in self.reset_after})  # fmt: skip
        last = f"; the last test on the cluster: {self.last_test}" if self.last_test else ""
        return (
            "nodes last reset after " + ", ".join(touched) if touched else "no test reset them"
        ) + last


_LEDGER = NodeLedger()


def guard_shared_nodes(cluster: ClusterHandle, test: str) -> None:
    """Before a test that uses the shared nodes: each must be pristine with a fresh Lease of
    its own. What is not is repaired (and reported at the end of the session); what cannot
    be repaired fails this test at once, naming the node and the test that touched it.
    A repair is a warning in pytest's summary (each xdist worker's own summary is not shown)."""
    if cluster.backend != "local":
        return
    problems = cluster.node_problems()
    if not problems:
        return
    found = "; ".join(map(str, problems))
    left = cluster.repair_nodes()
    if left:
        pytest.fail(
            f"the shared nodes cannot serve {test}: {found}; after repair still "
            f"{'; '.join(map(str, left))} ({_LEDGER.blame(problems)})",
            pytrace=False,
        )
    line = f"before {test}: repaired {found} ({_LEDGER.blame(problems)})"
    _LEDGER.repairs.append(line)
    warnings.warn(SharedNodesRepaired(line), stacklevel=2)  # shown by pytest, xdist or not


@pytest.fixture
def rtj_ns(rtj_cluster: ClusterHandle, request: pytest.FixtureRequest) -> Iterator[TestNamespace]:
    guard_shared_nodes(rtj_cluster, request.node.nodeid)
    marker = request.node.get_closest_marker("gpu_quota")
    quota = int(marker.args[0]) if marker else rtj_cluster.nodes * rtj_cluster.gpus_per_node
    tn = create_test_namespace(rtj_cluster.kube, request.node.name, quota)
    try:
        yield tn
    finally:
        if request.node.stash.get(_CALL_FAILED, False):
            print(f"--- the shared cluster after the failure:\n{failure_report(rtj_cluster)}")
        delete_test_namespace(tn)
        for node in rtj_cluster.reset_nodes():
            _LEDGER.reset_after[node] = request.node.nodeid
        _LEDGER.last_test = request.node.nodeid
