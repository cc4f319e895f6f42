"""The platform's preflight on the operator's side (issue 43 section 3, `policy.preflight`):
rendered as the first init container of every worker and spare pod where the job keeps it
on and the platform has an image; a failed verdict from the platform's image blames its node.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from rtj_world import reading, rtj_raw, snapshot

from rtj_operator import reconcile as rc
from rtj_operator.api import keys
from rtj_operator.api.reasons import FailureClass
from rtj_operator.api.resource import ResilientTrainingJob
from rtj_operator.policy.preflight import (
    PREFLIGHT_INIT_CONTAINER,
    PreflightPolicy,
    preflight_finding,
    same_image,
)
from rtj_operator.policy.render import avoided_nodes

IMAGE = "ghcr.io/resilient-training/rtj-resolver:0.1.0"
FAILED = json.dumps({"passed": False, "check": "node", "reason": "dcgmi diag exited 226"})


def _jobset(platform: PreflightPolicy | None, resolver: str | None = IMAGE, **spec: Any) -> Any:
    snap = snapshot(rtj_raw(**spec), store=reading(1200))
    snap = replace(snap, resolver_image=resolver, preflight=platform or PreflightPolicy())
    plan = rc.plan(snap)
    (create,) = [a for a in plan.actions if isinstance(a, rc.CreateJobSet)]
    return create.body


def _pods(js: Any) -> list[Any]:
    return [rj["template"]["spec"]["template"]["spec"] for rj in js["spec"]["replicatedJobs"]]


def test_every_worker_pod_runs_the_platforms_preflight_first() -> None:
    platform = PreflightPolicy(None, ("dcgmi", "diag", "-r", "1"))
    (spec,) = _pods(_jobset(platform, preflight={"timeoutSeconds": 90, "bandwidthFactor": 3}))
    first, *rest = spec["initContainers"]
    assert first["name"] == PREFLIGHT_INIT_CONTAINER and first["image"] == IMAGE
    assert first["command"] == [
        "rtj-shim", "preflight", "--timeout", "90", "--factor", "3",
        "--termination-log", keys.TERMINATION_LOG, "--", "dcgmi", "diag", "-r", "1",
    ]  # fmt: skip
    env = {e["name"] for e in first["env"]}
    assert {"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "NODE_RANK", "RTJ_POD_IP"} <= env
    assert {"RTJ_NODE_NAME", keys.ENV_INDEX_FAILURES} <= env
    resume = next(c for c in rest if c["name"] == keys.RESUME_INIT_CONTAINER)
    assert first["securityContext"] == resume["securityContext"], "restricted, as ours are"
    assert first["terminationMessagePath"] == keys.TERMINATION_LOG


def test_no_preflight_when_the_job_turns_it_off_or_the_platform_has_no_image() -> None:
    for js in (
        _jobset(PreflightPolicy(), preflight={"enabled": False}),
        _jobset(PreflightPolicy(), resolver=None),  # the trainer's image is the tenant's
    ):
        names = [c["name"] for c in _pods(js)[0]["initContainers"]]
        assert PREFLIGHT_INIT_CONTAINER not in names, names
    own = _pods(_jobset(PreflightPolicy("registry.example/dcgm-rtj:1"), resolver=None))[0]
    assert own["initContainers"][0]["image"] == "registry.example/dcgm-rtj:1"


def test_a_failed_verdict_blames_its_node_only_from_the_platforms_image() -> None:
    cls, why, blamed = preflight_finding(FAILED, 1, f"docker.io/{IMAGE}", IMAGE)
    assert cls is FailureClass.PREFLIGHT_FAILED and blamed and "dcgmi diag exited 226" in why
    cls, why, blamed = preflight_finding(FAILED, 1, "ghcr.io/team-a/fake:1", IMAGE)
    assert cls is FailureClass.PREFLIGHT_FAILED and not blamed and "not the platform's" in why
    assert preflight_finding("Traceback ...", 1, IMAGE, IMAGE)[0] is FailureClass.UNKNOWN
    passed = json.dumps({"passed": True, "reason": ""})
    assert preflight_finding(passed, 137, IMAGE, IMAGE)[0] is FailureClass.UNKNOWN


def test_runtimes_report_short_names_fully_qualified() -> None:
    assert same_image("docker.io/library/rtj:1", "rtj:1")
    assert not same_image("", "rtj:1") and not same_image("rtj:2", "rtj:1")


def test_a_slow_link_is_avoided_by_the_job_never_tainted() -> None:
    """The ring is measured with the job's own pods (the tenant can slow them): no taint;
    the job's next attempt keeps off the node, and only this job's."""
    slow = json.dumps({"passed": False, "check": "collective", "reason": "rank 2 sent at 9 MB/s"})
    cls, why, blamed = preflight_finding(slow, 1, IMAGE, IMAGE)
    assert cls is FailureClass.PREFLIGHT_FAILED and not blamed and "avoids the node" in why
    failed = {"attempt": 1, "jobSet": "llm-a1", "failureClass": "PreflightFailed",
              "firstFailed": {"pod": "llm-a1-worker-0-2-x", "node": "gpu-node-007",
                              "container": "trainer"}}  # fmt: skip
    rtj = ResilientTrainingJob.from_object(rtj_raw({"attempt": 1, "attempts": [failed]}))
    assert avoided_nodes(rtj, 2) == ["gpu-node-007"]
    assert avoided_nodes(rtj, 3) == [], "the attempt after next may use it again"
