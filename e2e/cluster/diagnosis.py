"""What the harness prints when a test on the shared cluster fails: the state of the nodes
and their Leases, which cluster processes are alive, KWOK's newest errors and how loaded
the machine is. A failure in CI is read from its output alone (nothing else survives the
run), so the evidence of a harness fault (KWOK no longer renewing Leases, a starved or
exhausted machine) must be in it."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from .testenv import ClusterHandle

KWOK_ERRORS_SHOWN = 8
_SAID = ("time", "level", "msg", "source", "caller")


def kwok_errors(lines: Iterable[str], keep: int = KWOK_ERRORS_SHOWN) -> list[str]:
    """The newest ``keep`` error lines of KWOK's log (JSON lines, ``"level":"ERROR"``, as
    KWOK v0.8.0 writes them), each as ``time msg key=value...``; other lines are skipped."""
    found: list[str] = []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict) or entry.get("level") != "ERROR":
            continue
        detail = " ".join(f"{k}={v}" for k, v in entry.items() if k not in _SAID)
        found.append(f"{entry.get('time', '?')} {entry.get('msg', '')} {detail}".strip())
    return found[-keep:]


def machine_load() -> str:
    """Load average and available memory, from /proc (Linux)."""
    try:
        load = Path("/proc/loadavg").read_text().split()[:3]
        meminfo = dict(
            line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines()
        )
    except OSError as exc:
        return f"machine load unknown ({exc})"
    available = meminfo.get("MemAvailable", "?").strip()
    total = meminfo.get("MemTotal", "?").strip()
    return (
        f"load average {' '.join(load)} on {os.cpu_count()} cores; "
        f"memory available {available} of {total}"
    )


def failure_report(cluster: ClusterHandle) -> str:
    """The harness's side of a failed test, as lines to print."""
    out = [machine_load()]
    try:
        problems = cluster.node_problems()
        out.append("node problems: " + ("; ".join(map(str, problems)) or "none"))
    except Exception as exc:  # the report must not hide the test's own failure
        out.append(f"node problems unknown: {exc!r}")
    if cluster.local is not None:
        for proc in cluster.local.state.procs:
            out.append(f"{proc.name}: pid {proc.pid} {'alive' if proc.alive() else 'EXITED'}")
        try:
            kwok_log = Path(cluster.local.proc("kwok").log)
            with kwok_log.open(errors="replace") as lines:
                errors = kwok_errors(lines)
            out.append(f"kwok errors ({kwok_log}): " + ("\n  ".join(["", *errors]) or "none"))
        except (KeyError, OSError) as exc:
            out.append(f"kwok log unreadable: {exc!r}")
    return "\n".join(out)


__all__ = ["failure_report", "kwok_errors", "machine_load"]
