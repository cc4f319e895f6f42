"""The KWOK stand-in for a pod's sidecar and supervisor (`bench.sidecar_sim`): which pods it
stands in for, and that it takes orders as the product does (signed, for its job, never
older than the last) and steps through the supervisor's own decisions."""

from __future__ import annotations

import time
from typing import Any

import pytest

from bench.sidecar_sim import STEP_SECONDS, Sidecars, sim_pod
from rtj_operator.api import keys
from rtj_operator.pod_http import progress_headers
from rtj_operator.policy import progress as rank_progress
from rtj_shim.fast import peer_replica
from rtj_shim.wire import answer_seal, control

KEY = control.job_key(b"s" * 32, "job-uid")


def _pod(name: str, ip: str | None, *, spare: bool = False, failures: str = "0",
         signed_reads: bool = False, sealed: bool = False) -> dict[str, Any]:  # fmt: skip
    trainer_env = [{"name": keys.ENV_SPARE, "value": "1"}] if spare else []
    signed = [{"name": keys.ENV_SIGNED_READS, "value": "1"}] if signed_reads else []
    if sealed:
        signed.append({"name": keys.ENV_SEALED_ANSWERS, "value": "1"})
    return {
        "metadata": {"name": name, "uid": f"uid-{name}",
                     "labels": {keys.ATTEMPT_LABEL: "1"},
                     "annotations": {keys.JOB_INDEX_FAILURE_COUNT: failures}},
        "spec": {"initContainers": [{"name": keys.PROGRESS_SIDECAR, "env": [
                     {"name": keys.ENV_CONTROL_KEY, "value": KEY},
                     {"name": keys.ENV_JOB_UID, "value": "job-uid"}, *signed]}],
                 "containers": [{"name": "trainer", "env": trainer_env}]},
        "status": {"podIP": ip} if ip else {},
    }  # fmt: skip


def _post(sidecars: Sidecars, ip: str, order: control.Order, key: str = KEY) -> int:
    return _order(sidecars, ip, order, key)[0]


def _order(
    sidecars: Sidecars, ip: str, order: control.Order, key: str = KEY
) -> tuple[int, dict[str, Any]]:
    raw = order.encode()
    return sidecars.answer(ip, "POST", "/control", raw, control.sign(key, raw))


def _report(sidecars: Sidecars, ip: str) -> dict[str, Any]:
    code, body = sidecars.answer(ip, "GET", "/progress", b"", None)
    assert code == 200
    report: dict[str, Any] = body["supervisor"]
    return report


def test_which_pods_it_stands_in_for() -> None:
    assert sim_pod(_pod("w0", None)) is None, "no address yet"
    found = sim_pod(_pod("w0", "127.4.0.2"))
    assert found is not None and found[0] == "127.4.0.2"
    assert (found[1].current.state, found[1].current.attempt) == ("running", 1)
    for held in (_pod("s0", "127.4.1.2", spare=True), _pod("w1", "127.4.2.2", failures="1")):
        got = sim_pod(held)
        assert got is not None and got[1].current.state == "stopped"


def test_orders_are_checked_and_carried_out_as_the_supervisor_would() -> None:
    sidecars = Sidecars()
    for pod in (_pod("w0", "127.4.0.2"), _pod("s0", "127.4.1.2", spare=True)):
        sidecars.on_pod("ADDED", pod, 0.0)
    assert sidecars.exit("w0", 1) is not None
    assert (
        _report(sidecars, "127.4.0.2")["state"],
        _report(sidecars, "127.4.0.2")["exit_code"],
    ) == ("exited", 1)
    stop = control.Order("job-uid", 1, "stop")
    assert _post(sidecars, "127.4.0.2", stop, key="0" * 64) == 403, "not this job's key"
    assert _post(sidecars, "127.4.0.2", control.Order("other", 1, "stop")) == 403
    assert _post(sidecars, "127.4.0.2", stop) == 202
    # the answer carries the pod's report after the order, as the sidecar's does once its
    # supervisor (woken by the doorbell) took it; this stand-in's trainer stops at once
    code, answer = _order(sidecars, "127.4.1.2", stop)
    assert code == 202 and answer["accepted"] == stop.to_json()
    assert (answer["report"]["supervisor"]["generation"],
            answer["report"]["supervisor"]["state"]) == (1, "stopped")  # fmt: skip
    assert {_report(sidecars, ip)["state"] for ip in ("127.4.0.2", "127.4.1.2")} == {"stopped"}
    assert sidecars.stats()["started"] == {}, "nothing runs generation 1 yet"
    run = control.Order("job-uid", 1, "run", attempt=1, rank=1)
    code, answer = _order(sidecars, "127.4.1.2", run)
    spare = answer["report"]["supervisor"]
    assert (code, spare["state"], spare["rank"], spare["generation"]) == (202, "running", 1, 1)
    assert _report(sidecars, "127.4.1.2") == spare, "a read shows what the answer did"
    assert _post(sidecars, "127.4.1.2", stop) == 403, "older than the last accepted"
    assert sidecars.stats()["started"].keys() == {1}, "seen running by the order's answer"
    # a run order to a pod not stopped for its generation: stopped, then started, at once
    code, answer = _order(sidecars, "127.4.0.2", control.Order("job-uid", 2, "run", attempt=2))
    worker = answer["report"]["supervisor"]
    assert (code, worker["state"], worker["generation"], worker["attempt"]) == (
        202, "running", 2, 2)  # fmt: skip
    code, _ = sidecars.answer("127.9.9.9", "GET", "/progress", b"", None)
    assert code == 404


@pytest.mark.parametrize("kind", ["DELETED", "MODIFIED"])
def test_a_pod_gone_or_without_an_address_is_forgotten(kind: str) -> None:
    sidecars = Sidecars()
    sidecars.on_pod("ADDED", _pod("w0", "127.4.0.2"), 0.0)
    sidecars.on_pod(kind, _pod("w0", None if kind == "MODIFIED" else "127.4.0.2"), 0.0)
    assert sidecars.stats()["pods"] == 0


def test_a_pod_rendered_for_signed_reads_answers_only_its_jobs_signed_read() -> None:
    """As the sidecar rendered with ``RTJ_SIGNED_READS=1`` does (issue 42): the operator's
    poller signs each read with the job's key (`rtj_operator.pod_http.progress_headers`)."""
    sidecars = Sidecars()
    sidecars.on_pod("ADDED", _pod("w0", "127.4.0.2", signed_reads=True), 0.0)
    sidecars.on_pod("ADDED", _pod("w1", "127.4.0.3"), 0.0)
    code, body = sidecars.answer("127.4.0.2", "GET", "/progress", b"", None)
    assert code == 403 and "X-RTJ-Time" in body["error"]
    for key, expected in (("0" * 64, 403), (KEY, 200)):
        headers = progress_headers(key, time.time())
        code, _ = sidecars.answer("127.4.0.2", "GET", "/progress", b"",
                                  headers[control.SIGNATURE_HEADER],
                                  headers[peer_replica.TIME_HEADER])  # fmt: skip
        assert code == expected, key
    assert sidecars.answer("127.4.0.3", "GET", "/progress", b"", None)[0] == 200, "rendered open"


def test_a_pod_rendered_to_seal_answers_seals_them_as_its_sidecar_does() -> None:
    """Issue 42: the poller counts a sealed pod's answer only with its seal over the read's
    nonce, the pod's name and attempt (`rtj_shim.wire.answer_seal`)."""
    sidecars = Sidecars()
    sidecars.on_pod("ADDED", _pod("w0", "127.4.0.2", sealed=True), 0.0)
    sidecars.on_pod("ADDED", _pod("w1", "127.4.0.3"), 0.0)
    nonce = answer_seal.new_nonce()
    data = b'{"ranks":[]}'
    line = sidecars.seal("127.4.0.2", 200, nonce, data).decode()
    name, _, value = line.strip().partition(": ")
    assert name == answer_seal.SEAL_HEADER
    assert answer_seal.check(KEY, nonce, answer_seal.Answerer("w0", "1"), data, value)
    assert sidecars.seal("127.4.0.2", 403, nonce, data) == b"", "a refusal is not sealed"
    assert sidecars.seal("127.4.0.2", 200, None, data) == b"", "no nonce, no seal"
    assert sidecars.seal("127.4.0.3", 200, nonce, data) == b"", "rendered without seals"


def test_the_key_comes_from_the_jobs_key_secret_as_the_kubelet_resolves_it() -> None:
    """Issue 42: a pod's sidecar refers to the job's key Secret (no key in the template);
    the stand-in resolves the reference as the kubelet does."""
    body = _pod("w0", "127.4.0.2")
    env = body["spec"]["initContainers"][0]["env"]
    ref = {"secretKeyRef": {"name": "rtj-control-u", "key": "key"}}
    env[0] = {"name": keys.ENV_CONTROL_KEY, "valueFrom": ref}
    asked: list[tuple[str, str, str]] = []

    def secret(namespace: str, name: str, key: str) -> str:
        asked.append((namespace, name, key))
        return KEY

    sidecars = Sidecars(secret)
    body["metadata"]["namespace"] = "team-a"
    sidecars.on_pod("ADDED", body, 0.0)
    assert asked == [("team-a", "rtj-control-u", "key")]
    assert _post(sidecars, "127.4.0.2", control.Order("job-uid", 1, "stop")) == 202


def test_a_running_pod_reports_its_rank_stepping_as_the_operator_reads_it() -> None:
    """Its rank entry is the sidecar's own (`rank_json`), so the operator's parse, hang
    allowance and summary read it as a real trainer's: its completion index, a step per
    STEP_SECONDS, warm after three steps; none while held (a spare)."""
    body = _pod("w3", "127.4.0.5")
    body["metadata"]["annotations"][keys.JOB_COMPLETION_INDEX] = "3"
    found = sim_pod(body)
    assert found is not None
    pod = found[1]
    started = pod.updated
    reads = []
    for steps in (0, 1, 4):
        at = started + steps * STEP_SECONDS + 0.5
        entry = pod.rank_entry(at)
        assert entry is not None
        report = rank_progress.PodReport("w3", at, {"schema": 1, "ranks": [entry]})
        (rank,) = rank_progress.parse_reports((report,), at).ranks
        reads.append((rank.rank, rank.step, rank.section, round(rank.in_section(at), 3)))
        timeouts = rank_progress.auto_timeout((report,), now=at, startup_grace=600.0)
    assert reads == [(3, None, "start", 0.5), (3, 0, "forward", 0.5), (3, 3, "forward", 0.5)]
    assert timeouts.step == 30.0, "warm: the floor, not the start-up grace"
    spare = sim_pod(_pod("w4", "127.4.0.6", spare=True))
    assert spare is not None and spare[1].rank_entry(time.time()) is None
