"""`rtj-shim preflight` as real processes on loopback (issue 43 section 3): a world of four
pods joins rank 0's coordinator, passes its ring transfer and its node check; a smaller one
runs the node check alone; a pod whose link is
slow both ways fails the collective check (its neighbours do not); a node check that exits
non-zero fails its pod; a world that does not gather proves nothing against anyone; a pod
without the job's key cannot join; a replacement pod runs the node check alone."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

SHIM = [sys.executable, "-m", "rtj_shim.cli", "preflight"]
KEY = "k" * 64


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _world(
    tmp: Path,
    world: int,
    *,
    extra: dict[int, list[str]] | None = None,
    env: dict[int, dict[str, str]] | None = None,
    node: list[str] | None = None,
    timeout: float = 30,
    ranks: range | None = None,
) -> dict[int, tuple[int, dict[str, object]]]:
    """Run the ranks (all by default) at once; each one's exit code and verdict."""
    port, procs = _port(), {}
    for rank in ranks or range(world):
        log = tmp / f"verdict-{rank}.json"
        argv = [*SHIM, "--rank", str(rank), "--world", str(world), "--coordinator",
                f"127.0.0.1:{port}", "--advertise", "127.0.0.1", "--timeout", str(timeout),
                "--termination-log", str(log), *(extra or {}).get(rank, []),
                "--", *(node or ["true"])]  # fmt: skip
        pod_env = {**os.environ, "RTJ_CONTROL_KEY": KEY, **(env or {}).get(rank, {})}
        procs[rank] = (subprocess.Popen(argv, env=pod_env, stdout=subprocess.PIPE), log)
    out = {}
    for rank, (proc, log) in procs.items():
        proc.wait(timeout + 30)
        out[rank] = (proc.returncode, json.loads(log.read_text()))
    return out


def test_a_healthy_world_passes_and_reports_its_rates(tmp_path: Path) -> None:
    found = _world(tmp_path, 4)
    for code, verdict in found.values():
        assert code == 0 and verdict["passed"] is True, verdict
        assert verdict["world"] == 4 and float(str(verdict["send_bytes_per_second"])) > 0
        assert verdict["node_check"] is not None and str(verdict["node_check"]).startswith("exit 0")


def test_a_pod_slow_both_ways_fails_and_its_neighbours_do_not(tmp_path: Path) -> None:
    slow = ["--throttle-bytes-per-second", "20000000"]
    found = _world(tmp_path, 4, extra={2: slow})
    assert {rank: code for rank, (code, _) in found.items()} == {0: 0, 1: 0, 2: 1, 3: 0}
    verdict = found[2][1]
    assert verdict["check"] == "collective" and "rank 2 sent at" in str(verdict["reason"])


def test_a_failing_node_check_fails_its_pod(tmp_path: Path) -> None:
    found = _world(tmp_path, 2, node=["sh", "-c", "echo XID 79 on GPU 3 >&2; exit 3"])
    for code, verdict in found.values():
        assert code == 1 and verdict["check"] == "node", verdict
        assert "exited 3" in str(verdict["reason"]) and "XID 79" in str(verdict["reason"])


def test_a_node_check_this_image_lacks_is_skipped_with_a_note(tmp_path: Path) -> None:
    found = _world(tmp_path, 2, node=["dcgmi-not-installed", "diag", "-r", "1"])
    for code, verdict in found.values():
        assert code == 0 and "not in this image" in " ".join(map(str, verdict["notes"])), verdict


def test_a_world_that_does_not_gather_blames_nobody(tmp_path: Path) -> None:
    found = _world(tmp_path, 4, ranks=range(3), timeout=3)  # rank 3 never starts
    for code, verdict in found.values():
        assert code == 0 and verdict["passed"] is True
        assert "did not join in time" in " ".join(map(str, verdict["notes"])), verdict


def test_a_pod_without_the_jobs_key_cannot_join(tmp_path: Path) -> None:
    found = _world(tmp_path, 4, env={1: {"RTJ_CONTROL_KEY": "x" * 64}}, timeout=3)
    assert all(code == 0 for code, _ in found.values()), "nobody is blamed for a stranger"
    notes = " ".join(map(str, found[0][1]["notes"]))
    assert "did not join in time" in notes, found


def test_a_small_world_runs_the_node_check_alone(tmp_path: Path) -> None:
    """Under 4 pods no link can be put on one pod: no ring, nothing waited for (a world of
    one, whose coordinator may not even resolve yet, starts at once)."""
    found = _world(tmp_path, 3, ranks=range(1), timeout=60)
    code, verdict = found[0]
    assert code == 0 and "under 4 pods" in " ".join(map(str, verdict["notes"])), verdict


def test_a_replacement_pod_runs_the_node_check_alone(tmp_path: Path) -> None:
    found = _world(tmp_path, 4, ranks=range(3, 4), env={3: {"RTJ_INDEX_FAILURES": "1"}},
                   timeout=60)  # fmt: skip
    code, verdict = found[3]
    assert code == 0 and "collective test skipped" in " ".join(map(str, verdict["notes"]))


def test_a_coordinator_port_in_use_blames_nobody(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = [*SHIM, "--rank", "0", "--world", "4", "--coordinator", f"127.0.0.1:{port}",
                "--advertise", "127.0.0.1", "--timeout", "30", "--", "true"]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    verdict = json.loads(done.stdout)
    assert done.returncode == 0 and verdict["passed"] is True, done.stdout + done.stderr
    assert "cannot listen on port" in " ".join(verdict["notes"])


@pytest.mark.parametrize(
    ("args", "named"),
    [(["--rank", "4", "--world", "4", "--coordinator", "h:1"], "--rank"),
     (["--rank", "0", "--world", "2", "--coordinator", "nohostport"], "--coordinator")],
)  # fmt: skip
def test_bad_arguments_are_named(args: list[str], named: str) -> None:
    done = subprocess.run([*SHIM, *args], capture_output=True, text=True, check=False)
    assert done.returncode == 2 and named in done.stderr, done.stderr
