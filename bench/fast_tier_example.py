"""The fast tier in the example trainer itself: issue 16's target is a fast save's stall at
most 10% of one step of the example model, and that step is the example trainer's
(``examples/ddp_train.py`` as ``examples/resilient-training-job.yaml`` runs it: 2 ranks over
gloo, DDP, 2 micro-batches per step from its resumable sampler, AdamW and the LambdaLR, one
torch thread per rank), not the bare world-size-1 step of section 1.

Under torchrun on this machine, without the example job's ``--step-sleep`` (its stand-in
for a GPU's compute, which would make the step 50 ms longer), side by side and alternated:
the trainer without a fast tier, and with one every ``FAST_EVERY`` steps into tmpfs
(``RTJ_FAST_TIER_DIR``, as the operator sets it; no durable save in either run:
``--save-every`` past the end). From the ranks' own logs: the interval between consecutive
step lines (one step with its ``step_boundary``), the time each ``step_boundary`` took
(``ckpt_s``), and each fast save's stall as the checkpointer reported it (the trainer's
``{"event": "fast_save"}`` lines).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import REPO, med, p90
from bench.fast_tier_results import fmt_s

FAST_EVERY = 5  # the example scenario's fast interval (bench.fast_tier --fast-every)
RANKS = 2  # the example job's replicas (one process each)
WARM_STEPS = 20  # the first steps (imports, the first fast save's allocations) left out


@dataclass
class ExampleRun:
    fast: bool
    step_s: list[float] = field(default_factory=list)  # step line to step line, every rank
    boundary_saving_s: list[float] = field(default_factory=list)  # a step_boundary that saved
    boundary_idle_s: list[float] = field(default_factory=list)  # one that did not
    stalls: list[float] = field(default_factory=list)  # fast_save events: the stall
    written_s: list[float] = field(default_factory=list)  # fast_save events: until published
    skipped: int = 0  # fast steps due but not taken (the one before was still being written)


def read_rank_log(lines: Iterable[str], fast: bool, into: ExampleRun) -> None:
    """One rank's log into ``into``. A step line's ``ckpt_s`` is the ``step_boundary`` after
    the step before it; that boundary took a fast step when the trainer logged one for that
    step (a multiple of FAST_EVERY with none logged was due and skipped: not timed)."""
    records = [json.loads(line) for line in lines if line.strip()]
    saved = set()
    for r in records:
        if r.get("event") == "fast_save" and int(r["step"]) > WARM_STEPS:
            saved.add(int(r["step"]))
            into.stalls.append(float(r["stall"]))
            into.written_s.append(float(r["seconds"]))
    steps = [r for r in records if "loss" in r and "event" not in r]
    for before, line in itertools.pairwise(steps):
        if int(before["step"]) <= WARM_STEPS:
            continue
        into.step_s.append(float(line["time"]) - float(before["time"]))
        boundary = float(line["ckpt_s"])
        if int(before["step"]) in saved:
            into.boundary_saving_s.append(boundary)
        elif fast and int(before["step"]) % FAST_EVERY == 0:
            into.skipped += 1
        else:
            into.boundary_idle_s.append(boundary)


def run_trainer(work: Path, fast_dir: Path | None, steps: int) -> ExampleRun:
    """One torchrun of the example trainer; its ranks' logs read back."""
    logs = work / "logs"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO / "trainer-shim"), str(REPO), os.environ.get("PYTHONPATH", "")]
    )}  # fmt: skip
    for name in ("RTJ_FAST_TIER_DIR", "RTJ_FAST_EVERY_STEPS", "RTJ_FAST_KEEP"):
        env.pop(name, None)
    if fast_dir is not None:
        env.update(RTJ_FAST_TIER_DIR=str(fast_dir), RTJ_FAST_EVERY_STEPS=str(FAST_EVERY),
                   RTJ_FAST_KEEP="2")  # fmt: skip
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={RANKS}", str(REPO / "examples" / "ddp_train.py"),
        f"--root={work / 'durable'}", f"--log-dir={logs}", f"--steps={steps}",
        f"--save-every={steps * 10}",
    ]  # fmt: skip
    done = subprocess.run(cmd, env=env, cwd=work, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"the example trainer failed ({done.returncode}): {done.stderr[-2000:]}")
    run = ExampleRun(fast=fast_dir is not None)
    for rank in range(RANKS):
        read_rank_log((logs / f"rank-{rank}.jsonl").read_text().splitlines(), run.fast, run)
    return run


def measure_example(work_top: Path, fast_top: Path, steps: int, pairs: int) -> list[ExampleRun]:
    """``pairs`` runs without and with the fast tier, alternated (without first)."""
    runs: list[ExampleRun] = []
    for n in range(pairs):
        for fast in (False, True):
            work = work_top / f"example-{n}-{'fast' if fast else 'plain'}"
            fast_dir = fast_top / f"example-{n}" if fast else None
            work.mkdir(parents=True)
            try:
                runs.append(run_trainer(work, fast_dir, steps))
            finally:
                shutil.rmtree(work, ignore_errors=True)
                if fast_dir is not None:
                    shutil.rmtree(fast_dir, ignore_errors=True)
            last = runs[-1]
            print(f"  example trainer, {'fast tier' if fast else 'no fast tier'}: step "
                  f"{fmt_s(med(last.step_s))}"
                  + (f", stall {fmt_s(med(last.stalls))}" if fast else ""))  # fmt: skip
    return runs


def pooled(runs: Sequence[ExampleRun], fast: bool, attr: str) -> list[float]:
    return [x for r in runs if r.fast == fast for x in getattr(r, attr)]


def example_lines(runs: Sequence[dict[str, Any]] | Sequence[ExampleRun], steps: int) -> list[str]:
    """The report's section on the example trainer (runs as measured, or as JSON dicts)."""
    rs = [r if isinstance(r, ExampleRun) else ExampleRun(**r) for r in runs]
    if not rs:
        return []
    plain_step = med(pooled(rs, False, "step_s"))
    fast_step = med(pooled(rs, True, "step_s"))
    stalls = pooled(rs, True, "stalls")
    saving = med(pooled(rs, True, "boundary_saving_s"))
    idle = med(pooled(rs, True, "boundary_idle_s"))
    plain_idle = med(pooled(rs, False, "boundary_idle_s"))
    pairs = sum(1 for r in rs if r.fast)
    return [
        "## The example trainer's own step",
        "",
        "Issue 16's target is a fast save's stall at most 10% of one step of the example "
        "model, and that step is the example trainer's: `examples/ddp_train.py` as "
        "`examples/resilient-training-job.yaml` runs it (2 ranks over gloo, DDP, 2 "
        "micro-batches per step from its resumable sampler, AdamW and the LambdaLR, one torch "
        "thread per rank), here under torchrun on this machine without the job's "
        "`--step-sleep` (its stand-in for a GPU's compute, 50 ms a step). Side by side and "
        "alternated: the trainer without a fast tier, and with one every "
        f"{FAST_EVERY} steps into tmpfs (`RTJ_FAST_TIER_DIR`, as the operator sets it; no "
        "durable save in either run). From the ranks' own logs: the interval between "
        "consecutive step lines (a step with its `step_boundary`), each `step_boundary`'s "
        "time (`ckpt_s`), and each fast save's stall as the checkpointer reported it (the "
        'trainer\'s `{"event": "fast_save"}` lines).',
        "",
        f"{pairs} pair(s) of runs of {steps} steps, {RANKS} ranks, the first {WARM_STEPS} "
        f"steps of each left out; medians over every rank's steps (p90 beside).",
        "",
        f"| | without a fast tier | with one every {FAST_EVERY} steps |",
        "|---|---|---|",
        f"| one step (step line to step line) | {fmt_s(plain_step)} "
        f"(p90 {fmt_s(p90(pooled(rs, False, 'step_s')))}) | {fmt_s(fast_step)} "
        f"(p90 {fmt_s(p90(pooled(rs, True, 'step_s')))}) |",
        f"| a `step_boundary` that saves nothing | {fmt_s(plain_idle)} | {fmt_s(idle)} |",
        f"| a `step_boundary` that takes a fast step | - | {fmt_s(saving)} |",
        f"| **the fast save's stall** (`fast_tier.last.stall`) | - | **{fmt_s(med(stalls))}** "
        f"(p90 {fmt_s(p90(stalls))}), **{100 * med(stalls) / plain_step:.1f}% of one step** |",
        f"| the saving boundary less a non-saving one | - | {fmt_s(saving - idle)}, "
        f"{100 * (saving - idle) / plain_step:.1f}% of one step |",
        f"| the fast step written (until published, on its thread) | - | "
        f"{fmt_s(med(pooled(rs, True, 'written_s')))} |",
        f"| fast steps taken / due but skipped (the one before still being written) | - | "
        f"{len(stalls)} / {sum(r.skipped for r in rs if r.fast)} |",
        "",
        f"With a fast step every {FAST_EVERY} steps the median step was "
        f"{fast_step / plain_step:.3f}x the one without (runs alternated, so the machine's "
        "drift falls on both). The writer thread's Python holds the GIL the training thread "
        "needs and shares the two cores with the two ranks: section 1's 'whole cost' row "
        "measures that part on its own.",
        "",
    ]
