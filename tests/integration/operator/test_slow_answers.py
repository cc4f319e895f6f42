"""Issue 42, finding 4: pods that answer slowly but validly cost their own job's share of
a poll round, never the other jobs' (`policy.poll_budget`). The innocent job's pod is a
real `rtj-shim progress-server`; the slow job's pods are what a hostile tenant can put on
its sidecar port: an HTTP server that answers a valid report just inside the timeout."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from sidecar_procs import progress_sidecar

from rtj_operator.pod_http import fetch_progress
from rtj_operator.rank_polls import JobTargets, RankPolls
from rtj_operator.reconcile import PollTarget
from rtj_shim.progress import Progress

SLOW = 0.6
INNOCENT = ("team-a", "llm")
HOSTILE = ("team-b", "slow")


class _SlowSidecar(ThreadingHTTPServer):
    daemon_threads = True
    asked = 0
    body = b"{}"


class _SlowHandler(BaseHTTPRequestHandler):
    server: _SlowSidecar

    def do_GET(self) -> None:
        self.server.asked += 1
        time.sleep(SLOW)  # valid, just slow
        body = self.server.body
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def slow_sidecars(count: int, body: bytes) -> Iterator[list[_SlowSidecar]]:
    """`count` servers that answer `body` (a real sidecar's report, replayed) after SLOW s."""
    servers = [_SlowSidecar(("127.0.0.1", 0), _SlowHandler) for _ in range(count)]
    for s in servers:
        s.body = body
        threading.Thread(target=s.serve_forever, daemon=True).start()
    try:
        yield servers
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()


def test_slow_valid_answers_cost_their_own_job_and_every_pod_is_still_read_in_turn(
    tmp_path: Path,
) -> None:
    Progress(tmp_path, rank=0).step_done(5)
    received = datetime(2026, 1, 1, tzinfo=timezone.utc)
    polls = RankPolls(lambda: received, lambda key: None, concurrency=2, timeout=3.0)
    with contextlib.ExitStack() as stack:
        port = stack.enter_context(progress_sidecar(tmp_path))
        report = json.dumps(fetch_progress("127.0.0.1", port, timeout=5.0)).encode()
        slow = stack.enter_context(slow_sidecars(8, report))
        hostile = JobTargets(HOSTILE, tuple(
            PollTarget(f"slow-a1-worker-0-{i}-x", "127.0.0.1", s.server_address[1], 1)
            for i, s in enumerate(slow)
        ))  # fmt: skip
        rank0 = PollTarget("llm-a1-worker-0-0-abcde", "127.0.0.1", port, 1)
        innocent = JobTargets(INNOCENT, (rank0,))
        asked: list[list[int]] = []
        for _ in range(3):
            before = [s.asked for s in slow]
            asyncio.run(polls.poll_once([hostile, innocent]))
            asked.append([s.asked - b for s, b in zip(slow, before, strict=True)])
            reading = polls.reading(INNOCENT)
            assert reading is not None and not reading.unanswered, reading
            assert [r["step"] for r in reading.reports[0].body["ranks"]] == [5]
        slow_reading = polls.reading(HOSTILE)
    # round 1 prices pods never asked at the pod share: all 8 asked, and measured. From then
    # on the job's 2 s budget holds 4 answers of 0.6 s a round (the 4th starts at 1.8 s):
    # the other 4 wait for the next round, where they go first
    assert asked[0] == [1] * 8
    assert sum(asked[1]) == 4 and sum(asked[2]) == 4, asked
    assert [a + b for a, b in zip(asked[1], asked[2], strict=True)] == [1] * 8, asked
    assert polls.left_out == {HOSTILE: 4, INNOCENT: 0}
    # the pods left out keep their last report: an unasked pod is never a non-answer
    assert slow_reading is not None and len(slow_reading.reports) == 8
    assert not slow_reading.unanswered
    polls.close()


def test_pods_that_do_not_answer_are_not_priced_out_and_stay_unanswered(
    tmp_path: Path,
) -> None:
    """Found under load (the buddy drill): a frozen node's pods time out; priced at their
    timeout they left each other out of the round, and a pod left out read as answered by
    its last report, so liveness heard nothing of the node going quiet. A failure costs
    nothing against the budget (its back-off bounds it) and a silent pod stays unanswered."""
    Progress(tmp_path, rank=0).step_done(5)
    received = datetime(2026, 1, 1, tzinfo=timezone.utc)
    polls = RankPolls(lambda: received, lambda key: None, concurrency=2, timeout=0.5,
                      pod_share=0.05, min_job_budget=0.2)  # fmt: skip
    silent = [socket.create_server(("127.0.0.1", 0)) for _ in range(3)]  # accept, never answer
    try:
        with progress_sidecar(tmp_path) as port:
            pods = [PollTarget(f"llm-a1-worker-0-{i}-x", "127.0.0.1",
                               s.getsockname()[1], 1) for i, s in enumerate(silent)]  # fmt: skip
            pods.append(PollTarget("llm-a1-worker-0-3-x", "127.0.0.1", port, 1))
            job = JobTargets(INNOCENT, tuple(pods))
            for _ in range(3):  # the third: the silent pods are due again after a back-off
                asyncio.run(polls.poll_once([job]))
            reading = polls.reading(INNOCENT)
    finally:
        for s in silent:
            s.close()
    assert reading is not None and polls.left_out == {INNOCENT: 0}
    assert len(reading.unanswered) == 3 and set(reading.quiet_since) <= {p.pod for p in pods}
    assert [r.pod for r in reading.reports] == ["llm-a1-worker-0-3-x"]
    polls.close()
