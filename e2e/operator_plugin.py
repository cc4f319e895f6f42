"""pytest fixtures for tests that run the operator against the local cluster. Registered
from the root conftest.py, like e2e.cluster.pytest_plugin and e2e.s3server.

- ``rtj_api`` (session): the operator's own API adapter on the harness's kubeconfig, with
  the generated CRD installed.
- ``run_operator`` (function): ``run_operator(*extra_args, wait_leading=True, **env)`` starts
  ``python -m rtj_operator run`` watching the test's namespace; every process started is
  stopped at the end and its log printed (pytest shows it on failure).
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.operator_proc import OperatorProcess, client, install_crd
from rtj_operator.kube import Kube


@pytest.fixture(scope="session")
def rtj_api(rtj_cluster: Any) -> Iterator[Kube]:
    kube = client(rtj_cluster.kubeconfig)
    install_crd(kube)
    yield kube


@pytest.fixture
def run_operator(rtj_cluster: Any, rtj_api: Kube, rtj_ns: Any, tmp_path: Path) -> Iterator[Any]:
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
