"""What the fast checkpoint tier (issue 16) costs and buys, against the durable saves and a
plain ``torch.save``, side by side on the same model, in one process (world size 1, CPU).

The model is the example trainer's own (``examples/ddp_train.py``: ``make_model(hidden)``,
an MLP with GELU, dropout and LayerNorm, AdamW, the warm-up + cosine ``LambdaLR``) at
several widths (``--hidden``; the default 64, 1000, 5000, 7070 is the example's own ~5k,
then ~1M, ~25M and ~50M parameters, so ~0.1 MB, ~12 MB, ~300 MB and ~600 MB of state with
AdamW's two moments). One
training step is forward + backward + ``optimizer.step()`` + ``scheduler.step()`` on a
fixed batch of 16 (the example's 8 x 2 accumulation). Not ~100M: with ``fast_keep=2`` the
tmpfs holds two copies of the state and three while a save runs (3.6 GB at 100M), beside
the trainer's own 1.6 GB and the async save's staging copy, over this machine's share.

1. Training-thread stall per save, every method in each round, the order rotated from round
   to round (one untimed warm-up round first), medians and p90 (nearest rank):
   a. fast tier: ``Checkpointer.step_boundary`` with ``fast_tier_dir`` on a tmpfs
      (``/dev/shm`` when writable) and ``fast_every_steps=2``, ``fast_keep=2``: the time
      of a ``step_boundary`` that saves, less that of the one before it, which did not;
   b. plain ``torch.save`` of the state dicts to a new file on local disk (what a user
      writes; no fsync), and the same with flush + fsync;
   c. the durable blocking ``Checkpointer.save`` to a filesystem root on the same disk;
   d. the durable ``save(blocking=False)``: the call plus the wait for staging at the next
      ``optimizer.step()`` (``SaveReport.stall_seconds``); also when it was published, and
      how much longer the steps trained meanwhile took than plain ones (the background
      save shares the two cores).
   Each against one plain training step of that model, and as a ratio to b.
2. Restore time (``Checkpointer.restore`` of the newest step, a fresh Checkpointer each
   time, as a restarted trainer): from the fast tier (a resume file with ``fast_step``, as
   the in-place supervisor writes it), from the durable filesystem store (a resume file
   with ``step``: deep verification in the trainer, page cache warm and evicted; and the
   step the init container verified, shallow in the trainer), and from S3 on the loopback
   moto server of ``e2e.s3server`` (``--no-s3`` skips it). From a buddy (the fast tier's
   peer replica): the same fast step, held in a holder pod's replica, copied back over
   loopback HTTP into an empty fast tier by ``peer_pull.fetch_back`` (as a replaced pod's
   sidecar does), then restored from there as from the fast tier: the copy-back alone and
   with the restore; and the holder's replication copy of one step
   (``ReplicaPuller.pull_once``), each in the same rotation (``--no-buddy`` skips them).
3. Lost steps per failure: arithmetic from the measured stalls (see
   ``bench.fast_tier_lost.lost_rows``).

Durable steps go under ``<repo>/.bench/`` (git-ignored), the fast tier under ``/dev/shm``;
both are removed afterwards. Figures only, no targets: nothing here fails on a number.

This module runs them and writes the report; section 1 is bench.fast_tier_stalls, 2
bench.fast_tier_restores (the buddy's pods and copies: bench.fast_tier_buddy), 3
bench.fast_tier_lost, the report bench.fast_tier_report, what they record
bench.fast_tier_results, the model bench.torch_models.

    python -m bench.fast_tier [--hidden 1000,5000,7070] [--rounds 8] [--restore-reps 3]
        [--no-s3] [--no-buddy] [--quick] [--json FILE] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from bench.common import BENCH_DIR, mount_of
from bench.fast_tier_example import measure_example
from bench.fast_tier_report import markdown, print_summary
from bench.fast_tier_restores import measure_restores, s3_server
from bench.fast_tier_results import SizeResult, fmt_bytes
from bench.fast_tier_stalls import measure_stalls
from bench.torch_models import example_model, example_trainer

SHM = Path("/dev/shm")  # the tmpfs the fast tier is meant for
DEFAULT_HIDDEN = (64, 1000, 5000, 7070)  # 64: the example trainer's default
QUICK_HIDDEN = (64, 256)


def fast_dir_for(requested: Path | None) -> Path:
    base = requested
    if base is None:
        base = SHM if SHM.is_dir() and os.access(SHM, os.W_OK) else Path(tempfile.gettempdir())
    return Path(tempfile.mkdtemp(prefix="rtj-bench-fast-tier-", dir=base))


def run(args: argparse.Namespace, context: dict[str, Any]) -> list[SizeResult]:
    logging.getLogger("rtj_shim").setLevel(logging.WARNING)
    example_trainer()
    gc.collect()
    gc.freeze()  # what the imports made: every quiesce() would walk it again (~0.2 s)
    base = args.work_dir or BENCH_DIR
    base.mkdir(parents=True, exist_ok=True)
    work_top = Path(tempfile.mkdtemp(prefix="fast-tier-", dir=base))
    fast_top = fast_dir_for(args.fast_dir)
    context.update(
        {
            "cpus": os.cpu_count(),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "fast_dir": str(fast_top.parent),
            "fast_fs": mount_of(fast_top)["fstype"],
            "durable_dir": str(work_top.parent),
            "durable_fs": mount_of(work_top)["fstype"],
            "rounds": args.rounds,
            "restore_reps": args.restore_reps,
            "budget": args.budget,
            "save_every": args.save_every,
            "fast_every": args.fast_every,
        }
    )
    results: list[SizeResult] = []
    server: contextlib.AbstractContextManager[tuple[str, Any]] | None = None
    stack = contextlib.ExitStack()
    try:
        bucket = None
        if args.s3:
            server = s3_server(work_top)
            bucket, _ = stack.enter_context(server)
            context["s3"] = "moto (e2e.s3server), auth enforced, loopback on this machine"
        if args.buddy:
            context["buddy"] = (
                "two progress sidecars (`rtj-shim progress-server`, each its own process) on "
                "127.0.0.1, the copies in this process"
            )
        for hidden in args.hidden:
            tr = example_model(hidden)
            result = SizeResult(hidden, tr.params, tr.state_bytes())
            load_before = os.getloadavg()[0]
            print(f"\n{result.label}: {fmt_bytes(result.state_bytes)} of state")
            work = work_top / f"h{hidden}"
            fast_root = fast_top / f"h{hidden}"
            work.mkdir()
            try:
                newest = measure_stalls(tr, result, work, fast_root, args.rounds)
                gc.collect()
                s3_root = None if bucket is None else f"s3://{bucket}/h{hidden}"
                measure_restores(tr, result, work, fast_root, newest, args.restore_reps, s3_root,
                                 args.buddy)  # fmt: skip
            finally:
                shutil.rmtree(work, ignore_errors=True)
                shutil.rmtree(fast_root, ignore_errors=True)
            result.load = (load_before, os.getloadavg()[0])
            results.append(result)
            del tr
            gc.collect()
        if args.example_steps > 0:
            print(f"\nthe example trainer ({args.example_pairs} pair(s) of runs)")
            runs = measure_example(work_top, fast_top, args.example_steps, args.example_pairs)
            context["example"] = {"steps": args.example_steps, "runs": [asdict(r) for r in runs]}
    finally:
        stack.close()
        shutil.rmtree(work_top, ignore_errors=True)
        shutil.rmtree(fast_top, ignore_errors=True)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--hidden", default=",".join(map(str, DEFAULT_HIDDEN)),
                        help="comma-separated MLP widths")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--restore-reps", type=int, default=3)
    parser.add_argument("--budget", type=float, default=0.01,
                        help="stall budget per tier for the practical intervals")  # fmt: skip
    parser.add_argument("--save-every", type=int, default=50,
                        help="the example trainer's durable interval")  # fmt: skip
    parser.add_argument("--fast-every", type=int, default=5,
                        help="the fast interval beside it, in the example scenario")  # fmt: skip
    parser.add_argument("--example-steps", type=int, default=600,
                        help="steps of each example-trainer run (0: not run)")  # fmt: skip
    parser.add_argument("--example-pairs", type=int, default=2,
                        help="example-trainer runs without and with the fast tier")  # fmt: skip
    parser.add_argument("--no-s3", dest="s3", action="store_false")
    parser.add_argument("--no-buddy", dest="buddy", action="store_false",
                        help="no restore from a buddy (the peer replica's sidecars)")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="tiny models, 2 rounds, no S3")
    parser.add_argument("--work-dir", type=Path, help="durable store's parent (.bench/)")
    parser.add_argument("--fast-dir", type=Path, help="fast tier's parent (/dev/shm)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path, help="also write the Markdown report")
    args = parser.parse_args(argv)
    args.hidden = [int(h) for h in str(args.hidden).split(",") if h]
    if args.quick:
        args.hidden, args.rounds, args.restore_reps, args.s3 = list(QUICK_HIDDEN), 2, 1, False
        args.example_steps, args.example_pairs = min(args.example_steps, 40), 1
    context: dict[str, Any] = {
        "loadavg_start": os.getloadavg(),
        "started": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
    }
    try:
        results = run(args, context)
    except KeyboardInterrupt:
        return 130
    except Exception:
        traceback.print_exc()
        print("fast_tier bench: error", file=sys.stderr)
        return 1
    context["loadavg_end"] = os.getloadavg()
    context["ended"] = time.strftime("%H:%M", time.gmtime())
    print_summary(results)
    print(
        "load average: start "
        + " ".join(f"{x:.2f}" for x in context["loadavg_start"])
        + ", end "
        + " ".join(f"{x:.2f}" for x in context["loadavg_end"])
    )
    if args.json:
        body = {"context": context, "results": [asdict(r) for r in results]}
        args.json.write_text(json.dumps(body, indent=2) + "\n")
    if args.markdown:
        args.markdown.write_text(markdown(results, context))
    return 0


if __name__ == "__main__":
    sys.exit(main())
