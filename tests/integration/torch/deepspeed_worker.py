"""A small DeepSpeed training loop with ``PublishingEngine``, run under ``torchrun`` (gloo,
CPU: ``DS_ACCELERATOR=cpu``) by test_deepspeed_integration.py.

    deepspeed_worker.py ROOT OUT_DIR

ZeRO stage 2 (optimizer states and gradients partitioned across the ranks), AdamW (torch's),
DeepSpeed's WarmupLR schedule, dropout: 16 optimizer steps, saved every 4 (and at the end)
with ``keep_last=2``. DeepSpeed saves no RNG state, so each step's batch and dropout masks
are drawn from generators seeded by the step and the rank. ``KILL_AT=N`` in the
environment: after step N every rank writes its pid into ``OUT_DIR/at-kill-<rank>`` and
sleeps, for the test to SIGKILL it there. At the end rank 0 writes ``OUT_DIR/final.pt``
(the module's state) and every rank ``OUT_DIR/rank-<r>.json`` (the step restored, the
skipped steps, the client state restored, each step's loss).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed
import torch
import torch.distributed as dist
from torch import nn

from rtj_shim.integrations.deepspeed import PublishingEngine

TOTAL, SAVE_EVERY, BATCH = 16, 4, 4
CONFIG = {
    "train_micro_batch_size_per_gpu": BATCH,
    "gradient_accumulation_steps": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.02, "torch_adam": True}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 0.02,
                                                 "warmup_num_steps": 8}},
    "zero_optimization": {"stage": 2},
}  # fmt: skip


def main(root: str, out: Path) -> int:
    kill_at = int(os.environ.get("KILL_AT", "0"))
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Dropout(0.2), nn.Linear(32, 1))
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=CONFIG
    )
    state = PublishingEngine(engine, root, keep_last=2)
    step, client = state.restore()  # 0, None: a fresh start
    losses: dict[int, float] = {}
    while step < TOTAL:
        step += 1
        g = torch.Generator().manual_seed(1000 * step + rank)  # this step's batch, any run
        x = torch.randn(BATCH, 4, generator=g)
        torch.manual_seed(7919 * step + rank)  # this step's dropout masks
        loss = nn.functional.mse_loss(engine(x), x.sum(dim=1, keepdim=True).sin())
        engine.backward(loss)
        engine.step()
        losses[step] = loss.item()
        if step % SAVE_EVERY == 0 or step == TOTAL:
            state.save(step, client_state={"last_loss": losses[step]})
        if step == kill_at:  # each rank says where it is: the test SIGKILLs it there
            (out / f"at-kill-{rank}").write_text(str(os.getpid()))
            time.sleep(600)

    resumed = state.resumed
    report = {
        "restored": 0 if resumed is None else resumed.step,
        "skipped": [] if resumed is None else [list(s) for s in resumed.skipped],
        "client_state": client,
        "losses": losses,
    }
    (out / f"rank-{rank}.json").write_text(json.dumps(report, default=str))
    if rank == 0:
        torch.save(engine.module.state_dict(), out / "final.pt")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1], Path(sys.argv[2]))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as accelerate_worker.py: no interpreter teardown after the work is done
