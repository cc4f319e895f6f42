"""What rtj_shim.torch costs, against plain torch.save / torch.load of the same state.

One process, one ~1 GiB training state (a stack of Linear layers and its AdamW moments:
parameters 1/3, exp_avg 1/3, exp_avg_sq 1/3), in ``<repo>/.bench/`` (git-ignored, removed
afterwards). Every pair runs side by side, alternating, ``--repeat`` times; medians count.

1. blocking save: ``Checkpointer.save(step, objects)`` (stream into the store, sha256 while
   writing, fsync, manifest, COMMITTED, rename; RNG and metadata included) against
   ``torch.save({"model": ..., "optim": ...}, f)`` + flush + fsync of the same state;
   target <= 1.15x. Also the CPU both cost (all threads of this process), per saved GiB:
   the save against ``torch.save`` + fsync plus one SHA-256 pass over the file it wrote
   (what hashing the checkpoint cannot avoid); target <= 2x.
2. training-thread stall of ``save(blocking=False)``: time inside the call plus the time
   the next ``optimizer.step()`` waits for staging, measured around a real forward/backward
   of the model; against the blocking save's duration; target <= 0.1x. Also reported:
   how much longer that training step took than the same step without a save in flight
   (CPU contention on this small machine; the background save shares its two cores).
3. restore: ``Checkpointer.restore(objects)`` (deep verification of every file's sha256,
   load, apply to the model and optimizer) against ``torch.load`` of the baseline file
   (and, for information, ``torch.load`` + ``load_state_dict``); target <= 1.3x. Twice:
   warm (the files in the page cache, as right after the save) and cold (their pages
   evicted first with ``posix_fadvise(DONTNEED)``, as for the first restore after a
   restart; nothing else on the machine is evicted). Warm, the deep verification alone
   (one SHA-256 pass, ~0.55 CPU-s per GiB, on 2 threads) is more than 1.3x of a
   ``torch.load`` that copies from the page cache at memory speed. Also the restore a
   restarted pod performs: its resume init container deep-verified the pinned step
   (``resume.json`` says ``"verification": "deep"``), so the trainer checks the manifest,
   COMMITTED and sizes and does not hash the step a second time.

Both sides write into fresh files: before every timed save the previous step (or baseline
file) is deleted, untimed, and, as in ``bench.checkpoint_protocol``, the free memory the
run will fill is touched first (on a VM that hands freed memory back to its host, page
cache in never-touched memory costs host page faults: ~2 s of system time per GiB here,
which the old method charged to the Checkpointer alone, because its baseline overwrote
one file and so reused the pages it had just freed).

Each line prints absolute numbers, the ratio, the target and PASS/MISS; a miss never fails
the run, only an error exits non-zero.

    python -m bench.torch_state [--size-gib 1.0] [--repeat 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from bench.common import (
    BENCH_DIR,
    GiB,
    MiB,
    evict,
    fsync_path,
    med,
    quiesce,
    sha256_file,
)
from bench.torch_models import WIDTH, linear_stack, state_bytes, train_step
from rtj_shim.checkpoint.layout import StepDirName
from rtj_shim.checkpoint.resolver import resolve
from rtj_shim.checkpoint.storage import open_store
from rtj_shim.torch import Checkpointer
from rtj_shim.torch.options import ResumeOptions

SAVE_MAX_RATIO = 1.15
CPU_MAX_RATIO = 2.0
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
    load: float = field(default_factory=lambda: os.getloadavg()[0])  # 1-min, when measured

    @property
    def verdict(self) -> str:
        return {True: "PASS", False: "MISS", None: "info"}[self.passed]


def baseline_save(state: dict[str, Any], path: Path) -> None:
    with path.open("wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    fsync_path(path.parent, directory=True)


CPU: dict[str, list[float]] = {}


def timed(fn: Callable[[], object], cpu_key: str | None = None, prefault_bytes: int = 0) -> float:
    """Wall seconds of ``fn``; every dirty page is flushed first, so no measurement pays
    for another's writeback. With ``cpu_key``, the process CPU seconds (all threads) are
    kept too: on a shared machine they say what the work costs regardless of load."""
    quiesce(prefault_bytes, collect=True)
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
        model, opt, batch = linear_stack(args.size_gib)
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

        # 1. blocking save vs torch.save + fsync, each into fresh files
        fill = nbytes + nbytes // 4 + 256 * MiB  # what a run's page cache may take

        def fresh_step(step: int) -> int:
            if step > 0:
                ckpt.store.delete_step_dir(StepDirName(step))
            return step + 1

        def fresh_file(i: int) -> Path:
            for old in work.glob("baseline-*.pt"):
                old.unlink()
            return work / f"baseline-{i}.pt"

        def save(step: int) -> None:
            ckpt.save(step, objects)

        def torch_save(path: Path) -> None:
            baseline_save({"model": model.state_dict(), "optim": opt.state_dict()}, path)

        cand, base, hashed = [], [], []
        for i in range(args.repeat):
            for which in ("save", "base") if i % 2 == 0 else ("base", "save"):
                if which == "save":
                    step = fresh_step(step)
                    cand.append(timed(partial(save, step), "save", fill))
                else:
                    base_file = fresh_file(i)
                    base.append(timed(partial(torch_save, base_file), "torch.save+fsync", fill))
            hashed.append(timed(partial(sha256_file, base_file, 8 * MiB), "sha256 pass"))
            print(
                f"  save {i + 1}: checkpointer {cand[-1]:.3f} s (cpu {CPU['save'][-1]:.2f} s), "
                f"baseline {base[-1]:.3f} s (cpu {CPU['torch.save+fsync'][-1]:.2f} s), "
                f"sha256 pass cpu {CPU['sha256 pass'][-1]:.2f} s; load {os.getloadavg()[0]:.2f}"
            )
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
        gib = nbytes / GiB
        save_cpu = med(CPU["save"]) / gib
        floor_cpu = (med(CPU["torch.save+fsync"]) + med(CPU["sha256 pass"])) / gib
        rows.append(
            Row(
                "save CPU per GiB",
                f"Checkpointer.save {save_cpu:.2f} cpu-s/GiB",
                f"torch.save+fsync + sha256 pass {floor_cpu:.2f} cpu-s/GiB",
                save_cpu / floor_cpu,
                f"<= {CPU_MAX_RATIO}x",
                save_cpu / floor_cpu <= CPU_MAX_RATIO,
                {k: CPU[k] for k in ("save", "torch.save+fsync", "sha256 pass")},
            )
        )
        blocking_median = med(cand)

        # 2. async stall: time in save() + fence wait at the next optimizer.step()
        plain, stalls, stepped = [], [], []
        for i in range(args.repeat):
            plain.append(timed(lambda: train_step(model, opt, batch)))
            step = fresh_step(step)
            quiesce(fill, collect=True)
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

        # 3. restore (deep verification) vs torch.load: warm (files in the page cache, as
        # right after the save) and cold (their pages evicted first, as after a restart)
        def load() -> None:
            torch.load(base_file, weights_only=True)

        def load_apply() -> None:
            state = torch.load(base_file, weights_only=True)
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optim"])

        def restore() -> None:
            Checkpointer(root, resume=ResumeOptions(resume_file=work / "no-resume.json")).restore(
                objects
            )

        # a restarted pod: its resume init container deep-verified the step it pins
        newest = resolve(open_store(str(root)))
        pin = work / "resume.json"
        pin.write_text(json.dumps({**newest.to_json(), "verification": "deep"}))

        def restore_pinned() -> None:
            Checkpointer(root, resume=ResumeOptions(resume_file=pin)).restore(objects)

        for cache in ("warm", "cold"):
            runs: dict[str, list[float]] = {
                "restore": [], "pinned": [], "load": [], "load_apply": []
            }  # fmt: skip
            fns = {"restore": restore, "pinned": restore_pinned, "load": load,
                   "load_apply": load_apply}  # fmt: skip
            for i in range(args.repeat):
                order = ("restore", "pinned", "load", "load_apply")
                for name in order if i % 2 == 0 else order[::-1]:
                    if cache == "cold":
                        evict([root, base_file])
                    key = f"{name} ({cache})" if name != "load_apply" else None
                    runs[name].append(timed(fns[name], key, fill))
                print(
                    f"  restore {i + 1} ({cache}): checkpointer {runs['restore'][-1]:.3f} s, "
                    f"torch.load {runs['load'][-1]:.3f} s, torch.load+load_state_dict "
                    f"{runs['load_apply'][-1]:.3f} s; load {os.getloadavg()[0]:.2f}"
                )
            cand_s, base_s = med(runs["restore"]), med(runs["load"])
            rows.append(
                Row(
                    f"restore, {cache} (deep verification)",
                    f"Checkpointer.restore {cand_s:.3f} s",
                    f"torch.load {base_s:.3f} s",
                    cand_s / base_s,
                    f"<= {RESTORE_MAX_RATIO}x",
                    cand_s / base_s <= RESTORE_MAX_RATIO,
                    {"checkpointer": runs["restore"], "torch_load": runs["load"]},
                )
            )
            pinned_s = med(runs["pinned"])
            rows.append(
                Row(
                    f"restore, {cache}, in a restarted pod (its init container verified)",
                    f"Checkpointer.restore {pinned_s:.3f} s",
                    f"torch.load {base_s:.3f} s",
                    pinned_s / base_s,
                    f"<= {RESTORE_MAX_RATIO}x",
                    pinned_s / base_s <= RESTORE_MAX_RATIO,
                    {"checkpointer_pinned": runs["pinned"]},
                )
            )
            apply_s = med(runs["load_apply"])
            rows.append(
                Row(
                    f"restore, {cache}, vs load + apply",
                    f"Checkpointer.restore {cand_s:.3f} s",
                    f"torch.load+load_state_dict {apply_s:.3f} s",
                    cand_s / apply_s,
                    "-",
                    None,
                    {"torch_load_apply": runs["load_apply"]},
                )
            )
        ckpt.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def print_table(rows: list[Row]) -> None:
    print()
    print(f"{'check':<44} {'ratio':>7} {'target':>8}  result  load")
    for r in rows:
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}x"
        print(f"{r.check:<44} {ratio:>7} {r.target:>8}  {r.verdict:<6}  {r.load:.2f}")
        print(f"    {r.candidate}  vs  {r.baseline}")


def markdown(rows: list[Row], context: dict[str, Any]) -> str:
    loads = context.get("loadavg_start", ()), context.get("loadavg_end", ())
    start, end = (" ".join(f"{x:.2f}" for x in values) for values in loads)
    out = [
        "# torch state benchmark",
        "",
        f"`python -m bench.torch_state`: {context['state_bytes'] / GiB:.2f} GiB of state, "
        f"torch {context['torch']}, {context['cpus']} CPUs, Python {context['python']}. "
        f"Load average at start {start}, at end {end}.",
        "",
        "| check | candidate | baseline | ratio | target | result | load |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}x"
        out.append(
            f"| {r.check} | {r.candidate} | {r.baseline} | {ratio} | {r.target} | "
            f"{r.verdict} | {r.load:.2f} |"
        )
    out += ["", "CPU seconds (all threads), medians: " + cpu_text() + "."]
    return "\n".join(out) + "\n"


def cpu_text() -> str:
    return ", ".join(f"{k} {med(v):.3f}" for k, v in CPU.items())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gib", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path, help="also write a Markdown table")
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
    context["loadavg_end"] = os.getloadavg()
    print_table(rows)
    print("CPU seconds (all threads), medians: " + cpu_text())
    print(
        "load average: start "
        + " ".join(f"{x:.2f}" for x in context.get("loadavg_start", ()))
        + ", end "
        + " ".join(f"{x:.2f}" for x in context["loadavg_end"])
    )
    if args.json:
        body = {
            "context": context,
            "rows": [asdict(r) | {"result": r.verdict} for r in rows],
            "cpu_seconds": CPU,
        }
        args.json.write_text(json.dumps(body, indent=2) + "\n")
    if args.markdown:
        args.markdown.write_text(markdown(rows, context))
    return 0


if __name__ == "__main__":
    sys.exit(main())
