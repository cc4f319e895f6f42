"""What a background durable save costs the steps it overlaps, with and without
``spec.checkpoint.maxWriteBytesPerSecond`` (issue 43, section 4.3 of the requirements).

One process steps on the CPU (one torch thread doing ``--step-ms`` of matrix products, as a
GPU job's Python thread that launches kernels and feeds the data loader) beside
``--state-mib`` of model state, and at step ``--save-at`` starts a background save
(``Checkpointer.save(blocking=False)``) of that state to a ``file://`` root on this
machine's disk. Three runs side by side: no save (the baseline), the save unpaced, and the
save paced to ``--limit-mib`` MiB/s. Reported per run: the median step time over the steps
the save overlapped (the baseline: the same steps), its ratio to the baseline, and how long
the save took to publish. A model of the contention, not of a cluster: the writer's hashing
and copying compete with training for this machine's cores and disk, as on a node they
compete with the all-reduce and the data loader for the NIC.

    python -m bench.write_limit [--state-mib 256] [--limit-mib 64] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MiB = 1 << 20


@dataclass(frozen=True)
class Run:
    name: str
    step_ms: float
    """Median step time over the steps the save overlapped (the baseline: the same steps)."""
    save_s: float | None
    overlapped: int


def _state(state_mib: int) -> Any:
    from torch import nn

    width = 1024
    layers = max(1, state_mib * MiB // (width * width * 4))
    return nn.Sequential(*(nn.Linear(width, width, bias=False) for _ in range(layers)))


def _step_size(step_ms: float) -> int:
    """A square matrix product of about `step_ms` on one torch thread here."""
    import torch

    torch.set_num_threads(1)  # as the runs step
    n = 256
    while n < 4096:
        a = torch.randn(n, n)
        started = time.perf_counter()
        a @ a
        if (time.perf_counter() - started) * 1e3 >= step_ms:
            return n
        n = int(n * 1.25)
    return n


def run(name: str, args: argparse.Namespace, limit_mib: int | None, save: bool) -> Run:
    import torch

    from rtj_shim.torch import Checkpointer, IoOptions

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = _state(args.state_mib)
    a = torch.randn(args.size, args.size)
    limit = limit_mib * MiB if limit_mib is not None else None
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Checkpointer(Path(tmp, "root"), io=IoOptions(max_write_bytes_per_second=limit))
        times: list[float] = []
        started_save = done_at = None
        after = 0
        for step in range(1, args.steps + 1):
            t0 = time.perf_counter()
            a = torch.tanh(a @ a)  # the step's work
            if save and step == args.save_at:
                started_save = time.perf_counter()
                ckpt.save(step, {"model": model}, blocking=False)
            took = time.perf_counter() - t0
            if step > args.save_at and (not save or done_at is None):
                times.append(took)
            if save and done_at is None and ckpt.last_save is not None:
                done_at = time.perf_counter()
            after += done_at is not None
            if (save and after > 3) or (not save and len(times) >= args.baseline_steps):
                break
        ckpt.wait()
        if save and done_at is None:
            done_at = time.perf_counter()
        ckpt.close()
    save_s = done_at - started_save if started_save is not None and done_at else None
    return Run(name, statistics.median(times) * 1e3 if times else 0.0, save_s, len(times))


def _median(runs: tuple[Run, ...]) -> Run:
    """One run's figures over the rounds: the median of each."""
    saves = [r.save_s for r in runs if r.save_s is not None]
    return Run(runs[0].name, statistics.median(r.step_ms for r in runs),
               statistics.median(saves) if saves else None,
               int(statistics.median(r.overlapped for r in runs)))  # fmt: skip


def report(runs: list[Run], args: argparse.Namespace) -> str:
    base = runs[0].step_ms
    lines = [
        "# A background save's cost to the steps it overlaps, paced and not",
        "",
        f"`python -m bench.write_limit --state-mib {args.state_mib} --limit-mib "
        f"{args.limit_mib}`: {args.state_mib} MiB of model state, steps of {args.step_ms:.0f} ms "
        f"of matrix products on one torch thread, a background save at step {args.save_at} to this "
        "machine's disk (`file://`). Median step time over the steps the save overlapped; the "
        "baseline's over as many steps with no save. Medians over "
        f"{args.repeat} interleaved rounds.",
        "",
        "| run | median step | vs no save | save published after | steps overlapped |",
        "|---|---|---|---|---|",
    ]
    for r in runs:
        save = f"{r.save_s:.2f} s" if r.save_s is not None else "-"
        ratio = r.step_ms / base if base else float("nan")
        lines.append(f"| {r.name} | {r.step_ms:.1f} ms | {ratio:.2f}x | {save} | {r.overlapped} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--state-mib", type=int, default=256)
    p.add_argument("--limit-mib", type=int, default=64)
    p.add_argument("--step-ms", type=float, default=50.0)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--save-at", type=int, default=10)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--markdown", type=Path)
    args = p.parse_args(argv)
    args.size = _step_size(args.step_ms)
    rounds: list[list[Run]] = []
    for _ in range(args.repeat):  # interleaved: a load that comes and goes hits every run
        unpaced = run("save, no limit", args, None, save=True)
        paced = run(f"save, {args.limit_mib} MiB/s", args, args.limit_mib, save=True)
        args.baseline_steps = max(unpaced.overlapped, paced.overlapped, 5)
        rounds.append([run("no save", args, None, save=False), unpaced, paced])
    text = report([_median(column) for column in zip(*rounds, strict=True)], args)
    print(text)
    if args.markdown is not None:
        args.markdown.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
