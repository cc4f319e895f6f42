"""What progress reporting costs a training step, side by side with the same loop without it.

A synthetic step does a fixed amount of CPU work (sha256 over a 64 KiB buffer, calibrated to
``--step-ms``, default 50 ms), split into the four usual sections. Measured, in one
process, on the same work:

1. side by side: steps without reporting and with it (``data``, ``forward``, ``backward``,
   ``optimizer`` sections and ``step_done``: 9 record updates per step), alternated step
   by step (ABBA) so drift hits both; the ratio of the medians of their step times (wall
   and the thread's CPU time), next to the same ratio between the baseline's odd and even
   steps (the noise floor, A/A);
2. the reporting itself, without work: the time of those 9 updates per step (median of
   many), as a fraction of the step; the target (issue 12) is < 1% of a 50 ms step;
3. the same calls without ``RTJ_PROGRESS_DIR`` (the no-op path);
4. for scale: one ``GET /progress`` body built from 8 ranks' records.

A miss never fails the run; only an error exits non-zero.

    python -m bench.progress_overhead [--step-ms 50] [--quick] [--json FILE]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rtj_shim import progress as module
from rtj_shim.agent.progress_report import report
from rtj_shim.progress import Progress

REPO = Path(__file__).resolve().parent.parent
BENCH_DIR = REPO / ".bench"
TARGET = 0.01  # reporting < 1% of the step
SECTIONS = ("data", "forward", "backward", "optimizer")
BUF = os.urandom(64 << 10)


def work(rounds: int) -> None:
    for _ in range(rounds):
        hashlib.sha256(BUF).digest()


def calibrate(seconds: float) -> int:
    """Rounds of ``work`` that take about ``seconds`` (median of a few tries)."""
    times = []
    for _ in range(5):
        started = time.perf_counter()
        work(20)
        times.append((time.perf_counter() - started) / 20)
    return max(4, round(seconds / statistics.median(times)))


def plain_step(rounds: int, step: int) -> None:
    for _ in SECTIONS:
        work(rounds)


def reported_step(progress: Any) -> Callable[[int, int], None]:
    def step_fn(rounds: int, step: int) -> None:
        for name in SECTIONS:
            with progress.section(name):
                work(rounds)
        progress.step_done(step)

    return step_fn


def timed_steps(fn: Callable[[int, int], None], rounds: int, n: int, first: int) -> list[float]:
    out = []
    for i in range(n):
        started = time.perf_counter()
        fn(rounds, first + i)
        out.append(time.perf_counter() - started)
    return out


def one_step(fn: Callable[[int, int], None], rounds: int, step: int) -> tuple[float, float]:
    """(wall, CPU time of this thread) of one step: CPU time is what other processes on a
    busy machine disturb least."""
    wall, cpu = time.perf_counter(), time.thread_time()
    fn(rounds, step)
    return time.perf_counter() - wall, time.thread_time() - cpu


def side_by_side(progress: Progress, step_s: float, pairs: int) -> dict[str, Any]:
    """Steps with and without reporting, alternated one by one (ABBA), on the same work."""
    rounds = max(1, calibrate(step_s) // len(SECTIONS))
    measured = statistics.median(timed_steps(plain_step, rounds, 3, 0))
    rounds = max(1, round(rounds * step_s / measured))  # the whole step, not one hash
    reported = reported_step(progress)
    timed_steps(reported, rounds, 2, 1)  # warm up
    base: list[tuple[float, float]] = []
    cand: list[tuple[float, float]] = []
    step = 3
    for i in range(pairs):
        order = [(plain_step, base), (reported, cand)]
        if i % 2:
            order.reverse()
        for fn, sink in order:
            sink.append(one_step(fn, rounds, step))
            step += 1

    def median(rows: list[tuple[float, float]], k: int) -> float:
        return statistics.median(r[k] for r in rows)

    return {
        "rounds_per_section": rounds,
        "steps_each": len(cand),
        "baseline_median_ms": median(base, 0) * 1e3,
        "reported_median_ms": median(cand, 0) * 1e3,
        "ratio_wall": median(cand, 0) / median(base, 0),
        "noise_a_a_wall": median(base[1::2], 0) / median(base[0::2], 0),
        "ratio_cpu": median(cand, 1) / median(base, 1),
        "noise_a_a_cpu": median(base[1::2], 1) / median(base[0::2], 1),
    }


def per_step_cost(progress: Any, reps: int) -> float:
    """Seconds the reporting of one step takes (4 sections + step_done), median of blocks."""
    step_fn = reported_step(progress)
    blocks = []
    for b in range(20):
        started = time.perf_counter()
        for i in range(reps):
            step_fn(0, 10_000_000 + b * reps + i)
        blocks.append((time.perf_counter() - started) / reps)
    return statistics.median(blocks)


def server_cost(directory: Path, reps: int) -> float:
    ranks = [Progress(directory, rank, rank) for rank in range(8)]
    for p in ranks:
        p.step_done(1)
        p.enter("forward")
    started = time.perf_counter()
    for _ in range(reps):
        body = report(directory)
    took = (time.perf_counter() - started) / reps
    assert len(body["ranks"]) == 8
    for p in ranks:
        p.close()
    return took


def run(args: argparse.Namespace) -> dict[str, Any]:
    BENCH_DIR.mkdir(exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="progress-", dir=BENCH_DIR))
    try:
        step_s = args.step_ms / 1e3
        pairs = 20 if args.quick else 100
        reps = 500 if args.quick else 5000
        results: dict[str, Any] = {
            "context": {
                "python": platform.python_version(),
                "machine": platform.machine(),
                "cpus": os.cpu_count(),
                "loadavg_start": os.getloadavg(),
                "step_ms": args.step_ms,
            }
        }
        progress = Progress(tmp / "a", 0)
        print(f"1. side by side: {pairs} steps of ~{args.step_ms:g} ms each way, alternated")
        sbs = side_by_side(progress, step_s, pairs)
        results["side_by_side"] = sbs
        print(
            f"   without reporting {sbs['baseline_median_ms']:.2f} ms, with "
            f"{sbs['reported_median_ms']:.2f} ms (medians): ratio {sbs['ratio_wall']:.4f} "
            f"wall, {sbs['ratio_cpu']:.4f} CPU time (noise floor, baseline A/A: "
            f"{sbs['noise_a_a_wall']:.4f} wall, {sbs['noise_a_a_cpu']:.4f} CPU)"
        )
        cost = per_step_cost(progress, reps)
        fraction = cost / step_s
        results["reporting"] = {
            "seconds_per_step": cost,
            "updates_per_step": 2 * len(SECTIONS) + 1,
            "fraction_of_step": fraction,
            "target": TARGET,
            "passed": fraction < TARGET,
        }
        verdict = "PASS" if fraction < TARGET else "MISS"
        print(
            f"2. reporting per step (9 updates): {cost * 1e6:.1f} us = "
            f"{fraction * 100:.3f}% of a {args.step_ms:g} ms step (target < 1%): {verdict}"
        )
        progress.close()
        module.install(module.NULL)
        off = per_step_cost(module, reps)
        module.install(None)
        results["disabled_seconds_per_step"] = off
        print(f"3. without RTJ_PROGRESS_DIR: {off * 1e9:.0f} ns per step (module-level calls)")
        served = server_cost(tmp / "b", 50 if args.quick else 500)
        results["server_report_8_ranks_seconds"] = served
        print(f"4. GET /progress body for 8 ranks: {served * 1e3:.3f} ms to build")
        results["context"]["loadavg_end"] = os.getloadavg()
        return results
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step-ms", type=float, default=50.0)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    results = run(args)
    print("load average: " + " ".join(f"{x:.2f}" for x in results["context"]["loadavg_end"]))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
