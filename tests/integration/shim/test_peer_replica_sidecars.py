"""The fast tier's peer replica between real progress sidecars on loopback (issue 16).

Three sidecars of one job, as in three pods: a *source* whose trainers publish fast steps, a
*holder* the operator assigned to copy them, and a *replacement* (the source's pod re-created
on another node) that copies its pinned step back from the holder before its supervisor is
handed the run order. Real HTTP, real files under the commit protocol; a fourth sidecar of
another job shows that no shard crosses jobs.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rtj_shim.agent.progress_server import ProgressServer
from rtj_shim.checkpoint.layout import STEPS_DIR, step_dir_name
from rtj_shim.checkpoint.protocol import CommitProtocol
from rtj_shim.checkpoint.verification import check_commit
from rtj_shim.fast import fast_tier
from rtj_shim.fast.peer_pull import PeerClient, PeerError, copy_step
from rtj_shim.fast.peer_replica import Assignment, request_headers
from rtj_shim.wire.control import ORDER_FILE, Order, job_key, read_json, sign

UID = "5d1f0c2a-9a4e-4f7b-8c61-2b7e0f3d9a10"
KEY = job_key(b"operator secret", UID)
RANKS = (2, 3)  # the source pod's ranks (its completion index 1, two ranks per pod)


def publish(fast: Path, step: int, tmp: Path, salt: str = "") -> None:
    """Each of the pod's ranks publishes ``step`` under the commit protocol, as the trainers'
    fast saves do (a replicated part and the rank's own file)."""
    for rank in RANKS:
        payload = tmp / f"payload-{rank}-{step}{salt}"
        (payload / "common").mkdir(parents=True)
        (payload / "ranks").mkdir()
        (payload / "common" / "model.bin").write_bytes(f"model {step}{salt}".encode() * 4096)
        (payload / "ranks" / f"rank-{rank:05d}.pt").write_bytes(f"rank {rank} {step}".encode())
        store = fast_tier.rank_store(fast, rank)
        CommitProtocol(store, retention=None).publish_directory(step, payload)


def step_files(fast: Path, rank: int, step: int) -> dict[str, bytes]:
    base = fast_tier.rank_dir(fast, rank) / STEPS_DIR / step_dir_name(step)
    return {p.relative_to(base).as_posix(): p.read_bytes() for p in base.rglob("*") if p.is_file()}


Start = Callable[..., ProgressServer]


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Start]:
    servers: list[ProgressServer] = []

    def make(name: str, key: str = KEY, uid: str = UID) -> ProgressServer:
        root = tmp_path / name
        (root / "progress").mkdir(parents=True)
        server = ProgressServer(
            root / "progress", "127.0.0.1", 0, control_dir=root / "control",
            fast_tier_dir=root / "fast", control_key=key, job_uid=uid,
        )  # fmt: skip
        server.start_in_thread()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.shutdown()
        server.server_close()


def address(server: ProgressServer) -> str:
    return f"127.0.0.1:{server.port}"


def call(server: ProgressServer, method: str, target: str, body: bytes = b"",
         headers: dict[str, str] | None = None) -> tuple[int, bytes]:  # fmt: skip
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request(method, target, body or None, headers or {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def progress(server: ProgressServer) -> dict[str, Any]:
    status, raw = call(server, "GET", "/progress")
    assert status == 200
    body: dict[str, Any] = json.loads(raw)
    return body


def assign(holder: ProgressServer, source: ProgressServer, key: str = KEY) -> int:
    raw = Assignment(UID, address(source), 1).encode()
    status, _ = call(holder, "POST", "/replica", raw, {"X-RTJ-Signature": sign(key, raw)})
    return status


def until(what: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := what():
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout} s: {what}")


def replica_steps(holder: ProgressServer) -> list[int]:
    replica = progress(holder).get("replica") or {}
    return list(replica.get("steps") or [])


def test_a_holder_copies_its_sources_newest_steps_and_keeps_two(
    start: Start, tmp_path: Path
) -> None:
    source, holder = start("source"), start("holder")
    publish(source.fast_tier_dir or Path(), 40, tmp_path)
    publish(source.fast_tier_dir or Path(), 50, tmp_path)
    assert progress(holder)["replica"] is None  # nothing assigned yet
    assert assign(holder, source) == 202
    assert until(lambda: replica_steps(holder) == [50])  # only the newest is copied
    peer = (holder.fast_tier_dir or Path()) / "peer"
    for rank in RANKS:
        assert step_files(peer, rank, 50) == step_files(source.fast_tier_dir or Path(), rank, 50)
    publish(source.fast_tier_dir or Path(), 60, tmp_path)
    publish(source.fast_tier_dir or Path(), 70, tmp_path)
    until(lambda: replica_steps(holder) == [60, 70] or replica_steps(holder) == [50, 70])
    assert len(replica_steps(holder)) == 2  # keep: bounded memory
    report = progress(holder)["replica"]
    assert (report["source_index"], report["source"], report["error"]) == (
        1, address(source), None,
    )  # fmt: skip
    # each step with the lineage its copies record (issue 43; these were published without)
    assert report["held"] == [f"legacy@{s}" for s in report["steps"]]


def test_a_replaced_pod_copies_its_pinned_step_back_before_its_supervisor_sees_the_order(
    start: Start, tmp_path: Path
) -> None:
    source, holder, replacement = start("source"), start("holder"), start("replacement")
    publish(source.fast_tier_dir or Path(), 40, tmp_path)
    assert assign(holder, source) == 202
    until(lambda: replica_steps(holder) == [40])
    source.shutdown()  # the source's node is lost
    order = Order(UID, 2, "run", attempt=1, step=30, fast_step=40, fast_source=address(holder))
    raw = order.encode()
    assert call(replacement, "POST", "/control", raw, {"X-RTJ-Signature": sign(KEY, raw)})[0] == 202
    control = (replacement.control_dir or Path()) / ORDER_FILE
    until(lambda: control.exists())
    fetched = progress(replacement)["fast_fetch"]
    assert fetched["ok"] is True, fetched
    assert (fetched["step"], fetched["ranks"], fetched["generation"]) == (40, list(RANKS), 2)
    assert read_json(control) == order.to_json()
    own = replacement.fast_tier_dir or Path()
    assert fast_tier.holdings(own) == [40]
    for rank in RANKS:
        assert step_files(own, rank, 40) == step_files(source.fast_tier_dir or Path(), rank, 40)
    # the same order again (the operator re-sends it every round) copies nothing again
    assert call(replacement, "POST", "/control", raw, {"X-RTJ-Signature": sign(KEY, raw)})[0] == 202


def test_a_step_the_holder_lacks_is_reported_and_the_order_still_goes_on(
    start: Start, tmp_path: Path
) -> None:
    holder, replacement = start("holder"), start("replacement")
    order = Order(UID, 3, "run", attempt=1, step=30, fast_step=40, fast_source=address(holder))
    raw = order.encode()
    assert call(replacement, "POST", "/control", raw, {"X-RTJ-Signature": sign(KEY, raw)})[0] == 202
    until(lambda: ((replacement.control_dir or Path()) / ORDER_FILE).exists())
    fetched = progress(replacement)["fast_fetch"]
    assert fetched["ok"] is False
    assert "not 40" in fetched["error"]  # the trainers' restore then falls back to durable
    assert fast_tier.holdings(replacement.fast_tier_dir or Path()) == []


def test_no_shard_crosses_jobs(start: Start, tmp_path: Path) -> None:
    theirs_key = job_key(b"operator secret", "another-job")
    theirs = start("theirs", key=theirs_key, uid="another-job")
    publish(theirs.fast_tier_dir or Path(), 40, tmp_path)
    holder = start("holder")
    assert assign(holder, theirs, key=theirs_key) == 403  # their assignment is not ours
    assert assign(holder, theirs) == 202  # an assignment naming their pod's address...
    until(lambda: (progress(holder)["replica"] or {}).get("error"))
    assert replica_steps(holder) == []  # ...copies nothing: their sidecar refuses our key
    assert "403" in progress(holder)["replica"]["error"]
    # and an unsigned or foreign read of our tier is refused
    target = "/fast-tier/holdings?tier=own"
    assert call(holder, "GET", target)[0] == 403
    foreign = request_headers(theirs_key, "GET", target, time.time())
    assert call(holder, "GET", target, headers=foreign)[0] == 403
    ours = request_headers(KEY, "GET", target, time.time())
    assert call(holder, "GET", target, headers=ours)[0] == 200
    stale = request_headers(KEY, "GET", target, time.time() - 3600)
    assert call(holder, "GET", target, headers=stale)[0] == 403


def test_only_a_published_steps_listed_files_are_served(start: Start, tmp_path: Path) -> None:
    source = start("source")
    publish(source.fast_tier_dir or Path(), 40, tmp_path)
    for bad in ("../../control/order.json", "manifest.json", "common/../COMMITTED", "nope"):
        target = f"/fast-tier/file?tier=own&rank=2&step=40&path={bad}"
        headers = request_headers(KEY, "GET", target, time.time())
        assert call(source, "GET", target, headers=headers)[0] == 404, bad
    for target in ("/fast-tier/file?tier=own&rank=x&step=40&path=a", "/fast-tier/holdings"):
        headers = request_headers(KEY, "GET", target, time.time())
        assert call(source, "GET", target, headers=headers)[0] == 400, target


def test_a_shard_that_does_not_match_its_manifest_is_never_published(
    start: Start, tmp_path: Path
) -> None:
    source = start("source")
    fast = source.fast_tier_dir or Path()
    publish(fast, 40, tmp_path)
    shard = fast_tier.rank_dir(fast, 2) / STEPS_DIR / step_dir_name(40) / "common" / "model.bin"
    shard.write_bytes(b"bit rot" + shard.read_bytes()[7:])  # same size, other bytes
    dest = fast_tier.rank_store(tmp_path / "copy", 2)
    with pytest.raises(PeerError, match="sha256"):
        copy_step(PeerClient(address(source), KEY), "own", 2, 40, dest)
    assert fast_tier.committed_steps(dest) == []
    assert list((tmp_path / "copy" / "rank-00002" / STEPS_DIR).iterdir()) == []
    # an intact rank copies and verifies as the original did
    assert copy_step(PeerClient(address(source), KEY), "own", 3, 40,
                     fast_tier.rank_store(tmp_path / "copy", 3)) > 0  # fmt: skip
    copied = fast_tier.rank_store(tmp_path / "copy", 3)
    assert check_commit(40, copied.read("steps/step-000000000040/manifest.json"),
                        copied.read("steps/step-000000000040/COMMITTED")).step == 40  # fmt: skip
