"""A small data-parallel training job that resumes exactly where it stopped.

An MLP with dropout and LayerNorm learns a deterministic synthetic regression task,
shuffled by ``ResumableSampler``, with AdamW, a warm-up + cosine learning-rate schedule and
gradient accumulation. Every rank appends one JSON line per step to
``<log-dir>/rank-<r>.jsonl``: ``{step, loss, lr, samples, seen, restart, generation, time}``,
with floats that round-trip exactly, so two runs can be compared bit for bit (``seen``: a
plain ``int`` kept in the checkpoint as it is; ``restart``: torchrun's restart count;
``generation``: the in-place supervisor's ``RTJ_RESTART_GENERATION``, 0 when unset).

    torchrun --nproc-per-node 2 examples/ddp_train.py --root /tmp/ckpt --log-dir /tmp/logs
    python examples/ddp_train.py --root /tmp/ckpt --log-dir /tmp/logs        # one process

Each step reports its sections to ``rtj_shim.progress`` (``data``, ``forward``,
``backward``, ``optimizer``, and ``barrier`` where a rank waits for the others): the
operator's progress poller reads them to tell a hung rank (and which section it is stuck
in) or a straggler from the ranks waiting for it. Without ``RTJ_PROGRESS_DIR`` every call is
a no-op. ``--straggle-rank R --straggle-seconds S`` makes rank R slow (S extra seconds in
``data`` every step), for the straggler drill.

``--fsdp`` shards the model with FSDP2 (``fully_shard``) instead of DDP. The ``--fault-*``
options exist for the drill (``drills/torch_drill.py``): they kill a rank at a step, or
inside the shard writes of a save.

``--plain-checkpoints DIR`` replaces the shim with what a careful user writes without it
(``plain_checkpoints.py``, the goodput soak's JobSet baseline): rank 0 saves the whole
training state with plain ``torch.save`` to ``DIR/step-N.pt`` every ``--save-every`` steps
(a temporary name, then a rename), every rank resumes from the highest-numbered file
present, nothing is verified, and the process group is torch's default
(``dist.init_process_group("gloo")``, its default timeout: 30 minutes).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

from rtj_shim import progress
from rtj_shim.checkpoint.storage import open_store
from rtj_shim.torch import (
    AnomalyGuard,
    Checkpointer,
    ResumableSampler,
    SaveReport,
    init_process_group,
)
from rtj_shim.torch.options import EmergencyOptions, IntegrityOptions, IoOptions, ResumeOptions

# the drills' faults live beside this script (run as a script, or loaded from its file)
sys.path.insert(0, str(Path(__file__).resolve().parent))
from plain_checkpoints import PlainCheckpoints
from train_faults import KillInSaveStore, flip_a_bit, scale_gradients, shift_labels

DIM = 16


class Synthetic(Dataset[tuple[int, torch.Tensor, torch.Tensor]]):
    """``n`` samples fixed by ``seed``: a noisy non-linear function of a random input."""

    def __init__(self, n: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, DIM, generator=gen)
        w = torch.randn(DIM, 1, generator=gen)
        self.y = torch.tanh(self.x @ w) + 0.1 * torch.randn(n, 1, generator=gen)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        return i, self.x[i], self.y[i]


def make_model(hidden: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(DIM, hidden),
        nn.GELU(),
        nn.Dropout(0.1),
        nn.LayerNorm(hidden),
        nn.Linear(hidden, hidden),
        nn.GELU(),
        nn.Dropout(0.1),
        nn.Linear(hidden, 1),
    )


def lr_lambda(total: int, warmup: int) -> Any:
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return f


# ---------------------------------------------------------------- training


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", help="checkpoint root (path, file:// or s3://)")
    p.add_argument("--plain-checkpoints", type=Path, help="plain torch.save files here instead")
    p.add_argument("--nvrx-heartbeats", action="store_true",
                   help="with --plain-checkpoints: NVRx's rank heartbeat every step (under "
                   "its ft_launcher)")  # fmt: skip
    p.add_argument("--log-dir", required=True, type=Path)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--save-every", type=int, default=50, help="0: no step-count saves")
    p.add_argument(
        "--save-seconds",
        default=None,
        help="also save every this many seconds; auto: as the operator orders",
    )
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--batch", type=int, default=8, help="micro-batch per rank")
    p.add_argument("--accum", type=int, default=2, help="micro-batches per optimizer step")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--fsdp", action="store_true", help="FSDP2 fully_shard instead of DDP")
    p.add_argument("--async-save", action="store_true")
    p.add_argument("--probe", action="store_true", help="validate restores with a probe")
    p.add_argument("--shard-kib", type=int, help="target size of replicated-state shards")
    p.add_argument("--emergency-deadline", type=float, default=None,
                   help="SIGTERM deadline of the emergency save (default: the operator's "
                   "RTJ_EMERGENCY_SAVE_SECONDS, else 30 s)")  # fmt: skip
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds per step (tests)")
    p.add_argument("--hang-at-step", type=int, help="sleep 600s after this step (tests)")
    p.add_argument("--straggle-rank", type=int, help="this rank is slow (tests)")
    p.add_argument("--straggle-seconds", type=float, default=0.0, help="its extra s per step")
    p.add_argument("--dump-state", type=Path, help="rank 0 writes the full state here at exit")
    p.add_argument("--plain-init", action="store_true", help="dist.init_process_group as is")
    p.add_argument("--fault-kill-step", type=int, help="SIGKILL after this step (restart 0)")
    p.add_argument("--fault-kill-rank", type=int, default=1)
    p.add_argument("--fault-kill-in-save", type=int, help="SIGKILL inside this step's save")
    p.add_argument("--fault-flip-file", type=Path, help="if it exists: flip a weight's bit (tests)")
    p.add_argument(
        "--anomaly-guard",
        action="store_true",
        help="judge losses and each rank's gradient norm (AnomalyGuard, every 10 steps)",
    )
    p.add_argument(
        "--fault-misalign-rank",
        type=int,
        help="after a resume, this rank reads its labels one record off (tests)",
    )
    p.add_argument(
        "--fault-scale-file",
        type=Path,
        help="if it exists: scale this rank's gradient before the all-reduce (tests)",
    )
    args = p.parse_args(argv)
    if (args.root is None) == (args.plain_checkpoints is None):
        p.error("give one of --root and --plain-checkpoints")
    if args.plain_checkpoints is not None and (args.fsdp or args.async_save):
        p.error("--plain-checkpoints saves a DDP model, blocking")
    if args.nvrx_heartbeats and args.plain_checkpoints is None:
        p.error("--nvrx-heartbeats: expected --plain-checkpoints too (the NVRx baseline)")
    return args


def _seconds(value: str | None) -> float | str | None:
    """``--save-seconds``: seconds, or ``auto`` (the operator's interval)."""
    return value if value in (None, "auto") else float(value)


def accumulating(wrapped: nn.Module, local: bool) -> contextlib.AbstractContextManager[Any]:
    """DDP's ``no_sync()`` for a micro-batch whose gradient stays local; else nothing."""
    if local and isinstance(wrapped, nn.parallel.DistributedDataParallel):
        return wrapped.no_sync()
    return contextlib.nullcontext()


def full_state(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """Unsharded model and optimizer state (collective under FSDP)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return {
        "model": get_model_state_dict(model, options=options),
        "optim": get_optimizer_state_dict(model, opt, options=options),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)
    # the in-place supervisor's generation (rtj-shim supervise): 0 for a pod's first start
    generation = int(os.environ.get("RTJ_RESTART_GENERATION") or 0)
    if world > 1:
        if args.plain_init or args.plain_checkpoints is not None:
            dist.init_process_group("gloo")
        else:
            init_process_group("gloo")
    rank = dist.get_rank() if world > 1 else 0
    args.log_dir.mkdir(parents=True, exist_ok=True)
    log = (args.log_dir / f"rank-{rank}.jsonl").open("a", buffering=1)

    def emit(record: dict[str, Any]) -> None:
        line = {**record, "rank": rank, "restart": restart, "generation": generation,
                "time": time.time()}  # fmt: skip
        log.write(json.dumps(line) + "\n")

    def log_save(report: SaveReport | None, logged: SaveReport | None) -> SaveReport | None:
        """A save is logged once it is published, with the step it published (a
        background save's report comes a boundary or more after its step)."""
        if report is not None and report is not logged:
            emit({"event": "save", "step": report.step, "seconds": report.seconds})
        return report

    def log_fast(fast: Any, logged: Any) -> Any:
        """A fast-tier save (RTJ_FAST_TIER_DIR from the operator) is logged once written,
        with what it stalled this training thread (bench.fast_tier_example reads it)."""
        last = None if fast is None else fast.last
        if last is not None and last is not logged:
            emit({"event": "fast_save", "step": last.step, "stall": last.stall,
                  "seconds": last.seconds})  # fmt: skip
        return last

    torch.manual_seed(args.seed)  # same initial weights on every rank
    model = make_model(args.hidden)
    if args.fsdp and world > 1:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        wrapped: nn.Module = model
    elif world > 1:
        # DDP re-buckets the gradients by their ready order after its first step, so the
        # first step after a resume all-reduces them in another layout than the no-fault
        # run did at that step; with 3 or more ranks the sum's order then differs in the
        # last bit (2 ranks: a + b == b + a). find_unused_parameters keeps the first
        # layout for good (no rebuild), at the cost of one graph traversal per step.
        wrapped = nn.parallel.DistributedDataParallel(model, find_unused_parameters=world > 2)
    else:
        wrapped = model
    opt = torch.optim.AdamW(wrapped.parameters(), lr=args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(args.steps, warmup=10))
    data = Synthetic(args.samples, seed=7)
    sampler = ResumableSampler(data, shuffle=True, seed=args.seed, dataset_id="synthetic-v1")
    # Creating a DataLoader iterator draws a seed from its generator; without one of its
    # own that is the global torch RNG, and a resumed run (which creates its iterator at
    # a different point) would see different dropout masks from then on.
    loader = DataLoader(
        data, batch_size=args.batch, sampler=sampler, num_workers=0, generator=torch.Generator()
    )
    torch.manual_seed(args.seed + 1000 + rank)  # dropout differs per rank

    probe_x, probe_y = data.x[:32], data.y[:32]

    def probe() -> torch.Tensor:
        return nn.functional.mse_loss(wrapped(probe_x), probe_y)

    root: Any = args.root
    if args.fault_kill_in_save is not None and restart == 0 and rank == args.fault_kill_rank:
        root = KillInSaveStore(open_store(args.root), args.fault_kill_in_save)
    ckpt: Any
    if args.plain_checkpoints is not None:
        ckpt = PlainCheckpoints(
            args.plain_checkpoints, args.save_every, rank, world, args.nvrx_heartbeats
        )
    else:
        ckpt = Checkpointer(
            root,
            every_steps=args.save_every or None,
            every_seconds=_seconds(args.save_seconds),
            io=IoOptions(shard_bytes=args.shard_kib << 10) if args.shard_kib else None,
            resume=ResumeOptions(probe=probe if args.probe else None),
            emergency=EmergencyOptions(deadline_s=args.emergency_deadline),
            integrity=IntegrityOptions(anomaly_guard=AnomalyGuard(window=64, warmup=16),
                                       every_steps=10) if args.anomaly_guard else None,
        )  # fmt: skip
        if args.anomaly_guard and isinstance(wrapped, nn.parallel.DistributedDataParallel):
            ckpt.watch_gradients(wrapped)  # this rank's own norm, before the all-reduce
    scaling = scale_gradients(model) if args.fault_scale_file is not None else None
    # Plain values go into the checkpoint as they are (replicated: equal on every rank).
    objects: dict[str, Any] = {
        "model": wrapped,
        "optimizer": opt,
        "scheduler": sched,
        "sampler": sampler,
        "samples_seen": 0,  # restored into this dict by restore()
    }
    t0 = time.perf_counter()
    step = ckpt.restore(objects)
    info = ckpt.last_restore
    assert info is not None
    emit(
        {
            "event": "restore",
            "step": step,
            "source": info.source,
            "seconds": time.perf_counter() - t0,
            "skipped": [{"step": s, "reason": r} for s, r in info.skipped],
            "notes": list(info.notes),
        }
    )

    if step > 0 and args.fault_misalign_rank == rank:
        shift_labels(data.y, rank, step)

    def micro_batches() -> Any:
        while True:
            yield from loader
            sampler.set_epoch(sampler.epoch + 1)

    batches = micro_batches()
    ckpt_s = 0.0
    logged: SaveReport | None = None
    fast_tier = getattr(ckpt, "fast_tier", None)  # a Checkpointer's (None: no fast tier)
    logged_fast: Any = None
    while step < args.steps:
        wrapped.train()
        total = 0.0
        if scaling is not None:
            scaling["now"] = args.fault_scale_file.exists()
        ids: list[int] = []
        if args.straggle_rank == rank and args.straggle_seconds:
            with progress.section("data"):  # a slow input pipeline on one rank
                time.sleep(args.straggle_seconds)
        if world > 1:  # the wait for the slowest rank, made explicit (a waiting section)
            with progress.section("barrier"):
                dist.barrier()
        for micro in range(args.accum):
            with progress.section("data"):
                idx, x, y = next(batches)
            # DDP all-reduces at the last micro-batch only: the others add up locally, so
            # the all-reduce (and watch_gradients' norm before it) sees this rank's own sum
            with accumulating(wrapped, micro < args.accum - 1):
                with progress.section("forward"):
                    loss = nn.functional.mse_loss(wrapped(x), y) / args.accum
                with progress.section("backward"):
                    loss.backward()
            total += float(loss.detach())
            ids.extend(int(i) for i in idx)
        with progress.section("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        lr = sched.get_last_lr()[0]
        sched.step()
        step += 1
        objects["samples_seen"] += len(ids)
        emit(
            {
                "step": step,
                "loss": total,
                "lr": lr,
                "samples": ids,
                "epoch": sampler.epoch,
                "seen": objects["samples_seen"],
                "ckpt_s": ckpt_s,  # the checkpointer's calls since the last line (below)
            }
        )
        if args.step_sleep:
            time.sleep(args.step_sleep)
        if args.hang_at_step == step:
            time.sleep(600)
        if args.fault_kill_step == step and restart == 0 and rank == args.fault_kill_rank:
            sys.stderr.write(f"fault: SIGKILL rank {rank} after step {step}\n")
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        if args.fault_flip_file is not None and args.fault_flip_file.exists():
            flip_a_bit(model, rank, step)  # a bad GPU's silent error, once
            args.fault_flip_file.unlink()
        if scaling is not None and scaling["now"]:
            scaling["now"] = False
            args.fault_scale_file.unlink()
            sys.stderr.write(f"fault: rank {rank}'s gradient scaled at step {step}\n")
        # saves every --save-every steps, and makes a SIGTERM's emergency save; the time
        # the loop spends here is the checkpoint stall, logged with the next step (the
        # goodput soaks count it as lost time: bench.soak_accounting)
        boundary = time.perf_counter()
        ckpt.step_boundary(step, objects, loss=total, blocking=not args.async_save)
        if step == args.steps and (not args.save_every or step % args.save_every):  # last
            ckpt.save(step, objects, blocking=not args.async_save, loss=total)
        ckpt_s = round(time.perf_counter() - boundary, 6)
        logged = log_save(ckpt.last_save, logged)
        logged_fast = log_fast(fast_tier, logged_fast)
    ckpt.wait()
    log_save(ckpt.last_save, logged)
    if fast_tier is not None:
        fast_tier.wait()
        log_fast(fast_tier, logged_fast)
    if args.dump_state is not None:
        state = full_state(wrapped, opt)
        if rank == 0:
            torch.save(state, args.dump_state)
    ckpt.close()
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
