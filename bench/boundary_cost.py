"""What ``Checkpointer.step_boundary`` costs a step that saves nothing (issue 48: the target is
0.1 ms), in a real world of gloo ranks on this machine.

Two worlds run one after the other: the Checkpointer as it is (a reduction every few
boundaries), and the baseline with a reduction at every boundary (as before issue 48). Each
rank trains nothing: a step is a fixed amount of CPU work (``--step-ms``, default 20 ms) and
an all-reduce of 256 KiB (as DDP's gradients, which keeps the ranks in step), then
``step_boundary`` with a schedule that never saves. Measured per rank: the time of the
``step_boundary`` call itself (median and p90 over ``--steps``, after a warm-up), beside the
time of a bare ``progress.step_done`` (what a boundary cannot avoid: the rank's progress
record) on the same steps. The world is started here (``--ranks`` processes, a loopback
rendezvous); figures go to stdout and, with ``--json``, to a file.

    python -m bench.boundary_cost [--ranks 2] [--steps 1500] [--step-ms 20] [--json FILE]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import free_port

TARGET_MS = 0.1
BUF = os.urandom(64 << 10)
WARMUP = 100


def _work(rounds: int) -> None:
    for _ in range(rounds):
        hashlib.sha256(BUF).digest()


def _rounds_for(seconds: float) -> int:
    started = time.perf_counter()
    _work(50)
    per = (time.perf_counter() - started) / 50
    return max(1, int(seconds / per))


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def rank_main(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from rtj_shim import progress
    from rtj_shim.torch import Checkpointer

    if args.every_boundary:  # the baseline: a reduction at every boundary, as before issue 48
        from rtj_shim.torch import agreement

        agreement.MAX_CADENCE = 1
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    rounds = _rounds_for(args.step_ms / 1000)
    ckpt = Checkpointer(Path(args.root), every_steps=10**9)
    objects: dict[str, Any] = {"step": 0}
    boundary, bare = [], []
    grads = torch.zeros(1 << 16)  # a step's gradient all-reduce (256 KiB), as DDP's
    for step in range(1, args.steps + WARMUP + 1):
        _work(rounds)
        dist.all_reduce(grads)  # keeps the ranks in step, as training does
        started = time.perf_counter()
        ckpt.step_boundary(step, objects)
        took = time.perf_counter() - started
        started = time.perf_counter()
        progress.step_done(step)
        floor = time.perf_counter() - started
        if step > WARMUP:
            boundary.append(took * 1e3)
            bare.append(floor * 1e3)
    ckpt.close()
    out = {
        "rank": rank,
        "boundary_ms_median": statistics.median(boundary),
        "boundary_ms_p90": _quantile(boundary, 0.9),
        "boundary_ms_max": max(boundary),
        "progress_only_ms_median": statistics.median(bare),
    }
    Path(args.out, f"rank-{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


def _world(args: argparse.Namespace, *, every_boundary: bool) -> list[dict[str, Any]] | None:
    """One world of `args.ranks` processes; each rank's figures (None: a rank failed)."""
    with tempfile.TemporaryDirectory() as tmp:
        port, procs = free_port(), []
        for rank in range(args.ranks):
            env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                   "RANK": str(rank), "WORLD_SIZE": str(args.ranks),
                   "RTJ_PROGRESS_DIR": str(Path(tmp, f"progress-{rank}"))}  # fmt: skip
            argv_rank = [sys.executable, "-m", "bench.boundary_cost", "--rank-main",
                         "--root", str(Path(tmp, "ckpt")), "--out", tmp,
                         "--steps", str(args.steps), "--step-ms", str(args.step_ms),
                         *(["--every-boundary"] if every_boundary else [])]  # fmt: skip
            procs.append(subprocess.Popen(argv_rank, env=env))
        codes = [proc.wait() for proc in procs]
        if any(codes):
            print(f"boundary_cost: a rank failed: {codes}", file=sys.stderr)
            return None
        return [json.loads(Path(tmp, f"rank-{r}.json").read_text()) for r in range(args.ranks)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--step-ms", type=float, default=20.0)
    p.add_argument("--json", type=Path)
    p.add_argument("--every-boundary", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--root", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rank_main:
        rank_main(args)
        return 0
    ranks = _world(args, every_boundary=False)
    baseline = _world(args, every_boundary=True)
    if ranks is None or baseline is None:
        return 1
    worst = max(r["boundary_ms_median"] for r in ranks)
    before = max(r["boundary_ms_median"] for r in baseline)
    result = {"ranks": ranks, "every_boundary": baseline, "steps": args.steps,
              "step_ms": args.step_ms, "target_ms": TARGET_MS, "worst_median_ms": worst,
              "every_boundary_worst_median_ms": before, "ratio": worst / before,
              "met": worst <= TARGET_MS}  # fmt: skip
    for r in ranks:
        print(f"rank {r['rank']}: step_boundary median {r['boundary_ms_median']:.3f} ms, "
              f"p90 {r['boundary_ms_p90']:.3f} ms, max {r['boundary_ms_max']:.2f} ms "
              f"(progress record alone {r['progress_only_ms_median']:.4f} ms)")  # fmt: skip
    print(f"side by side, a reduction at every boundary: worst median {before:.3f} ms "
          f"(ratio {worst / before:.2f})")  # fmt: skip
    verdict = "met" if result["met"] else "MISSED"
    print(f"worst rank's median {worst:.3f} ms against the {TARGET_MS} ms target: {verdict}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
