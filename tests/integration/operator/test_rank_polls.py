"""The operator's progress poller against a real `rtj-shim progress-server` process serving
real rank records (rtj_shim.progress): what it reads is what the hang decision needs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from sidecar_procs import progress_sidecar

from rtj_operator.pod_http import PollFailed, exchange_http, fetch_progress
from rtj_operator.policy import progress as rank_progress
from rtj_operator.rank_polls import JobTargets, RankPolls
from rtj_operator.reconcile import PollMessage, PollTarget
from rtj_operator.reconcile.world import CONTROL_PATH, REPLICA_PATH
from rtj_shim.progress import Progress
from rtj_shim.wire.control import ORDER_FILE, Order, job_key, sign

KEY = ("team-a", "llm")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    directory = tmp_path / "progress"
    directory.mkdir()
    with progress_sidecar(directory) as port:
        yield directory, port


def test_the_poller_reads_real_records_and_the_decision_names_the_stuck_rank(
    server: tuple[Path, int],
) -> None:
    directory, port = server
    ranks = [Progress(directory, rank=r) for r in range(2)]
    for step in range(1, 6):
        for p in ranks:
            with p.section("forward"):
                pass
            p.step_done(step)
    ranks[0].enter("allreduce")  # waits in the collective for rank 1...
    ranks[1].enter("forward")  # ...which never leaves forward (a hung GPU)
    received = datetime(2026, 1, 1, tzinfo=timezone.utc)
    polls = RankPolls(lambda: received, lambda key: None)
    target = PollTarget("llm-a1-worker-0-0-abcde", "127.0.0.1", port, 1)
    asyncio.run(polls.poll_once([JobTargets(KEY, (target,))]))
    reading = polls.reading(KEY)
    assert reading is not None and not reading.unanswered
    (report,) = reading.reports
    assert [r["rank"] for r in report.body["ranks"]] == [0, 1]
    assert {r["step"] for r in report.body["ranks"]} == {5}
    later = (received + timedelta(seconds=15)).timestamp()
    hang = rank_progress.hang_verdict(reading.reports, 10.0, later)
    assert hang is not None and hang.rank == 1 and hang.section == "forward"
    assert hang.ahead == (0,) and 15.0 <= hang.seconds < 20.0
    assert rank_progress.hang_verdict(reading.reports, 60.0, later) is None
    for p in ranks:
        p.close()
    polls.close()


def test_a_pod_without_a_server_is_an_error_not_an_answer() -> None:
    with pytest.raises(PollFailed, match=r"ConnectionRefusedError"):
        fetch_progress("127.0.0.1", 9, timeout=2.0)  # port 9 (discard): nothing listens


def test_a_server_that_drips_bytes_is_cut_off_at_the_request_deadline() -> None:
    """The timeout bounds the whole request: a pod that answers one byte at a time (each
    read well within the timeout) cannot hold a poller thread."""
    import socket
    import threading
    import time

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    stop = threading.Event()

    def drip() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n")
            while not stop.is_set():
                try:
                    conn.sendall(b"{")
                except OSError:
                    return
                time.sleep(0.3)

    thread = threading.Thread(target=drip, daemon=True)
    thread.start()
    started = time.monotonic()
    with pytest.raises(PollFailed):
        fetch_progress("127.0.0.1", port, timeout=1.5)
    assert time.monotonic() - started < 5.0
    stop.set()
    listener.close()


UID = "0c2f-exchange"
CONTROL_KEY = job_key(b"the operator's secret", UID)


@contextlib.contextmanager
def control_sidecar(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """A real progress sidecar that takes signed orders for job UID (its port, and the
    control directory where it writes them)."""
    control = tmp_path / "control"
    control.mkdir()
    with progress_sidecar(tmp_path / "progress", "--control-dir", str(control),
                          RTJ_CONTROL_KEY=CONTROL_KEY, RTJ_JOB_UID=UID) as port:  # fmt: skip
        yield port, control


def test_a_pods_orders_and_its_read_share_one_connection_and_a_refusal_stops_nothing(
    tmp_path: Path,
) -> None:
    with control_sidecar(tmp_path) as (port, control):
        _exchange_orders_and_read(port, control)


def _exchange_orders_and_read(port: int, control: Path) -> None:
    key = CONTROL_KEY
    stop = Order(UID, 1, "stop").encode()
    forged = Order(UID, 2, "stop").encode()
    messages = [
        PollMessage(CONTROL_PATH, forged, sign("not the job's key", forged)),  # 403
        PollMessage(REPLICA_PATH, b"{}", sign(key, b"{}")),  # no replica here: 404
        PollMessage(CONTROL_PATH, stop, sign(key, stop)),  # taken
    ]
    with _CountingProxy(port) as proxy:
        answer = exchange_http("127.0.0.1", proxy.port, 5.0, messages)
        first = proxy.accepted  # each answer needed its connection accepted first
        taken = exchange_http("127.0.0.1", proxy.port, 5.0, messages[2:])
        connections = [first, proxy.accepted - first]
    assert answer.error is None and isinstance(answer.body, dict) and "ranks" in answer.body
    assert [m.path for m, _ in answer.refused] == [CONTROL_PATH, REPLICA_PATH], answer.refused
    assert "HTTP 403" in answer.refused[0][1] and "HTTP 404" in answer.refused[1][1]
    assert json.loads((control / ORDER_FILE).read_text())["generation"] == 1
    assert taken.error is None and not taken.refused and isinstance(taken.body, dict)
    # a refusal costs a new connection (what is left of it is not trusted); a pod that
    # takes its order is posted and read on one
    assert connections == [3, 1]


class _CountingProxy:
    """A TCP relay to the sidecar that counts the connections each `exchange_http` opens."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.accepted = 0

    def __enter__(self) -> _CountingProxy:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            upstream = socket.create_connection(("127.0.0.1", self.target))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def signed_sidecar(directory: Path) -> AbstractContextManager[int]:
    """A real progress sidecar as the operator renders it with a control key: the job's key
    and uid, and ``RTJ_SIGNED_READS=1`` (its port)."""
    return progress_sidecar(directory, RTJ_CONTROL_KEY=CONTROL_KEY, RTJ_JOB_UID=UID,
                            RTJ_SIGNED_READS="1")  # fmt: skip


def test_the_poller_signs_its_reads_and_a_signed_reads_sidecar_answers_only_them(
    tmp_path: Path, server: tuple[Path, int]
) -> None:
    """Issue 42: the operator's own poller (kept connections, `JobTargets.read_key`) reads a
    sidecar that refuses unsigned reads; without the job's key it gets 403, and an older
    sidecar (reads open) still answers the signed read."""
    directory = tmp_path / "signed"
    Progress(directory, rank=0).step_done(3)
    received = datetime(2026, 1, 1, tzinfo=timezone.utc)
    with signed_sidecar(directory) as port:
        target = PollTarget("llm-a1-worker-0-0-abcde", "127.0.0.1", port, 1)
        signed, unsigned = (
            RankPolls(lambda: received, lambda key: None),
            RankPolls(lambda: received, lambda key: None),
        )
        asyncio.run(signed.poll_once([JobTargets(KEY, (target,), read_key=CONTROL_KEY)]))
        asyncio.run(signed.poll_once([JobTargets(KEY, (target,), read_key=CONTROL_KEY)]))
        asyncio.run(unsigned.poll_once([JobTargets(KEY, (target,))]))
    reading = signed.reading(KEY)
    assert reading is not None and not reading.unanswered, reading
    assert [r["step"] for r in reading.reports[0].body["ranks"]] == [3]
    assert signed.connections is not None and signed.connections.opened == 1, "kept"
    refused = unsigned.reading(KEY)
    assert refused is not None and not refused.reports
    assert "HTTP 403" in refused.unanswered[0] and "X-RTJ-Time" in refused.unanswered[0]
    older, old_port = server  # a sidecar that answers anyone ignores the signature
    Progress(older, rank=0).step_done(5)
    old = PollTarget("llm-a1-worker-0-1-fghij", "127.0.0.1", old_port, 1)
    asyncio.run(signed.poll_once([JobTargets(KEY, (old,), read_key=CONTROL_KEY)]))
    reading = signed.reading(KEY)
    assert reading is not None and [r["step"] for r in reading.reports[0].body["ranks"]] == [5]
    signed.close()
    unsigned.close()


def sealed_sidecar(
    directory: Path, pod: str, attempt: int
) -> contextlib.AbstractContextManager[int]:
    """A real progress sidecar as the operator renders it now: signed reads, and answers
    sealed with its pod name and attempt (its port)."""
    return progress_sidecar(directory, RTJ_CONTROL_KEY=CONTROL_KEY, RTJ_JOB_UID=UID,
                            RTJ_SIGNED_READS="1", RTJ_SEALED_ANSWERS="1", RTJ_POD_NAME=pod,
                            RTJ_POD_ATTEMPT=str(attempt))  # fmt: skip


def test_only_the_pod_itself_answers_for_it_at_its_address(
    tmp_path: Path, server: tuple[Path, int]
) -> None:
    """Issue 42, finding 6: the poller reads a pod rendered to seal its answers with a fresh
    nonce, and counts an answer only with that pod's seal. Whatever else answers at the
    address (another pod of the job after the IP was reused, a pod of the job's earlier
    attempt, an unsealed server) is no answer from it."""
    directory = tmp_path / "sealed"
    Progress(directory, rank=0).step_done(3)
    received = datetime(2026, 1, 1, tzinfo=timezone.utc)
    polls = RankPolls(lambda: received, lambda key: None)
    pod = "llm-a2-worker-0-0-abcde"

    def read(target: PollTarget) -> Any:
        asyncio.run(polls.poll_once([JobTargets(KEY, (target,), read_key=CONTROL_KEY)]))
        return polls.reading(KEY)

    with sealed_sidecar(directory, pod, 2) as port:
        reading = read(PollTarget(pod, "127.0.0.1", port, 2, sealed=True))
        assert reading is not None and not reading.unanswered, reading
        assert [r["step"] for r in reading.reports[0].body["ranks"]] == [3]
        for who, attempt in (("llm-a2-worker-0-1-fghij", 2), (pod, 3)):
            reading = read(PollTarget(who, "127.0.0.1", port, attempt, sealed=True))
            assert reading is not None and not reading.reports, (who, attempt)
            assert f"not {who}'s seal" in reading.unanswered[0], reading.unanswered
    _, old_port = server  # an older (or a tenant's own) server: answers, but cannot seal
    reading = read(PollTarget(pod, "127.0.0.1", old_port, 2, sealed=True))
    assert reading is not None and not reading.reports
    assert "X-RTJ-Seal: missing" in reading.unanswered[0]
    polls.close()
    polls = RankPolls(lambda: received, lambda key: None)  # no back-off from the above
    reading = read(PollTarget(pod, "127.0.0.1", old_port, 2))  # a pod rendered before seals
    assert reading is not None and reading.reports, "read as before"
    polls.close()
