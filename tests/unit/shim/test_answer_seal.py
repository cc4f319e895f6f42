"""Answers bound to the pod and the request (issue 42, finding 6): the seal itself, and a
real ProgressServer on loopback sealing what it answers to a read or an order carrying a
nonce."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rtj_shim.agent.progress_cli import answerer_from_env
from rtj_shim.agent.progress_handler import Reads
from rtj_shim.agent.progress_server import ProgressServer
from rtj_shim.errors import UsageError
from rtj_shim.fast import peer_replica
from rtj_shim.progress import Progress
from rtj_shim.wire import answer_seal, control
from rtj_shim.wire.answer_seal import Answerer, check, seal, subkey

UID = "job-uid"
KEY = control.job_key(b"the operator's secret", UID)
OTHER = control.job_key(b"the operator's secret", "another-job")
POD = Answerer("llm-a3-worker-0-1-x7k2p", "3")
NONCE = "0123456789abcdef0123456789abcdef"
BODY = b'{"ranks":[]}\n'


def test_a_seal_holds_only_for_its_nonce_pod_attempt_body_and_key() -> None:
    sealed = seal(KEY, NONCE, POD, BODY)
    assert check(KEY, NONCE, POD, BODY, sealed)
    other_nonce = "f" * 32
    for wrong in (
        (OTHER, NONCE, POD, BODY),  # another job's pod (another key)
        (KEY, other_nonce, POD, BODY),  # an old answer replayed (another request)
        (KEY, NONCE, Answerer("llm-a3-worker-0-0-abcde", "3"), BODY),  # another pod of it
        (KEY, NONCE, Answerer(POD.pod, "2"), BODY),  # the pod of another attempt
        (KEY, NONCE, POD, BODY + b" "),  # another body
    ):
        assert not check(*wrong, sealed), wrong
    assert not check(KEY, NONCE, POD, BODY, None)
    assert not check(KEY, NONCE, POD, BODY, "sha256=\u00e9")  # non-ASCII: not a seal


def test_the_answer_key_is_a_subkey_for_that_purpose_only() -> None:
    """A seal is never a valid order, assignment or request signature (nor the reverse):
    the answer key is derived from the job key for this purpose alone."""
    answer_key = subkey(KEY, answer_seal.ANSWER_PURPOSE)
    assert answer_key not in (KEY, subkey(KEY, "orders"), subkey(OTHER, answer_seal.ANSWER_PURPOSE))
    assert seal(KEY, NONCE, POD, BODY) != control.sign(KEY, BODY)
    assert answer_seal.valid_nonce(answer_seal.new_nonce())
    for odd in (None, "", "0" * 31, "0" * 33, "G" * 32, "A" * 32):
        assert not answer_seal.valid_nonce(odd), odd


def test_the_sidecar_seals_only_where_rendered_to_and_names_what_is_missing() -> None:
    env = {"RTJ_SEALED_ANSWERS": "1", "RTJ_CONTROL_KEY": KEY, "RTJ_POD_NAME": POD.pod,
           "RTJ_POD_ATTEMPT": "3"}  # fmt: skip
    assert answerer_from_env(env) == POD
    assert answerer_from_env({**env, "RTJ_SEALED_ANSWERS": ""}) is None
    with pytest.raises(UsageError, match=r"needs \$RTJ_POD_NAME, \$RTJ_POD_ATTEMPT"):
        answerer_from_env({"RTJ_SEALED_ANSWERS": "1", "RTJ_CONTROL_KEY": KEY})
    with pytest.raises(ValueError, match="sealed answers need the job's control key"):
        ProgressServer(Path("."), "127.0.0.1", 0, answerer=POD)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ProgressServer]:
    Progress(tmp_path / "progress", 0).step_done(7)
    control_dir = tmp_path / "control"
    control_dir.mkdir()
    srv = ProgressServer(tmp_path / "progress", "127.0.0.1", 0, control_key=KEY, job_uid=UID,
                         reads=Reads.SIGNED, answerer=POD, control_dir=control_dir,
                         order_ack_seconds=0.1)  # fmt: skip
    thread = srv.start_in_thread()
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=10)


def _ask(srv: ProgressServer, method: str, path: str, headers: dict[str, str],
         body: bytes | None = None) -> tuple[int, bytes, str | None]:  # fmt: skip
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    try:
        conn.request(method, path, body, headers)
        response = conn.getresponse()
        return response.status, response.read(), response.getheader(answer_seal.SEAL_HEADER)
    finally:
        conn.close()


def test_a_read_with_a_nonce_is_answered_sealed_and_one_without_is_not(
    server: ProgressServer,
) -> None:
    signed = peer_replica.request_headers(KEY, "GET", "/progress", time.time())
    with_nonce = {**signed, answer_seal.NONCE_HEADER: NONCE}
    code, body, got = _ask(server, "GET", "/progress", with_nonce)
    assert code == 200 and json.loads(body)["ranks"][0]["step"] == 7
    assert check(KEY, NONCE, POD, body, got)
    code, body, got = _ask(server, "GET", "/progress", signed)
    assert code == 200 and got is None, "no nonce: nothing to seal over"
    odd = {**signed, answer_seal.NONCE_HEADER: "not-a-nonce"}
    assert _ask(server, "GET", "/progress", odd)[2] is None
    refused = _ask(server, "GET", "/progress", {answer_seal.NONCE_HEADER: NONCE})
    assert refused[0] == 403 and refused[2] is None, "a refusal is never sealed"


def test_an_orders_answer_is_sealed_so_the_report_it_carries_is_the_pods(
    server: ProgressServer,
) -> None:
    order = control.Order(UID, 1, "stop").encode()
    headers = {"Content-Type": "application/json", control.SIGNATURE_HEADER:
               control.sign(KEY, order), answer_seal.NONCE_HEADER: NONCE}  # fmt: skip
    code, body, got = _ask(server, "POST", "/control", headers, order)
    assert code == 202 and "report" in json.loads(body)
    assert check(KEY, NONCE, POD, body, got)
