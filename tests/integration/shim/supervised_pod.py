"""A worker pod's in-place restart parts, on this machine: a real ``rtj-shim
progress-server`` taking orders for a control directory, ``rtj-shim supervise`` processes
around a command, and the operator's side (signed orders, the supervisor's report)."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rtj_shim.wire.control import Order, job_key, sign

RTJ_SHIM = str(Path(sys.executable).with_name("rtj-shim"))
UID = "9d1e2c3b-job-under-test"
KEY = job_key(b"the operator's secret", UID)


@dataclass
class Pod:
    control: Path
    out: Path
    port: int
    procs: list[subprocess.Popen[bytes]]

    def post(self, order: Order, key: str = KEY) -> tuple[int, dict[str, Any]]:
        raw = order.encode()
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("POST", "/control", raw, {"X-RTJ-Signature": sign(key, raw)})
            response = conn.getresponse()
            return response.status, json.loads(response.read())
        finally:
            conn.close()

    def supervisor(self) -> dict[str, Any] | None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("GET", "/progress")
            body: dict[str, Any] = json.loads(conn.getresponse().read())
            return body.get("supervisor")
        finally:
            conn.close()

    def supervise(
        self,
        *argv: str,
        deadline: float = 30,
        env: dict[str, str] | None = None,
        preload: str = "",
        fork: bool = True,
    ) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [RTJ_SHIM, "supervise", "--control-dir", str(self.control), "--grace", "1",
             "--stop-grace", "1", "--order-deadline", str(deadline), "--preload", preload,
             *([] if fork else ["--no-preload-fork"]), "--", *argv],
            env={**os.environ, "RTJ_ATTEMPT": "1", **(env or {})},
        )  # fmt: skip
        self.procs.append(proc)
        return proc


def until(what: str, fn: Callable[[], Any], timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.1)
    raise TimeoutError(f"timed out waiting for {what}")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
