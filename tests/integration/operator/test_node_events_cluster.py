"""Events naming a node count only where and from whom the node's own reporters write them
(issue 42), against the real API server and the operator process: a tenant's Event in its own
namespace naming a node changes no classification; node-problem-detector's, stored in
`default` as client-go stores Events about a Node, does.

The failure is the corpus's `torchrun_sigkill_no_oom`: a worker whose child was SIGKILLed,
nothing else known (Unknown); the host's OOM killer on its node would explain it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import faults
from e2e.operator_proc import harness_broken, rtj_body, rtj_status, running_pods, wait_for
from rtj_operator.kube import Kube
from rtj_operator.kube_errors import NotFound

pytestmark = [pytest.mark.cluster, pytest.mark.operator]

CASES = Path(__file__).resolve().parents[2] / "fixtures" / "classify"
JOB = "llm"


def _corpus(case: str, kind: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads((CASES / case / f"{kind}.json").read_text())["items"]
    return items


SIGKILLED = _corpus("torchrun_sigkill_no_oom", "pods")[0]["status"]["containerStatuses"][0][
    "state"
]["terminated"]["message"]
NPD_OOM = _corpus("npd_host_oom_explains_sigkill", "events")[0]


def _post_oom_event(kube: Kube, namespace: str, node: str) -> str:
    """node-problem-detector's OOMKilling Event about `node`, stored in `namespace`. The API
    server stores an Event whose involvedObject has no namespace only in `default`: one in a
    tenant's namespace must name that namespace (it still names the node)."""
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    involved = "" if namespace == "default" else namespace
    body = {
        **{k: v for k, v in NPD_OOM.items() if k not in ("metadata", "involvedObject")},
        "metadata": {"generateName": f"{node}.", "namespace": namespace},
        "involvedObject": {"kind": "Node", "name": node, "uid": node, "namespace": involved},
        "source": {"component": "kernel-monitor", "host": node},
        "reportingInstance": node,
        "firstTimestamp": now,
        "lastTimestamp": now,
    }
    made = kube.request("post event", "POST", f"/api/v1/namespaces/{namespace}/events", body)
    return str(made["metadata"]["name"])


@pytest.fixture
def posted(rtj_api: Kube) -> Iterator[list[tuple[str, str]]]:
    """Events the test posts, deleted after it (`default` outlives the test's namespace)."""
    names: list[tuple[str, str]] = []
    yield names
    for namespace, name in names:
        with contextlib.suppress(NotFound):
            rtj_api.request(
                "delete event", "DELETE", f"/api/v1/namespaces/{namespace}/events/{name}"
            )


def _fail_with_an_oom_event(kube: Kube, hk: Any, ns: str, where: str, posted: list[Any]) -> Any:
    """Start the job, post the OOM Event about rank 0's node in `where`, SIGKILL rank 0's
    child; the failed attempt's record once classified.

    Rank 1's collective timeout is left out: within the classifier's clock skew of rank 0's
    exit it competes on specificity and, as `NetworkFault`, wins over an unexplained SIGKILL,
    so which rank the record names would depend on whether the operator read the pods
    before or after the second exit (a real watchdog times out minutes later)."""
    kube.create_rtj(ns, rtj_body(JOB, ns, "file:///mnt/ckpt/llm"))
    pods = wait_for("attempt 1's pods to run", lambda: running_pods(kube, ns, JOB, 1, 2), 90,
                    impossible=lambda: harness_broken(kube))  # fmt: skip
    wait_for("phase Running", lambda: rtj_status(kube, ns, JOB).get("phase") == "Running", 30)
    victim = min(pods, key=lambda p: str(p["metadata"]["name"]))
    posted.append((where, _post_oom_event(kube, where, victim["spec"]["nodeName"])))
    faults.terminate_container(hk, ns, victim["metadata"]["name"], exit_code=1, message=SIGKILLED)

    def classified() -> dict[str, Any] | None:
        records = rtj_status(kube, ns, JOB).get("attempts") or []
        return next((r for r in records if r.get("attempt") == 1 and r.get("failureClass")), None)

    record = wait_for("attempt 1's classified record", classified, 60)
    assert record["firstFailed"]["pod"] == victim["metadata"]["name"], record
    return record


def test_a_tenants_event_naming_a_node_changes_no_classification(
    rtj_api: Kube, rtj_cluster: Any, rtj_ns: Any, run_operator: Any, posted: list[Any]
) -> None:
    ns = rtj_ns.name
    run_operator()
    record = _fail_with_an_oom_event(rtj_api, rtj_cluster.kube, ns, ns, posted)
    assert record["failureClass"] == "Unknown", record
    assert not any("OOMKilling" in line for line in record["evidence"]), record


def test_the_node_problem_detectors_event_in_default_explains_the_failure(
    rtj_api: Kube, rtj_cluster: Any, rtj_ns: Any, run_operator: Any, posted: list[Any]
) -> None:
    ns = rtj_ns.name
    run_operator()
    record = _fail_with_an_oom_event(rtj_api, rtj_cluster.kube, ns, "default", posted)
    assert record["failureClass"] == "OutOfMemory", record
    assert any("OOMKilling" in line for line in record["evidence"]), record
