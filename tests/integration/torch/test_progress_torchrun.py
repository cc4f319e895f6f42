"""Progress from real torchrun ranks (gloo, CPU) through a real ``rtj-shim progress-server``.

A rank stops itself with SIGSTOP inside ``forward``; the other finishes its forward and
blocks in DDP's gradient allreduce (``backward``). The server, another process, keeps
reporting both: the stopped rank's record is frozen and its ``seconds_in_section`` grows,
and the operator's pure verdict over those real reports names it. Every wait is bounded;
every process started here is stopped by its id.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rtj_operator.policy.progress import PodReport, hang_verdict

RTJ_SHIM = str(Path(sys.executable).with_name("rtj-shim"))
STOP_AT = 4  # rank 1 stops in the forward of the step after this one

WORKER = """
import os, signal, sys, time
import torch
import torch.distributed as dist
from rtj_shim import progress

stop_rank, stop_after = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(1)
torch.manual_seed(0)
dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
step = 0
while step < 100_000:
    with progress.section("data"):
        x, y = torch.randn(4, 8), torch.randn(4, 1)
        time.sleep(0.02)
    with progress.section("forward"):
        loss = ((model(x) - y) ** 2).mean()
        if rank == stop_rank and step == stop_after:
            os.kill(os.getpid(), signal.SIGSTOP)  # frozen: no Python runs in this rank now
    with progress.section("backward"):
        loss.backward()  # DDP's gradient allreduce: the other rank waits in here
    with progress.section("optimizer"):
        opt.step()
        opt.zero_grad()
    step += 1
    progress.step_done(step)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get_progress(port: int) -> dict[str, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/progress")
        response = conn.getresponse()
        assert response.status == 200
        body: dict[str, Any] = json.loads(response.read())
        return body
    finally:
        conn.close()


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def ours(pid: int, script: Path) -> bool:
    try:
        return str(script).encode() in (Path("/proc") / str(pid) / "cmdline").read_bytes()
    except OSError:
        return False


def stop(proc: subprocess.Popen[Any], workers: list[int], script: Path) -> None:
    """SIGKILL the workers (in sessions of their own: torchrun starts them so), then
    torchrun. A worker is killed only while its command line is our worker script."""
    for pid in {*workers, *children(proc.pid)}:
        if ours(pid, script):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    directory = tmp_path / "progress"
    proc = subprocess.Popen(
        [RTJ_SHIM, "progress-server", "--dir", str(directory), "--port", "0",
         "--host", "127.0.0.1"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = json.loads(proc.stdout.readline())
        yield directory, int(line["listening"]["port"])
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(timeout=30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)


def wait_for(port: int, ok: Any, timeout: float, what: str) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        body = get_progress(port)
        if ok(body):
            return body
        time.sleep(0.2)
    raise AssertionError(f"no {what} within {timeout}s; last report: {body}")


def by_rank(body: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {r["rank"]: r for r in body["ranks"]}


def test_a_stopped_rank_keeps_being_reported_and_is_named(
    tmp_path: Path, server: tuple[Path, int]
) -> None:
    directory, port = server
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    env = {**os.environ, "RTJ_PROGRESS_DIR": str(directory), "OMP_NUM_THREADS": "1"}
    env.pop("TORCHELASTIC_RESTART_COUNT", None)
    log = (tmp_path / "job.out").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--max-restarts", "0", "--master-addr", "127.0.0.1",
         "--master-port", str(free_port()), str(worker), "1", str(STOP_AT)],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    workers: list[int] = []
    try:

        def both_stuck(body: dict[str, Any]) -> bool:
            ranks = by_rank(body)
            workers[:] = [r["pid"] for r in ranks.values()]
            assert proc.poll() is None, (tmp_path / "job.out").read_text()[-3000:]
            return (
                len(ranks) == 2
                and ranks[1]["section"] == "forward"
                and ranks[1]["step"] == STOP_AT
                and ranks[0]["section"] == "backward"
                and ranks[1]["seconds_in_section"] > 1.0
            )

        first = wait_for(port, both_stuck, 240, "stopped rank 1 and waiting rank 0")
        received = time.monotonic()
        stopped = (Path("/proc") / str(by_rank(first)[1]["pid"]) / "stat").read_text()
        assert stopped.rsplit(")", 1)[1].split()[0] == "T"  # really stopped by SIGSTOP
        time.sleep(1.5)
        second = get_progress(port)
        a, b = by_rank(first), by_rank(second)
        # the stopped rank: its record is frozen, and the time in its section grows
        assert b[1]["seq"] == a[1]["seq"] and b[1]["state"] == "running"
        assert b[1]["seconds_in_section"] >= a[1]["seconds_in_section"] + 1.5
        assert b[1]["seconds_since_update"] >= a[1]["seconds_since_update"] + 1.5
        # the other rank waits in the collective at the same step, its clock running too;
        # its record keeps being written (the pulse: its process runs while it waits)
        assert (b[0]["step"], b[0]["section"]) == (STOP_AT, "backward")
        assert b[0]["seconds_in_section"] >= a[0]["seconds_in_section"] + 1.5
        assert b[0]["seq"] > a[0]["seq"] and b[0]["seconds_since_update"] < 3.0
        # (which of the two entered its section first is up to the scheduler: on a busy
        # machine rank 0 may enter backward before the late rank 1 entered forward; the
        # verdict orders them by phase, forward before backward, not by time)
        assert b[1]["steps_completed"] == STOP_AT and len(b[1]["recent_step_seconds"]) >= 3
        assert b[1]["median_step_seconds"] >= 0.02  # the data section sleeps 20 ms
        # the operator's pure verdict over these real reports
        assert hang_verdict([PodReport("pod-0", received, first)], 60.0, received) is None
        now = time.monotonic()
        hang = hang_verdict([PodReport("pod-0", now, second)], 1.0, now)
        assert hang is not None
        assert (hang.rank, hang.section, hang.step) == (1, "forward", STOP_AT)
        assert hang.ahead == (0,) and not hang.all_ranks_equally_stuck
        assert hang.seconds >= 2.5
    finally:
        stop(proc, workers, worker)
        log.close()
    # the records outlive the processes: rank 1 still says where it stopped
    last = by_rank(get_progress(port))
    assert last[1]["section"] == "forward" and last[1]["step"] == STOP_AT
