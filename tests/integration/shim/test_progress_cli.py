"""``rtj-shim progress-server`` and ``rtj-shim heartbeat`` as processes, as a pod runs them."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rtj_shim.progress import Progress
from rtj_shim.wire.control import job_key

RTJ_SHIM = str(Path(sys.executable).with_name("rtj-shim"))


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


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, int, subprocess.Popen[str]]]:
    directory = tmp_path / "progress"
    env = {**os.environ, "RTJ_PROGRESS_DIR": str(directory), "RTJ_PROGRESS_PORT": "0"}
    proc = subprocess.Popen(
        [RTJ_SHIM, "progress-server", "--host", "127.0.0.1"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        line = json.loads(proc.stdout.readline())
        assert line["dir"] == str(directory) and line["listening"]["host"] == "127.0.0.1"
        yield directory, int(line["listening"]["port"]), proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


def test_a_shell_loop_reports_through_heartbeat(
    tmp_path: Path, served: tuple[Path, int, subprocess.Popen[str]]
) -> None:
    directory, port, server = served
    script = (
        f'for i in 1 2 3 4; do "{RTJ_SHIM}" heartbeat --step "$i" --section train; '
        "sleep 0.05; done; echo $$"
    )
    env = {**os.environ, "RTJ_PROGRESS_DIR": str(directory), "RANK": "6", "LOCAL_RANK": "2"}
    loop = subprocess.run(
        ["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert loop.returncode == 0 and loop.stderr == ""
    (rank,) = get_progress(port)["ranks"]
    assert (rank["rank"], rank["local_rank"], rank["pid"]) == (6, 2, int(loop.stdout))
    assert (rank["step"], rank["section"], rank["state"]) == (4, "train", "running")
    assert rank["steps_completed"] == 4 and len(rank["recent_step_seconds"]) == 3
    assert min(rank["recent_step_seconds"]) >= 0.05
    # the same step again is no progress: the time in the section keeps counting
    again = subprocess.run(
        [RTJ_SHIM, "heartbeat", "--step", "4", "--section", "train"],
        env=env,
        timeout=60,
    )
    assert again.returncode == 0
    (after,) = get_progress(port)["ranks"]
    assert after["seconds_in_section"] > rank["seconds_in_section"]
    assert after["seconds_since_update"] < after["seconds_in_section"]
    server.send_signal(signal.SIGTERM)
    assert server.wait(timeout=30) == 0


def test_heartbeat_without_a_directory_does_nothing(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "RTJ_PROGRESS_DIR"}
    proc = subprocess.run(
        [RTJ_SHIM, "heartbeat", "--step", "3"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")
    assert list(tmp_path.iterdir()) == []


def test_heartbeat_that_cannot_write_warns_and_never_fails_the_job(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    proc = subprocess.run(
        [RTJ_SHIM, "heartbeat", "--step", "3", "--dir", str(blocker / "sub")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0
    assert "heartbeat not recorded" in proc.stderr


def test_usage_errors_exit_2() -> None:
    bad = subprocess.run(
        [RTJ_SHIM, "heartbeat", "--step", "-1"], capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2 and "non-negative" in bad.stderr
    env = {k: v for k, v in os.environ.items() if k != "RTJ_PROGRESS_DIR"}
    missing = subprocess.run(
        [RTJ_SHIM, "progress-server"], capture_output=True, text=True, timeout=60, env=env
    )
    assert missing.returncode == 2 and "--dir" in missing.stderr
    listed = subprocess.run([RTJ_SHIM, "--help"], capture_output=True, text=True, timeout=60)
    assert "progress-server" in listed.stdout and "heartbeat" in listed.stdout


def test_progress_get_reads_a_signed_reads_sidecar_with_the_pods_key(tmp_path: Path) -> None:
    """A person in the sidecar's container reads what the operator reads (issue 42: the
    sidecar of a job with a key answers only signed reads): `rtj-shim progress-get` signs
    with the container's own ``RTJ_CONTROL_KEY``."""
    directory = tmp_path / "progress"
    Progress(directory, 0).step_done(9)
    key = job_key(b"the operator's secret", "job-uid")
    pod = {**os.environ, "RTJ_CONTROL_KEY": key, "RTJ_JOB_UID": "job-uid"}
    proc = subprocess.Popen(
        [RTJ_SHIM, "progress-server", "--dir", str(directory), "--port", "0",
         "--host", "127.0.0.1"],
        stdout=subprocess.PIPE, text=True, env={**pod, "RTJ_SIGNED_READS": "1"},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        port = str(json.loads(proc.stdout.readline())["listening"]["port"])
        get = [RTJ_SHIM, "progress-get", "--host", "127.0.0.1", "--port", port]
        signed = subprocess.run(get, capture_output=True, text=True, timeout=60, env=pod)
        assert signed.returncode == 0, signed.stderr
        assert [r["step"] for r in json.loads(signed.stdout)["ranks"]] == [9]
        no_key = {k: v for k, v in pod.items() if k != "RTJ_CONTROL_KEY"}
        refused = subprocess.run(get, capture_output=True, text=True, timeout=60, env=no_key)
        assert refused.returncode == 1 and "HTTP 403" in refused.stderr
        assert refused.stdout == ""
    finally:
        proc.terminate()
        proc.wait(timeout=30)
