"""The `pod` fixture: a progress server taking restart orders (supervised_pod.Pod)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from supervised_pod import KEY, RTJ_SHIM, UID, Pod

from rtj_shim.agent.supervisor import descendants


@pytest.fixture
def pod(tmp_path: Path) -> Iterator[Pod]:
    control, out = tmp_path / "control", tmp_path / "out"
    control.mkdir()
    out.mkdir()
    server = subprocess.Popen(
        [RTJ_SHIM, "progress-server", "--dir", str(tmp_path / "progress"), "--port", "0",
         "--host", "127.0.0.1", "--control-dir", str(control)],
        env={**os.environ, "RTJ_CONTROL_KEY": KEY, "RTJ_JOB_UID": UID},
        stdout=subprocess.PIPE,
    )  # fmt: skip
    assert server.stdout is not None
    port = json.loads(server.stdout.readline())["listening"]["port"]
    p = Pod(control, out, port, [server])
    yield p
    for proc in reversed(p.procs):
        if proc.poll() is None:
            # and what it runs, as a container's end would: a supervisor SIGKILLed leaves
            # its command's processes to init (they slept on for minutes after the tests)
            left = descendants(proc.pid)
            proc.kill()
            proc.wait(10)
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
