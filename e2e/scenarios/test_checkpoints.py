"""Drills: the checkpoint store under stress. Steps are published by the shim's real commit
protocol into a real S3 API server on loopback, so the operator's selection (shallow) and the
init container's verification (deep, the real `rtj-shim resolve`) are the real ones.

- a pinned step whose shard is corrupt fails the init container: `CheckpointCorrupt`, the
  next attempt pins the previous verified step, and the bad step is never pinned again;
- an unreachable store holds the restart (never "start from scratch") until it is back;
- a store the job's credentials cannot read blocks the first attempt;
- a checkpoint older than twice its planned interval shows in `kubectl get rtj` and in
  `rtj_checkpoint_last_success_timestamp_seconds`.
"""

from __future__ import annotations

import base64
import re
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from scenario_kubelet import kubelet_reports_init_failure
from scenario_support import (
    NCCL_TIMEOUT,
    WAIT,
    by_rank,
    condition,
    condition_true,
    failed_record,
    pinned_step,
    shim_resolve,
    start_job,
    wait_events,
    wait_running,
)

from e2e.cluster import faults
from e2e.cluster.build import kubectl
from e2e.operator_proc import jobsets_of, publish_steps, rtj_body, rtj_status, wait_for
from e2e.tcp_proxy import TcpProxy
from rtj_operator.api import keys
from rtj_operator.kube import Kube

pytestmark = [pytest.mark.cluster, pytest.mark.operator, pytest.mark.local_only, pytest.mark.s3]

JOB = "llm"


def _step_object(root: str, step: int, name: str) -> tuple[str, str]:
    bucket, _, prefix = root.removeprefix("s3://").partition("/")
    return bucket, f"{prefix}/steps/step-{step:012d}/{name}"


def _fail_world(kube: Any, ns: str, pods: dict[int, dict[str, Any]]) -> None:
    """Rank 0 dies of a collective error (an infrastructure failure, no node to blame)."""
    faults.terminate_container(kube, ns, pods[0]["metadata"]["name"], exit_code=1,
                               message=NCCL_TIMEOUT.format(rank=0))  # fmt: skip


# --- a corrupt checkpoint ------------------------------------------------------------------


def test_a_corrupt_pinned_step_is_marked_bad_and_the_previous_verified_step_is_pinned(
    rtj_api: Kube, hkube: Any, rtj_ns: Any, run_operator: Any, s3_root: str, s3_admin: Any,
    tmp_path: Path,
) -> None:  # fmt: skip
    ns = rtj_ns.name
    publish_steps(s3_root, [100, 200], tmp_path, run_id=f"{ns}.{JOB}")
    # bit rot in step 200's shard: same size (shallow verification passes), other bytes
    bucket, key = _step_object(s3_root, 200, "model.pt")
    shard = s3_admin.get_object(Bucket=bucket, Key=key)["Body"].read()
    s3_admin.put_object(Bucket=bucket, Key=key, Body=bytes(b ^ 0xFF for b in shard))

    op = run_operator()
    pods = by_rank(start_job(rtj_api, ns, JOB, s3_root, replicas=2))
    assert all(pinned_step(p) == 200 for p in pods.values()), "newest shallowly verified step"

    # what every rank's init container reports: the real `rtj-shim resolve` on that store
    resolve = shim_resolve(s3_root, 200, tmp_path)
    assert resolve.returncode == 1, resolve
    assert "sha256" in resolve.termination_message, resolve
    for rank in sorted(pods):
        try:
            kubelet_reports_init_failure(hkube, ns, pods[rank]["metadata"]["name"],
                                         exit_code=resolve.returncode,
                                         message=resolve.termination_message)  # fmt: skip
        except ApiException as exc:
            # the operator may act on rank 0's report before rank 1's is written: its pods
            # are already deleted (a checkpoint verdict is recorded at once)
            if exc.status != 404 or rank == min(pods):
                raise

    record = failed_record(rtj_api, ns, JOB, 1)
    assert record["failureClass"] == "CheckpointCorrupt", record
    assert record["firstFailed"]["container"] == keys.RESUME_INIT_CONTAINER
    # the init container's own verdict, quoted: which step, which file, the sha256 mismatch
    assert any("200" in line and "sha256" in line for line in record["evidence"]), record

    second = wait_running(rtj_api, ns, JOB, 2, 2)
    (js,) = jobsets_of(rtj_api, ns, JOB)
    assert js["metadata"]["annotations"][keys.RESUME_STEP_ANNOTATION] == "100"
    assert all(pinned_step(p) == 100 for p in second)
    assert shim_resolve(s3_root, 100, tmp_path).returncode == 0, "step 100 really verifies"
    status = rtj_status(rtj_api, ns, JOB)
    assert status["badSteps"] == [200]
    assert status["attempts"][1]["resumedFromStep"] == 100
    assert status["restarts"]["checkpoint"] == 1 and status["restarts"]["infrastructure"] == 0
    assert status["lastVerifiedCheckpoint"]["step"] == 100, "a bad step is not 'verified'"
    wait_events(rtj_api, ns, JOB, "CheckpointMarkedBad")

    # step 200 is still the newest published step; it is never pinned again
    _fail_world(hkube, ns, by_rank(second))
    third = wait_running(rtj_api, ns, JOB, 3, 2)
    assert all(pinned_step(p) == 100 for p in third)
    status = rtj_status(rtj_api, ns, JOB)
    assert [r.get("resumedFromStep") for r in status["attempts"]] == [200, 100, 100]
    assert status["badSteps"] == [200]
    assert op.metric("rtj_checkpoint_last_verified_step", namespace=ns, name=JOB) == 100
    assert op.metric("rtj_restarts_total", namespace=ns, name=JOB,
                     **{"class": "CheckpointCorrupt", "scope": "world"}) == 1  # fmt: skip


# --- an unreachable or unreadable store ------------------------------------------------------


def test_an_unreachable_store_holds_the_restart_until_it_is_back(
    rtj_api: Kube, hkube: Any, rtj_ns: Any, run_operator: Any, s3_root: str, s3_server: Any,
    tmp_path: Path, timeline: Any,
) -> None:  # fmt: skip
    ns = rtj_ns.name
    endpoint = TcpProxy(s3_server.port).up()  # the store's endpoint as the operator reaches it
    try:
        publish_steps(s3_root, [100], tmp_path, run_id=f"{ns}.{JOB}")
        run_operator(AWS_ENDPOINT_URL_S3=endpoint.url)
        tl = timeline(JOB)
        pods = by_rank(start_job(rtj_api, ns, JOB, s3_root, replicas=2))
        publish_steps(s3_root, [200], tmp_path, run_id=f"{ns}.{JOB}")  # the trainer's last save

        endpoint.down()
        _fail_world(hkube, ns, pods)

        def blocked() -> dict[str, Any] | None:
            # the store may be found unreadable while attempt 1 still runs ("restarts are
            # blocked until it is"), before the failure is seen: wait for the blocked restart
            cond = condition_true(rtj_status(rtj_api, ns, JOB), "CheckpointUnreadable")
            return cond if cond is not None and "attempt 2 is blocked" in cond["message"] else None

        cond = wait_for("the CheckpointUnreadable condition of attempt 2", blocked, WAIT)
        assert "cannot be read" in cond["message"] and "attempt 2 is blocked" in cond["message"]
        assert "EndpointConnectionError" in cond["message"], cond
        status = rtj_status(rtj_api, ns, JOB)
        assert status["phase"] == "Restarting" and status["attempt"] == 1
        assert jobsets_of(rtj_api, ns, JOB) == [], "the old world is gone, no new one from scratch"
        assert tl.names("JobSet", 2) == set()
        wait_events(rtj_api, ns, JOB, "CheckpointStoreUnreadable")

        endpoint.up()  # the same endpoint, the same data
        second = wait_running(rtj_api, ns, JOB, 2, 2)
        (js,) = jobsets_of(rtj_api, ns, JOB)
        assert js["metadata"]["annotations"][keys.RESUME_STEP_ANNOTATION] == "200"
        assert all(pinned_step(p) == 200 for p in second)
        status = rtj_status(rtj_api, ns, JOB)
        readable = condition(status, "CheckpointUnreadable")
        assert readable is not None and readable["status"] == "False"
        assert status["attempts"][1]["resumedFromStep"] == 200
        wait_events(rtj_api, ns, JOB, "CheckpointStoreReadable")
    finally:
        endpoint.down()


def test_a_store_the_jobs_credentials_cannot_read_blocks_the_first_attempt(
    rtj_api: Kube, rtj_ns: Any, run_operator: Any, s3_root: str, s3_server: Any,
    tmp_path: Path, timeline: Any,
) -> None:  # fmt: skip
    ns = rtj_ns.name
    publish_steps(s3_root, [100], tmp_path, run_id=f"{ns}.{JOB}")
    denied = s3_server.denied
    secret = {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "ckpt-denied", "namespace": ns},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in {
            "AWS_ACCESS_KEY_ID": denied.access_key_id,
            "AWS_SECRET_ACCESS_KEY": denied.secret_access_key,
            "AWS_ENDPOINT_URL_S3": s3_server.url, "AWS_DEFAULT_REGION": "us-east-1"}.items()},
    }  # fmt: skip
    rtj_api.request("create secret", "POST", f"/api/v1/namespaces/{ns}/secrets", secret)
    run_operator()
    tl = timeline(JOB)
    rtj_api.create_rtj(ns, rtj_body(JOB, ns, s3_root, checkpoint={
        "uri": s3_root, "credentialsSecretRef": {"name": "ckpt-denied"}}))  # fmt: skip

    def blocked() -> dict[str, Any] | None:
        return condition_true(rtj_status(rtj_api, ns, JOB), "CheckpointUnreadable")

    cond = wait_for("the CheckpointUnreadable condition", blocked, WAIT)
    assert "cannot be read" in cond["message"] and "AccessDenied" in cond["message"], cond
    status = rtj_status(rtj_api, ns, JOB)
    assert status.get("attempt", 0) == 0 and status["phase"] == "Pending"
    assert jobsets_of(rtj_api, ns, JOB) == [] and tl.events("JobSet") == []
    wait_events(rtj_api, ns, JOB, "CheckpointStoreUnreadable")


# --- checkpoint age ----------------------------------------------------------------------------

_AGE = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def _seconds(age: str) -> int:
    """kubectl's human age (`7s`, `2m5s`, `3h`) in seconds."""
    match = _AGE.match(age)
    assert match and age, age
    d, h, m, s = (int(x) if x else 0 for x in match.groups())
    return ((d * 24 + h) * 60 + m) * 60 + s


def _get_rtj(kubeconfig: str, ns: str) -> dict[str, str]:
    out = kubectl(kubeconfig, "get", "rtj", JOB, "-n", ns)
    assert out.returncode == 0, out.stderr
    header, row = out.stdout.splitlines()[:2]
    # kubectl aligns every column under its header (a tabwriter); a cell may be empty (no
    # progress reported on KWOK), and headers hold single spaces: cut the row at the
    # headers' starts
    starts = [m.start() for m in re.finditer(r"\S+(?: \S+)*", header)]
    ends = [*starts[1:], None]
    names = [header[a:b].strip() for a, b in zip(starts, ends, strict=True)]
    return {n: row[a:b].strip() for n, a, b in zip(names, starts, ends, strict=True)}


def test_a_checkpoint_older_than_twice_its_interval_shows_in_kubectl_and_metrics(
    rtj_api: Kube, rtj_cluster: Any, rtj_ns: Any, run_operator: Any, s3_root: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    ns = rtj_ns.name
    interval = 3
    publish_steps(s3_root, [100], tmp_path, run_id=f"{ns}.{JOB}")
    op = run_operator()
    checkpoint = {"uri": s3_root, "plannedIntervalSeconds": interval, "emergencySaveSeconds": 0}
    start_job(rtj_api, ns, JOB, s3_root, replicas=2, checkpoint=checkpoint)

    def stale() -> dict[str, Any] | None:
        return condition_true(rtj_status(rtj_api, ns, JOB), "CheckpointStale")

    cond = wait_for("the CheckpointStale condition", stale, WAIT)
    assert cond["reason"] == "CheckpointTooOld" and "step 100" in cond["message"]
    committed = datetime.fromisoformat(
        rtj_status(rtj_api, ns, JOB)["lastVerifiedCheckpoint"]["committedAt"].replace("Z", "+00:00")
    )
    row = _get_rtj(rtj_cluster.kubeconfig, ns)
    assert (row["PHASE"], row["ATTEMPT"], row["CHECKPOINT"]) == ("Running", "1", "100"), row
    assert _seconds(row["CHECKPOINT AGE"]) > 2 * interval, row
    last = op.metric("rtj_checkpoint_last_success_timestamp_seconds", namespace=ns, name=JOB)
    assert last == pytest.approx(committed.timestamp(), abs=1e-3)
    assert time.time() - last > 2 * interval
    assert op.metric("rtj_checkpoint_planned_interval_seconds", namespace=ns, name=JOB) == interval

    # the trainer checkpoints again: the periodic store reading clears the condition
    publish_steps(s3_root, [200], tmp_path, run_id=f"{ns}.{JOB}")

    def fresh() -> dict[str, Any] | None:
        found = condition(rtj_status(rtj_api, ns, JOB), "CheckpointStale")
        return found if found is not None and found["status"] == "False" else None

    assert wait_for("CheckpointStale False", fresh, WAIT)["reason"] == "CheckpointFresh"
    assert _get_rtj(rtj_cluster.kubeconfig, ns)["CHECKPOINT"] == "200"
    assert op.metric("rtj_checkpoint_last_success_timestamp_seconds", namespace=ns,
                     name=JOB) > last  # fmt: skip
