"""A small DeepSpeed ZeRO-2 training job that resumes exactly where it stopped.

An MLP with dropout learns a synthetic regression task with DeepSpeed (ZeRO stage 2: the
AdamW moments and the gradients partitioned across the ranks, a warm-up schedule), its
checkpoints published through ``rtj_shim.integrations.deepspeed.PublishingEngine``: every
``--save-every`` steps each rank writes its part of ``engine.save_checkpoint``, rank 0
publishes the step, and a restart loads the step the operator pinned (or the newest that
verifies). DeepSpeed keeps no RNG state, so each step's batch and dropout masks are drawn
from the step and the rank. Every rank appends one JSON line per step to
``<log-dir>/rank-<r>.jsonl`` (``{step, loss, time}``, floats that round-trip exactly) and
one ``{"event": "restore", "step": S}`` when it resumed: two runs compare bit for bit.

    torchrun --nproc-per-node 2 examples/deepspeed_train.py --root /tmp/ckpt --log-dir /tmp/logs

On a machine without CUDA it runs on DeepSpeed's CPU accelerator (``DS_ACCELERATOR=cpu``,
gloo), as the pod runner's drill does (`e2e/demo/test_deepspeed_drill.py`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

if not torch.cuda.is_available():  # DeepSpeed's CPU accelerator, chosen before its import
    os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed
import torch.distributed as dist
from torch import nn

from rtj_shim.integrations.deepspeed import PublishingEngine

BATCH, FEATURES = 16, 8


def config(lr: float) -> dict[str, object]:
    return {
        "train_micro_batch_size_per_gpu": BATCH,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": lr, "torch_adam": True}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0,
                                                     "warmup_max_lr": lr,
                                                     "warmup_num_steps": 20}},
        "zero_optimization": {"stage": 2},
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default=os.environ.get("RTJ_CHECKPOINT_URI"),
                   help="the checkpoint root (default: RTJ_CHECKPOINT_URI)")  # fmt: skip
    p.add_argument("--log-dir", type=Path, required=True)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--save-every", type=int, default=40)
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds per step, added")
    p.add_argument("--keep-last", type=int, default=3)
    args = p.parse_args(argv)

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    deepspeed.init_distributed(dist_backend=backend)
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, 64), nn.GELU(), nn.Dropout(0.1), nn.Linear(64, 1))
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=config(3e-3)
    )
    state = PublishingEngine(engine, args.root, keep_last=args.keep_last)
    step, _ = state.restore()
    args.log_dir.mkdir(parents=True, exist_ok=True)
    log = (args.log_dir / f"rank-{rank}.jsonl").open("a", buffering=1)
    if step:
        log.write(json.dumps({"event": "restore", "step": step, "time": time.time()}) + "\n")
    device = engine.device
    while step < args.steps:
        step += 1
        g = torch.Generator().manual_seed(100_003 * step + rank)  # this step's batch
        x = torch.randn(BATCH, FEATURES, generator=g).to(device)
        torch.manual_seed(7_919 * step + rank)  # this step's dropout masks
        loss = nn.functional.mse_loss(engine(x), x.sum(dim=1, keepdim=True).sin())
        engine.backward(loss)
        engine.step()
        log.write(json.dumps({"step": step, "loss": loss.item(), "time": time.time()}) + "\n")
        if step % args.save_every == 0 or step == args.steps:
            state.save(step)
            log.write(json.dumps({"event": "save", "step": step, "time": time.time()}) + "\n")
        if args.step_sleep:
            time.sleep(args.step_sleep)
    log.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown once the work is done (torch's C++ threads)
