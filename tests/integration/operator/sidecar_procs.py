"""Real `rtj-shim progress-server` processes on loopback for the poller's tests."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

RTJ_SHIM = str(Path(sys.executable).with_name("rtj-shim"))


@contextlib.contextmanager
def progress_sidecar(directory: Path, *args: str, **env: str) -> Iterator[int]:
    """A sidecar serving `directory` on 127.0.0.1 (its port), with more flags `args` and
    more environment `env` (the job's key, ``RTJ_SIGNED_READS``, ... as the operator renders
    them); stopped at the end."""
    proc = subprocess.Popen(
        [RTJ_SHIM, "progress-server", "--dir", str(directory), "--port", "0",
         "--host", "127.0.0.1", *args],
        stdout=subprocess.PIPE, text=True, env={**os.environ, **env},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        yield int(json.loads(proc.stdout.readline())["listening"]["port"])
    finally:
        proc.terminate()
        proc.wait(timeout=30)
