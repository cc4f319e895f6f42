"""node_health: which shared KWOK nodes can serve the next test, and the guard's verdict."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

import pytest

from e2e.cluster import pytest_plugin
from e2e.cluster.node_health import (
    LeaseView,
    NodeProblem,
    NodeTrouble,
    NodeView,
    kwok_lease_troubles,
    node_problems,
)

NAMES = ["gpu-node-00", "gpu-node-01"]


def _fit() -> tuple[dict[str, NodeView], dict[str, LeaseView]]:
    nodes = {n: NodeView(n, f"uid-{n}", pristine=True) for n in NAMES}
    leases = {n: LeaseView(n, (f"uid-{n}",), 2.0) for n in NAMES}
    return nodes, leases


def test_fit_nodes_have_no_problem() -> None:
    nodes, leases = _fit()
    assert node_problems(NAMES, nodes, leases, lease_seconds=20) == []


def test_a_lease_kwok_has_not_yet_given_an_owner_is_fit() -> None:
    nodes, leases = _fit()
    leases["gpu-node-00"] = LeaseView("gpu-node-00", (), 1.0)
    assert node_problems(NAMES, nodes, leases, lease_seconds=20) == []


@pytest.mark.parametrize(
    ("lease", "trouble", "detail"),
    [
        (None, NodeTrouble.NO_LEASE, ""),
        (LeaseView("gpu-node-01", ("uid-old",), 1.0), NodeTrouble.LEASE_OF_OLD_NODE, "uid-old"),
        (LeaseView("gpu-node-01", ("uid-gpu-node-01",), 21.0), NodeTrouble.LEASE_STALE, "21s"),
        (LeaseView("gpu-node-01", ("uid-gpu-node-01",), None), NodeTrouble.LEASE_STALE, "never"),
    ],
)
def test_lease_troubles(lease: LeaseView | None, trouble: NodeTrouble, detail: str) -> None:
    nodes, leases = _fit()
    if lease is None:
        del leases["gpu-node-01"]
    else:
        leases["gpu-node-01"] = lease
    [problem] = node_problems(NAMES, nodes, leases, lease_seconds=20)
    assert (problem.node, problem.trouble) == ("gpu-node-01", trouble)
    assert detail in str(problem)


def test_a_missing_node_and_a_faulted_one() -> None:
    nodes, leases = _fit()
    del nodes["gpu-node-00"]
    nodes["gpu-node-01"] = NodeView("gpu-node-01", "uid-gpu-node-01", pristine=False)
    assert node_problems(NAMES, nodes, leases, lease_seconds=20) == [
        NodeProblem("gpu-node-00", NodeTrouble.MISSING),
        NodeProblem("gpu-node-01", NodeTrouble.NOT_PRISTINE),
    ]


@dataclass
class _Cluster:
    """Stands in for ClusterHandle in the guard's verdict (pure: no cluster is reached)."""

    found: list[NodeProblem]
    left: list[NodeProblem]
    backend: str = "local"
    repaired: list[bool] = field(default_factory=list)

    def node_problems(self) -> list[NodeProblem]:
        return self.found

    def repair_nodes(self) -> list[NodeProblem]:
        self.repaired.append(True)
        return self.left


def test_the_guard_fails_the_test_naming_the_node_and_who_touched_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ledger = pytest_plugin.NodeLedger(reset_after={"gpu-node-03": "tests/x.py::test_faults"})
    monkeypatch.setattr(pytest_plugin, "_LEDGER", ledger)
    stale = NodeProblem("gpu-node-03", NodeTrouble.LEASE_STALE, "last renewed 95s ago")
    cluster = _Cluster(found=[stale], left=[stale])
    with pytest.raises(pytest.fail.Exception) as failed:
        pytest_plugin.guard_shared_nodes(cluster, "tests/y.py::test_next")  # type: ignore[arg-type]
    message = str(failed.value)
    assert "gpu-node-03: Lease not renewed (last renewed 95s ago)" in message
    assert "tests/x.py::test_faults (gpu-node-03)" in message
    assert "tests/y.py::test_next" in message
    assert ledger.repairs == []


def test_the_guard_reports_what_it_repaired(monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = pytest_plugin.NodeLedger()
    monkeypatch.setattr(pytest_plugin, "_LEDGER", ledger)
    old = NodeProblem("gpu-node-02", NodeTrouble.LEASE_OF_OLD_NODE, "owner uid-1")
    cluster = _Cluster(found=[old], left=[])
    with pytest.warns(pytest_plugin.SharedNodesRepaired, match="repaired gpu-node-02"):
        pytest_plugin.guard_shared_nodes(cluster, "tests/y.py::test_next")  # type: ignore[arg-type]
    assert cluster.repaired == [True]
    assert ledger.repairs == [
        "before tests/y.py::test_next: repaired gpu-node-02: Lease owned by an earlier Node "
        "of that name (owner uid-1) (no test reset them)"
    ]


def test_the_guard_leaves_fit_nodes_alone() -> None:
    cluster = _Cluster(found=[], left=[])
    pytest_plugin.guard_shared_nodes(cluster, "t")  # type: ignore[arg-type]
    assert cluster.repaired == []


NOW = dt.datetime(2026, 12, 5, 1, 0, 0, tzinfo=dt.timezone.utc)


def _node_json(name: str, uid: str, managed: str = "kwok") -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": uid, "labels": {"type": managed}}}


def _lease_json(name: str, owner: str, renewed: dt.datetime | None) -> dict[str, Any]:
    spec = {"renewTime": renewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ")} if renewed else {}
    return {
        "metadata": {"name": name, "ownerReferences": [{"kind": "Node", "uid": owner}]},
        "spec": spec,
    }


def test_kwok_lease_troubles_count_only_nodes_kwok_manages() -> None:
    nodes = [
        _node_json("gpu-node-00", "u0"),
        _node_json("gpu-node-01", "u1"),
        _node_json("gpu-node-02", "u2", managed="lost"),  # faults.node_lost: meant to go stale
    ]
    leases = [
        _lease_json("gpu-node-00", "u0", NOW - dt.timedelta(seconds=3)),
        _lease_json("gpu-node-01", "u1-old", NOW - dt.timedelta(seconds=3)),
        _lease_json("gpu-node-02", "u2", NOW - dt.timedelta(seconds=300)),
    ]
    troubles = kwok_lease_troubles(nodes, leases, now=NOW, lease_seconds=20)
    assert [(p.node, p.trouble) for p in troubles] == [
        ("gpu-node-01", NodeTrouble.LEASE_OF_OLD_NODE)
    ]


def test_kwok_lease_troubles_a_lease_not_renewed() -> None:
    nodes = [_node_json("gpu-node-00", "u0")]
    leases = [_lease_json("gpu-node-00", "u0", NOW - dt.timedelta(seconds=95))]
    [trouble] = kwok_lease_troubles(nodes, leases, now=NOW, lease_seconds=20)
    assert str(trouble) == "gpu-node-00: Lease not renewed (last renewed 95s ago)"
