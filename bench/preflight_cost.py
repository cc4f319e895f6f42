"""What the preflight adds to a new world's start (issue 43, section 3: target under 2 s on
the pod runner).

`rtj-shim preflight` is every worker pod's first init container: the ring transfer across
the new world (``--payload-mib`` each way, the job's key signing the coordinator's messages)
and the platform's node command (here ``true``: the pod runner has no GPU to diagnose; a
real ``dcgmi diag -r 1`` adds its own seconds, which the platform chooses). Measured as the
pod runner runs them, local processes on loopback, all of a world's pods at once: the wall
time from launching the world to its last verdict. The baseline beside it: as many
processes of the same ``rtj-shim`` doing nothing (``--help``), the interpreter start any
init container pays. Medians over interleaved rounds, per world size.

    python -m bench.preflight_cost [--worlds 2,4,8] [--repeat 5] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

SHIM = [sys.executable, "-m", "rtj_shim.cli"]
KEY = "b" * 64


@dataclass(frozen=True)
class Row:
    world: int
    baseline_s: float
    preflight_s: float

    @property
    def added_s(self) -> float:
        return self.preflight_s - self.baseline_s


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wall(argvs: list[list[str]]) -> float:
    """Seconds from launching every process at once to the last one's exit (each must pass)."""
    env = {**os.environ, "RTJ_CONTROL_KEY": KEY}
    started = time.perf_counter()
    procs = [subprocess.Popen(a, env=env, stdout=subprocess.DEVNULL) for a in argvs]
    codes = [p.wait(300) for p in procs]
    took = time.perf_counter() - started
    if any(codes):
        raise RuntimeError(f"a process failed: exit codes {codes}")
    return took


def preflight(world: int, payload_mib: int, work: Path) -> float:
    port = _port()
    argvs = [
        [*SHIM, "preflight", "--rank", str(rank), "--world", str(world), "--coordinator",
         f"127.0.0.1:{port}", "--advertise", "127.0.0.1", "--timeout", "60",
         "--bytes", str(payload_mib << 20), "--termination-log",
         str(work / f"verdict-{world}-{rank}.json"), "--", "true"]
        for rank in range(world)
    ]  # fmt: skip
    took = _wall(argvs)
    for rank in range(world):
        verdict = json.loads((work / f"verdict-{world}-{rank}.json").read_text())
        if verdict.get("passed") is not True:
            raise RuntimeError(f"world {world} rank {rank} failed its preflight: {verdict}")
    return took


def baseline(world: int) -> float:
    return _wall([[*SHIM, "--help"] for _ in range(world)])


def report(rows: list[Row], args: argparse.Namespace) -> str:
    lines = [
        "# What the preflight adds to a new world's start",
        "",
        f"`python -m bench.preflight_cost --worlds {args.worlds} --payload-mib "
        f"{args.payload_mib}`: every pod of a world runs `rtj-shim preflight` at once as the "
        "pod runner runs them (local processes, loopback), a ring transfer of "
        f"{args.payload_mib} MiB each way and the node command `true`; the baseline, as "
        "many `rtj-shim --help` at once (the interpreter start any init container pays). "
        f"Wall time from launch to the last exit, medians of {args.repeat} interleaved rounds "
        f"on this machine ({os.cpu_count()} cores).",
        "",
        "| pods | baseline | preflight | added by the preflight | ratio |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = r.preflight_s / r.baseline_s if r.baseline_s else float("nan")
        lines.append(f"| {r.world} | {r.baseline_s:.2f} s | {r.preflight_s:.2f} s | "
                     f"{r.added_s:.2f} s | {ratio:.2f}x |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worlds", default="2,4,8")
    p.add_argument("--payload-mib", type=int, default=16)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--markdown", type=Path)
    args = p.parse_args(argv)
    worlds = [int(w) for w in args.worlds.split(",")]
    rounds: dict[int, list[tuple[float, float]]] = {w: [] for w in worlds}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeat):  # interleaved: a load that comes and goes hits both
            for w in worlds:
                rounds[w].append((baseline(w), preflight(w, args.payload_mib, Path(tmp))))
    rows = [Row(w, statistics.median(b for b, _ in rounds[w]),
                statistics.median(f for _, f in rounds[w])) for w in worlds]  # fmt: skip
    text = report(rows, args)
    print(text)
    if args.markdown is not None:
        args.markdown.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
