"""e2e.cluster.processes: a recorded process group is signalled only while it is still the
one started (pids wrap: a stale state file must not kill whatever holds its pids now)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.cluster import processes
from e2e.cluster.processes import Proc


@pytest.fixture
def stranger() -> Iterator[subprocess.Popen[bytes]]:
    """Some other program leading a process group of its own (as a job-controlled shell's
    background job does), at a pid a stale state file names. Handed over once it runs its
    own program: between fork and exec its /proc cmdline is empty (a zombie's looks the same)
    or its parent's."""
    argv = [sys.executable, "-c", "import time; time.sleep(60)"]
    proc = subprocess.Popen(argv, start_new_session=True)
    cmdline = Path(f"/proc/{proc.pid}/cmdline")
    deadline = time.monotonic() + 10
    while cmdline.read_bytes().rstrip(b"\0").split(b"\0") != [a.encode() for a in argv]:
        assert time.monotonic() < deadline, "the stranger never ran its program"
        time.sleep(0.01)
    yield proc
    proc.kill()
    proc.wait(timeout=10)


def test_a_stale_record_of_a_reused_pid_signals_nothing(
    stranger: subprocess.Popen[bytes],
) -> None:
    stale = Proc("etcd", stranger.pid, "etcd.log", [], ["/root/.cache/rtj/bin/etcd-v3.6.5"])
    assert not stale.ours() and not stale.alive()
    processes.stop([stale], timeout=0.5)
    assert stranger.poll() is None, "another program's group was signalled"
    assert not processes.leftovers([stale])


def test_the_group_it_started_is_still_stopped(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import time; time.sleep(60)"]
    started = processes.start("sleeper", argv, tmp_path)
    assert started.ours() and started.alive()
    processes.stop([started], timeout=5)
    assert not started.alive()
    # a record from before argv was kept is trusted as before
    assert Proc("old", started.pid, "", [], []).ours()
