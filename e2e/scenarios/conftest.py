"""Fixtures for the end-to-end fault drills: the operator as a process against the real
control plane of e2e.cluster (KWOK GPU nodes, JobSet, Kueue), checkpoints in a real S3 API
server on loopback. The cluster, namespace, operator and S3 fixtures come from the plugins
the root conftest.py registers; these add the harness's own client and a timeline.

Most drills are `local_only`: KWOK nodes run no containers, so a drill writes what the kubelet
and node agents would (container exits, an init container's report, node conditions), and the
trainer image is a placeholder no real kubelet could pull. The `kubectl apply` checks of
malformed specs need only an API server and run anywhere."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from scenario_support import Timeline

from e2e.cluster.kube import Kube as HarnessKube


@pytest.fixture
def hkube(rtj_cluster: Any) -> HarnessKube:
    """The harness's client: fault injection writes what the kubelet and agents would."""
    return rtj_cluster.kube  # type: ignore[no-any-return]


@pytest.fixture
def timeline(hkube: HarnessKube, rtj_ns: Any) -> Iterator[Any]:
    """``timeline(job)``: start recording the job's JobSets and pods (stopped at the end)."""
    started: list[Timeline] = []

    def start(job: str) -> Timeline:
        tl = Timeline(hkube, rtj_ns.name, job).__enter__()
        started.append(tl)
        return tl

    yield start
    for tl in started:
        tl.__exit__(None, None, None)
