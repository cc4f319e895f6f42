"""A data-parallel job that trains the same way on any number of workers (the elastic path).

``ElasticBatchSampler`` hands every optimizer step the global batch set here
(``--global-batch`` samples), whatever the world size: on 4 ranks with ``--micro-batch 4``
each rank runs one micro-batch of 4; shrunk to 3 ranks, each runs two micro-batches of 2 or
3 (gradient accumulation over the missing rank's share). Each micro-batch's mean loss is
multiplied by its ``loss_scale``, so after DDP averages over the ranks the optimizer sees
the mean gradient of the step's samples: the full world's step. The learning-rate schedule
counts optimizer steps, which do not change with the world; the sampler's position is in
the checkpoint, so a resume on another world size continues the same epoch, every sample
once.

    torchrun --nproc-per-node 4 examples/elastic_train.py --root /tmp/ckpt --log-dir /tmp/l
    torchrun --nproc-per-node 3 examples/elastic_train.py --root /tmp/ckpt --log-dir /tmp/l

Every rank appends ``{step, epoch, world, rank, generation, loss, lr, samples}`` per step to
``<log-dir>/rank-<r>.jsonl`` (``samples``: the dataset indices this rank consumed; ``loss``:
the step's mean loss over every rank's samples, the same on every rank).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from rtj_shim import progress
from rtj_shim.torch import Checkpointer, ElasticBatchSampler, init_process_group

DIM = 8


class Regression:
    """``n`` samples fixed by ``seed``: a noisy non-linear function of a random input."""

    def __init__(self, n: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, DIM, generator=gen)
        self.y = torch.tanh(self.x @ torch.randn(DIM, 1, generator=gen))
        self.y += 0.05 * torch.randn(n, 1, generator=gen)

    def __len__(self) -> int:
        return len(self.x)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", required=True, help="checkpoint root (path, file:// or s3://)")
    p.add_argument("--log-dir", required=True, type=Path)
    p.add_argument("--steps", type=int, default=24, help="optimizer steps in all (schedule)")
    p.add_argument("--stop-at", type=int, help="leave after this step, as a lost node would")
    p.add_argument("--samples", type=int, default=96)
    p.add_argument("--global-batch", type=int, default=16, help="samples per optimizer step")
    p.add_argument("--micro-batch", type=int, default=4, help="most samples per forward")
    p.add_argument("--save-every", type=int, default=1)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds per step (drills)")
    p.add_argument("--sample-sleep", type=float, default=0.0,
                   help="seconds per sample this rank trains (benchmarks: compute that grows "
                   "with a rank's share of the global batch, as on a GPU)")  # fmt: skip
    p.add_argument("--dump-params", type=Path, help="rank 0 writes the parameters here at exit")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    # the in-place supervisor's generation (rtj-shim supervise): 0 for a pod's first start
    generation = int(os.environ.get("RTJ_RESTART_GENERATION") or 0)
    if world > 1:
        init_process_group("gloo")
    rank = dist.get_rank() if world > 1 else 0
    args.log_dir.mkdir(parents=True, exist_ok=True)
    log = (args.log_dir / f"rank-{rank}.jsonl").open("a", buffering=1)
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model = nn.Sequential(nn.Linear(DIM, 32), nn.Tanh(), nn.Linear(32, 1))
    wrapped: nn.Module = model
    if world > 1:  # a fixed bucket layout (no rebuild after step 1): see examples/ddp_train.py
        wrapped = nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
    opt = torch.optim.AdamW(wrapped.parameters(), lr=0.02, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(1.0, s / args.steps)))
    )
    data = Regression(args.samples, seed=7)
    sampler = ElasticBatchSampler(data, args.global_batch, args.micro_batch, seed=args.seed,
                                  dataset_id="regression-v1")  # fmt: skip
    ckpt = Checkpointer(args.root, every_steps=args.save_every)
    objects: dict[str, Any] = {"model": wrapped, "optimizer": opt, "scheduler": sched,
                               "sampler": sampler}  # fmt: skip
    step = ckpt.restore(objects)
    log.write(json.dumps({"event": "restore", "step": step, "world": world}) + "\n")
    batches = iter(sampler)
    stop = args.steps if args.stop_at is None else min(args.stop_at, args.steps)
    while step < stop:
        batch = next(batches, None)
        if batch is None:  # the epoch ended: the next one
            sampler.set_epoch(sampler.epoch + 1)
            batches = iter(sampler)
            continue
        total = torch.zeros(())
        for micro in batch.micro_batches:
            idx = list(micro.indices)
            with progress.section("forward"):
                loss = nn.functional.mse_loss(wrapped(data.x[idx]), data.y[idx])
            with progress.section("backward"):
                (loss * micro.loss_scale).backward()
            total += loss.detach() * micro.loss_scale / world
        if world > 1:
            dist.all_reduce(total)  # the step's mean loss, over every rank's samples
        with progress.section("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        lr = sched.get_last_lr()[0]
        sched.step()
        step += 1
        record = {"step": step, "epoch": batch.epoch, "world": world, "rank": rank,
                  "generation": generation, "lr": lr, "loss": float(total),
                  "samples": list(batch.indices), "time": time.time()}  # fmt: skip
        log.write(json.dumps(record) + "\n")
        if args.step_sleep or args.sample_sleep:
            time.sleep(args.step_sleep + args.sample_sleep * len(batch.indices))
        ckpt.step_boundary(step, objects, loss=float(total))
    ckpt.wait()
    if args.dump_params is not None and rank == 0:
        params = {k: v.flatten().tolist() for k, v in model.state_dict().items()}
        args.dump_params.write_text(json.dumps(params))
    ckpt.close()
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
