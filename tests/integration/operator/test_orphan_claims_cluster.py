"""Quarantine claims whose job is gone without releasing them (issue 42): a tenant may patch
its own job, and one that drops the `release-quarantines` finalizer and deletes the job left
its taint and claim on the node for good. The operator's sweep releases them, against the
real API server: the sweep alone (its LIST, namespaces and grace), then the operator process
after a real quarantine."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from e2e.cluster import faults
from e2e.operator_proc import harness_broken, rtj_body, rtj_status, running_pods, wait_for
from rtj_operator import reconcile as rc
from rtj_operator.api import keys
from rtj_operator.claim_sweep import ClaimSweep
from rtj_operator.kube import Kube
from rtj_operator.kube_errors import NotFound
from rtj_operator.reconcile.orphan_claims import NodeClaim, node_claims

pytestmark = [pytest.mark.cluster, pytest.mark.operator]

TAINT = {"key": keys.DEFAULT_TAINT_KEY, "value": "llm", "effect": "NoSchedule"}
SLOT = f"{keys.DEFAULT_TAINT_KEY}:NoSchedule"
GRACE = timedelta(minutes=2)


def _claim(kube: Kube, node: str, who: rc.Claimant) -> None:
    """Claim TAINT on `node` for `who` as the operator does (TaintNode)."""
    kube.edit_node(node, lambda t, a: rc.claim(t, a, TAINT, who), keys.QUARANTINE_OWNERS_ANNOTATION)


def _our_taints(kube: Kube, node: str) -> list[dict[str, Any]]:
    taints = (kube.get_node(node).get("spec") or {}).get("taints") or []
    return [t for t in taints if t.get("key") == keys.DEFAULT_TAINT_KEY]


def _claims(kube: Kube, node: str) -> list[NodeClaim]:
    return node_claims(kube.get_node(node))


def _gone(kube: Kube, ns: str, name: str) -> bool:
    try:
        kube.get_rtj(ns, name)
    except NotFound:
        return True
    return False


class Clock:
    def __init__(self) -> None:
        self.now = datetime.now(timezone.utc)

    def __call__(self) -> datetime:
        return self.now


def test_the_sweep_releases_only_claims_of_gone_jobs_it_may_judge_after_their_grace(
    rtj_api: Kube, rtj_cluster: Any, rtj_ns: Any
) -> None:
    ns, node = rtj_ns.name, rtj_cluster.node_names[0]
    rtj_api.create_rtj(ns, rtj_body("kept", ns, "file:///mnt/ckpt/kept"))
    uid = rtj_api.get_rtj(ns, "kept")["metadata"]["uid"]
    kept = rc.Claimant(f"{ns}/kept", uid)
    gone = rc.Claimant(f"{ns}/gone", "5e0b9f0c-0000-4000-8000-00000000dead")
    elsewhere = rc.Claimant("team-elsewhere/big", "5e0b9f0c-0000-4000-8000-0000000000e1")
    for who in (gone, kept, elsewhere):
        _claim(rtj_api, node, who)
    clock = Clock()
    sweep = ClaimSweep(rtj_api, [ns], GRACE, clock)

    def run() -> list[NodeClaim]:
        # no job in the cache: only the API server's LIST keeps a live job's claim
        return sweep.run([rtj_api.get_node(node)], known_uids=set())

    try:
        assert run() == [], "an orphan is first only suspected"
        clock.now += GRACE
        assert run() == [NodeClaim(node, SLOT, gone.job, gone.uid)]
        assert {c.uid for c in _claims(rtj_api, node)} == {kept.uid, elsewhere.uid}
        assert _our_taints(rtj_api, node) == [TAINT], "still held by the others"
        assert run() == [], "released once"

        rtj_api.delete_rtj(ns, "kept")  # no operator ran: no finalizer held it
        wait_for("the job gone", lambda: _gone(rtj_api, ns, "kept"), 30)
        assert run() == []
        clock.now += GRACE
        assert run() == [NodeClaim(node, SLOT, kept.job, kept.uid)]
        # a job in a namespace this operator does not watch may well exist: never judged
        assert [c.uid for c in _claims(rtj_api, node)] == [elsewhere.uid]
        assert _our_taints(rtj_api, node) == [TAINT]
    finally:  # the node as it was (a tainted node would be re-created after the test)
        for who in (gone, kept, elsewhere):
            rtj_api.edit_node(
                node, lambda t, a, w=who: rc.release(t, a, TAINT, w),
                keys.QUARANTINE_OWNERS_ANNOTATION,
            )  # fmt: skip
    assert _our_taints(rtj_api, node) == [] and _claims(rtj_api, node) == []


CUDA_CRASH = "RuntimeError: CUDA error: unspecified launch failure"
NCCL_TIMEOUT = "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=42)"
SWEEP_FLAGS = ("--claim-sweep-seconds", "1", "--claim-sweep-grace-seconds", "2")


def test_a_job_deleted_without_its_finalizer_has_its_quarantine_released_by_the_operator(
    rtj_api: Kube, rtj_cluster: Any, rtj_ns: Any, run_operator: Any
) -> None:
    ns, job = rtj_ns.name, "llm"
    op = run_operator(*SWEEP_FLAGS)
    rtj_api.create_rtj(ns, rtj_body(job, ns, "file:///mnt/ckpt/llm"))
    pods = wait_for("attempt 1's pods to run", lambda: running_pods(rtj_api, ns, job, 1, 2), 90,
                    impossible=lambda: harness_broken(rtj_api))  # fmt: skip
    wait_for("phase Running", lambda: rtj_status(rtj_api, ns, job).get("phase") == "Running", 30)
    victim, other = pods
    node = victim["spec"]["nodeName"]
    faults.gpu_xid(rtj_cluster.kube, node, 79)  # the GPU health agent's XID 79
    hk = rtj_cluster.kube
    faults.terminate_container(hk, ns, victim["metadata"]["name"], exit_code=1, message=CUDA_CRASH)
    faults.terminate_container(hk, ns, other["metadata"]["name"], exit_code=1, message=NCCL_TIMEOUT)
    uid = rtj_api.get_rtj(ns, job)["metadata"]["uid"]
    claim = NodeClaim(node, SLOT, f"{ns}/{job}", uid)
    wait_for("the node quarantined", lambda: claim in _claims(rtj_api, node), 60)
    assert {**TAINT, "value": job} in _our_taints(rtj_api, node)
    assert keys.RELEASE_FINALIZER in rtj_api.get_rtj(ns, job)["metadata"]["finalizers"]

    # the tenant drops the finalizer and deletes the job, while no operator runs to see it
    # (a running one may add the finalizer back first, and release on the deletion itself)
    op.stop()
    rtj_api.request("drop the finalizer", "PATCH", f"/apis/{keys.API_VERSION}/namespaces/{ns}/"
                    f"{keys.PLURAL}/{job}", {"metadata": {"finalizers": None}},
                    content_type="application/merge-patch+json")  # fmt: skip
    rtj_api.delete_rtj(ns, job)
    wait_for("the job gone", lambda: _gone(rtj_api, ns, job), 30)
    assert claim in _claims(rtj_api, node), "nothing released it"

    op = run_operator(*SWEEP_FLAGS)
    wait_for("the orphaned claim released", lambda: claim not in _claims(rtj_api, node), 30)
    assert _our_taints(rtj_api, node) == [], "the taint went with the last claim"
    annotations = rtj_api.get_node(node)["metadata"].get("annotations") or {}
    assert keys.QUARANTINE_OWNERS_ANNOTATION not in annotations, json.dumps(annotations)
    assert "released the quarantine claim" in op.log()
