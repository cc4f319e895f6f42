"""What rtj_shim.torch costs, against plain torch.save / torch.load of the same state.

One process, one ~1 GiB training state (a stack of Linear layers and its AdamW moments:
parameters 1/3, exp_avg 1/3, exp_avg_sq 1/3), in ``<repo>/.bench/`` (git-ignored, removed
afterwards). Every pair runs side by side, alternating, ``--repeat`` times; medians count.

1. blocking save: ``Checkpointer.save(step, objects)`` (stream into the store, sha256 while
   writing, fsync, manifest, COMMITTED, rename; RNG and metadata included) against
   ``torch.save({"model": ..., "optim": ...}, f)`` + flush + fsync of the same state;
   target <= 1.15x.
2. training-thread stall of ``save(blocking=False)``: time inside the call plus the time
   the next ``optimizer.step()`` waits for staging, measured around a real forward/backward
   of the model; against the blocking save's duration; target <= 0.1x. Also reported:
   how much longer that training step took than the same step without a save in flight
   (CPU contention on this small machine; the background save shares its two cores).
3. restore: ``Checkpointer.restore(objects)`` (deep verification of every file's sha256,
   load, apply to the model and optimizer) against ``torch.load`` of the baseline file
   (and, for information, ``torch.load`` + ``load_state_dict``); target <= 1.3x.

Each line prints absolute numbers, the ratio, the target and PASS/MISS; a miss never fails
the run, only an error exits non-zero.

    python -m bench.torch_state [--size-gib 1.0] [--repeat 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rtj_shim.torch import Checkpointer

REPO = Path(__file__).resolve().parent.parent
BENCH_DIR = REPO / ".bench"
MiB = 1 << 20
GiB = 1 << 30
WIDTH = 2048  # Linear(2048, 2048): 16 MiB of float32 weights per layer

SAVE_MAX_RATIO = 1.15
STALL_MAX_RATIO = 0.10
RESTORE_MAX_RATIO = 1.3


@dataclass
class Row:
    check: str
    candidate: str
    baseline: str
    ratio: float | None
    target: str
    passed: bool | None
    samples: dict[str, list[float]] = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        return {True: "PASS", False: "MISS", None: "info"}[self.passed]


def med(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def state_bytes(model: nn.Module, opt: torch.optim.Optimizer) -> int:
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    for st in opt.state.values():
        total += sum(v.numel() * v.element_size() for v in st.values() if torch.is_tensor(v))
    return total


def build(size_gib: float) -> tuple[nn.Module, torch.optim.Optimizer, torch.Tensor]:
    layer_bytes = WIDTH * WIDTH * 4
    layers = max(1, round(size_gib * GiB / 3 / layer_bytes))
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(WIDTH, WIDTH) for _ in range(layers)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = torch.randn(4, WIDTH)
    train_step(model, opt, batch)  # materialize the AdamW moments
    return model, opt, batch


def train_step(model: nn.Module, opt: torch.optim.Optimizer, batch: torch.Tensor) -> None:
    model(batch).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def baseline_save(state: dict[str, Any], path: Path) -> None:
    with path.open("wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    fsync_dir(path.parent)


CPU: dict[str, list[float]] = {}


def timed(fn: Callable[[], object], cpu_key: str | None = None) -> float:
    """Wall seconds of ``fn``; every dirty page is flushed first, so no measurement pays
    for another's writeback. With ``cpu_key``, the process CPU seconds (all threads) are
    kept too: on a shared machine they say what the work costs regardless of load."""
    gc.collect()
    os.sync()
    cpu = time.process_time()
    start = time.perf_counter()
    fn()
    wall = time.perf_counter() - start
    if cpu_key:
        CPU.setdefault(cpu_key, []).append(time.process_time() - cpu)
    return wall


def run(args: argparse.Namespace, rows: list[Row], context: dict[str, Any]) -> None:
    BENCH_DIR.mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="torch-state-", dir=BENCH_DIR))
    logging.getLogger("rtj_shim").setLevel(logging.WARNING)
    try:
        model, opt, batch = build(args.size_gib)
        nbytes = state_bytes(model, opt)
        context.update(
            {
                "state_bytes": nbytes,
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "dir": str(work),
                "loadavg_start": os.getloadavg(),
            }
        )
        print(f"state: {nbytes / GiB:.2f} GiB ({len(model)} x Linear({WIDTH}, {WIDTH}) + AdamW)")
        objects = {"model": model, "optimizer": opt}
        root = work / "root"
        ckpt = Checkpointer(root)
        base_file = work / "baseline.pt"
        step = 0

        # 1. blocking save vs torch.save + fsync
        cand, base = [], []
        for i in range(args.repeat):
            step += 1
            cand.append(timed(lambda s=step: ckpt.save(s, objects), "save"))
            base.append(
                timed(
                    lambda: baseline_save(
                        {"model": model.state_dict(), "optim": opt.state_dict()}, base_file
                    ),
                    "torch.save+fsync",
                )
            )
            print(f"  save {i + 1}: checkpointer {cand[-1]:.3f} s, baseline {base[-1]:.3f} s")
        ratio = med(cand) / med(base)
        rows.append(
            Row(
                "blocking save",
                f"Checkpointer.save {med(cand):.3f} s ({nbytes / GiB / med(cand):.2f} GiB/s)",
                f"torch.save+fsync {med(base):.3f} s",
                ratio,
                f"<= {SAVE_MAX_RATIO}x",
                ratio <= SAVE_MAX_RATIO,
                {"checkpointer": cand, "torch_save_fsync": base},
            )
        )
        blocking_median = med(cand)

        # 2. async stall: time in save() + fence wait at the next optimizer.step()
        plain, stalls, stepped = [], [], []
        for i in range(args.repeat):
            plain.append(timed(lambda: train_step(model, opt, batch)))
            step += 1
            gc.collect()
            os.sync()
            t0 = time.perf_counter()
            ckpt.save(step, objects, blocking=False)
            train_step(model, opt, batch)  # forward/backward overlap staging; step() fences
            stepped.append(time.perf_counter() - t0)
            ckpt.wait()
            report = ckpt.last_save
            assert report is not None and report.step == step
            stalls.append(report.stall_seconds)
            print(
                f"  async {i + 1}: stall {report.stall_seconds * 1e3:.1f} ms, "
                f"step with save in flight {stepped[-1]:.3f} s vs {plain[-1]:.3f} s, "
                f"published after {report.seconds:.3f} s"
            )
        ratio = med(stalls) / blocking_median
        rows.append(
            Row(
                "async save: training-thread stall",
                f"save(blocking=False) + fence {med(stalls) * 1e3:.1f} ms",
                f"blocking save {blocking_median:.3f} s",
                ratio,
                f"<= {STALL_MAX_RATIO}x",
                ratio <= STALL_MAX_RATIO,
                {"stall": stalls},
            )
        )
        rows.append(
            Row(
                "async save: step slowdown (2 shared cores)",
                f"train step with save in flight {med(stepped):.3f} s",
                f"train step alone {med(plain):.3f} s",
                med(stepped) / med(plain),
                "-",
                None,
                {"step_with_save": stepped, "step_alone": plain},
            )
        )

        # 3. restore (deep verification) vs torch.load
        cand, base, base_apply = [], [], []
        for i in range(args.repeat):
            fresh = Checkpointer(root, resume_file=work / "no-resume.json")
            cand.append(timed(lambda f=fresh: f.restore(objects), "restore"))
            base.append(timed(lambda: torch.load(base_file, weights_only=True), "torch.load"))

            def load_apply() -> None:
                state = torch.load(base_file, weights_only=True)
                model.load_state_dict(state["model"])
                opt.load_state_dict(state["optim"])

            base_apply.append(timed(load_apply))
            print(
                f"  restore {i + 1}: checkpointer {cand[-1]:.3f} s, torch.load {base[-1]:.3f} s,"
                f" torch.load+load_state_dict {base_apply[-1]:.3f} s"
            )
        ratio = med(cand) / med(base)
        rows.append(
            Row(
                "restore (deep verification)",
                f"Checkpointer.restore {med(cand):.3f} s",
                f"torch.load {med(base):.3f} s",
                ratio,
                f"<= {RESTORE_MAX_RATIO}x",
                ratio <= RESTORE_MAX_RATIO,
                {"checkpointer": cand, "torch_load": base},
            )
        )
        rows.append(
            Row(
                "restore vs load + apply",
                f"Checkpointer.restore {med(cand):.3f} s",
                f"torch.load+load_state_dict {med(base_apply):.3f} s",
                med(cand) / med(base_apply),
                "-",
                None,
                {"torch_load_apply": base_apply},
            )
        )
        ckpt.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def print_table(rows: list[Row]) -> None:
    print()
    print(f"{'check':<44} {'ratio':>7} {'target':>8}  result")
    for r in rows:
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}x"
        print(f"{r.check:<44} {ratio:>7} {r.target:>8}  {r.verdict}")
        print(f"    {r.candidate}  vs  {r.baseline}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gib", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    rows: list[Row] = []
    context: dict[str, Any] = {}
    try:
        run(args, rows, context)
    except KeyboardInterrupt:
        return 130
    except Exception:
        traceback.print_exc()
        print("torch_state bench: error (not a target miss)", file=sys.stderr)
        return 1
    print_table(rows)
    print(
        "CPU seconds (all threads), medians: "
        + ", ".join(f"{k} {med(v):.3f}" for k, v in CPU.items())
    )
    print(
        "load average: start "
        + " ".join(f"{x:.2f}" for x in context.get("loadavg_start", ()))
        + ", end "
        + " ".join(f"{x:.2f}" for x in os.getloadavg())
    )
    if args.json:
        body = {
            "context": context,
            "rows": [asdict(r) | {"result": r.verdict} for r in rows],
            "cpu_seconds": CPU,
        }
        args.json.write_text(json.dumps(body, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
