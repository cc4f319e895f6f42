"""The pod runner's nodes for a scenario whose pods must really run (as local processes):
tainted nodes of their own beside the session's KWOK nodes, ready before the test goes on,
deregistered after it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from e2e.operator_proc import REPO, wait_for
from e2e.podrunner.runner import PodRunner


@contextmanager
def runner_nodes(
    rtj_cluster: Any, root: Path, *, nodes: int, prefix: str, taint: dict[str, str]
) -> Iterator[PodRunner]:
    """`nodes` tainted pod-runner nodes named `prefix`0, 1, ... (this checkout's virtualenv
    stands for every image)."""
    r = PodRunner(rtj_cluster.kubeconfig, root, nodes=nodes, prefix=prefix, taints=[taint],
                  workdir=REPO)  # fmt: skip
    stop = threading.Event()
    thread = threading.Thread(target=r.run, args=(stop,), daemon=True)
    thread.start()
    wait_for("the runner's nodes", lambda: nodes_ready(rtj_cluster, r.node_names), 60)
    try:
        yield r
    finally:
        stop.set()
        r.shutdown()
        r.deregister_nodes()


def nodes_ready(rtj_cluster: Any, names: list[str]) -> bool:
    for name in names:
        try:
            node = rtj_cluster.kube.core.read_node(name)
        except k8s.ApiException:
            return False
        if not any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or []):
            return False
    return True
