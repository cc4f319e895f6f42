"""bench.fast_tier, section 1: the training thread's stall per save, every method in each
round (the fast tier, plain ``torch.save`` with and without fsync, the durable blocking and
background saves), the order rotated."""

from __future__ import annotations

import os
import time
from functools import partial
from pathlib import Path

import torch

from bench.common import quiesce, timed
from bench.fast_tier_results import FAST_EVERY, FAST_KEEP, METHODS, SizeResult, fmt_s
from bench.torch_models import Trainer
from rtj_shim.fast.fast_tier import FastTierConfig, holdings
from rtj_shim.torch import Checkpointer, SaveReport
from rtj_shim.torch.options import ResumeOptions

MAX_OVERLAP = 64  # steps trained at most while one background save is in flight


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def published(ckpt: Checkpointer, step: int) -> bool:
    report = ckpt.last_save
    return report is not None and report.step == step


def save_baseline(tr: Trainer, path: Path, fsync: bool) -> None:
    """What a user writes: ``torch.save`` of the state dicts to a new file."""
    with path.open("wb") as fh:
        torch.save(tr.state_dict(), fh)
        if fsync:
            fh.flush()
            os.fsync(fh.fileno())


def measure_stalls(
    tr: Trainer, result: SizeResult, work: Path, fast_root: Path, rounds: int
) -> SaveReport:
    """Rounds of every method, rotated; round 0 is an untimed warm-up. Returns the report of
    the newest durable step (the Checkpointers go, and the async save's staging buffers
    with them, before the restores)."""
    no_resume = work / "no-resume.json"
    durable = Checkpointer(
        work / "durable",
        keep_last=FAST_KEEP,
        resume=ResumeOptions(resume_file=no_resume, report=False),
    )
    fast = Checkpointer(
        work / "fast-only-root",
        resume=ResumeOptions(resume_file=no_resume, report=False),
        fast_tier=FastTierConfig(fast_root, every_steps=FAST_EVERY, keep=FAST_KEEP),
    )
    result.stalls = {m: [] for m in METHODS}
    fast_step = 0  # fast's step_boundary counter: odd ones do not save, even ones do
    durable_step = 0
    base_files: list[Path] = []

    def train() -> float:
        return timed(tr.step)

    for rnd in range(rounds + 1):
        keep = rnd > 0
        order = METHODS[rnd % len(METHODS) :] + METHODS[: rnd % len(METHODS)]
        for method in order:
            plain = train()
            if keep:
                result.step_s.append(plain)
            if method == "fast":
                fast_step += 1
                assert fast_step % FAST_EVERY != 0
                idle = timed(partial(fast.step_boundary, fast_step, tr.objects))
                train()
                fast_step += 1
                saving = timed(partial(fast.step_boundary, fast_step, tr.objects))
                tier = fast.fast_tier
                assert tier is not None
                after = [train()]  # its optimizer.step() passes the fence (waits if not staged)
                while tier.busy and len(after) < MAX_OVERLAP:  # train while it is written
                    after.append(train())
                tier.wait()
                fast_report = tier.last
                assert fast_report is not None and fast_report.step == fast_step
                if keep:  # the capture and copies on the training thread, plus the fence
                    result.boundary_idle_s.append(idle)
                    result.stalls["fast"].append(fast_report.stall)
                    result.fast_written_s.append(fast_report.seconds)
                    result.fast_cost.append((saving - idle, sum(after), len(after)))
            elif method in ("torch.save", "torch.save+fsync"):
                path = work / f"baseline-{len(base_files)}.pt"
                base_files.append(path)
                fsync = method == "torch.save+fsync"
                took = timed(partial(save_baseline, tr, path, fsync))
                while len(base_files) > FAST_KEEP:  # untimed: a user's own cleanup
                    base_files.pop(0).unlink()
                if keep:
                    result.stalls[method].append(took)
            elif method == "durable":
                durable_step += 1
                took = timed(partial(durable.save, durable_step, tr.objects))
                if keep:
                    result.stalls["durable"].append(took)
            else:
                durable_step += 1
                quiesce(collect=True)
                start = time.perf_counter()
                durable.save(durable_step, tr.objects, blocking=False)
                overlapped = 0  # training goes on until the save is published
                while overlapped < MAX_OVERLAP and not published(durable, durable_step):
                    tr.step()  # the first one's optimizer.step() waits for the staging
                    overlapped += 1
                took = time.perf_counter() - start
                durable.wait()
                report = durable.last_save
                assert report is not None and report.step == durable_step
                if keep:
                    result.stalls["durable async"].append(report.stall_seconds)
                    result.async_published_s.append(report.seconds)
                    result.async_overlap.append((overlapped, took - report.stall_seconds))
        print(
            f"  round {rnd}{' (warm-up)' if not keep else ''}: "
            + ", ".join(
                f"{m} {fmt_s(result.stalls[m][-1])}" for m in METHODS if keep and result.stalls[m]
            )
            + f"; step {fmt_s(result.step_s[-1]) if keep else '-'}; load {os.getloadavg()[0]:.2f}"
        )
    for path in base_files:
        path.unlink(missing_ok=True)
    if fast.fast_tier is not None:
        fast.fast_tier.wait()
    held = holdings(fast_root)
    result.fast_held_steps = held
    result.fast_held_bytes = tree_bytes(fast_root)
    result.fast_step_bytes = result.fast_held_bytes // max(1, len(held))
    newest = durable.last_save
    assert newest is not None
    result.durable_step_bytes = newest.bytes
    durable.close()
    fast.close()
    return newest
