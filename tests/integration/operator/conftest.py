"""Operator tests against the real API server of the local cluster harness (e2e.cluster).

The harness's fixtures (`rtj_cluster`, `rtj_ns`) come from e2e.cluster.pytest_plugin, which
the root conftest registers, like the S3 server fixtures of e2e.s3server.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rtj_operator_proc import OperatorProcess, client, install_crd

from rtj_operator.kube import Kube


@pytest.fixture(scope="session")
def rtj_api(rtj_cluster: Any) -> Iterator[Kube]:
    """The operator's own API adapter on the harness's kubeconfig, with the CRD installed."""
    kube = client(rtj_cluster.kubeconfig)
    install_crd(kube)
    yield kube


@pytest.fixture
def run_operator(rtj_cluster: Any, rtj_api: Kube, rtj_ns: Any, tmp_path: Path) -> Iterator[Any]:
    """Start operators (`run_operator()`), watching only the test's namespace; all are
    stopped at the end and their logs printed on failure."""
    started: list[OperatorProcess] = []
    lease = f"rtj-{uuid.uuid4().hex[:6]}"

    def start(*extra: str, wait_leading: bool = True, **env: str) -> OperatorProcess:
        proc = OperatorProcess(
            rtj_cluster.kubeconfig, rtj_ns.name, tmp_path, lease_name=lease, extra=extra, env=env
        )
        started.append(proc)
        return proc.start(wait_leading=wait_leading)

    yield start
    for proc in started:
        proc.stop()
    for proc in started:
        sys.stdout.write(
            f"\n--- {proc.log_path.name} (last 4000 chars) ---\n{proc.log()[-4000:]}\n"
        )
