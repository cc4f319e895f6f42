"""A small Hugging Face Accelerate training loop with ``PublishingState``, run under
``torchrun --nproc-per-node 2`` (gloo, CPU) by test_accelerate_integration.py.

    accelerate_worker.py ROOT OUT_DIR

Shuffled data (a seedable sampler), dropout, AdamW, a linear LR schedule: 16 optimizer
steps, 6 per epoch on each of the 2 processes, saved every 4 (and at the end) with
``keep_last=2``. ``KILL_AT=N`` in the environment: after step N every rank writes its
pid into ``OUT_DIR/at-kill-<rank>`` and sleeps, for the test to SIGKILL it there. At
the end rank 0 writes ``OUT_DIR/final.pt`` (the unwrapped model's state) and every rank
``OUT_DIR/rank-<r>.json`` (the step restored, the skipped steps, each step's loss).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from rtj_shim.integrations.accelerate import PublishingState

TOTAL, SAVE_EVERY, BATCH, SAMPLES = 16, 4, 4, 48  # 48 / (4 x 2 processes) = 6 steps/epoch


def main(root: str, out: Path) -> int:
    kill_at = int(os.environ.get("KILL_AT", "0"))
    set_seed(0)
    accelerator = Accelerator(
        cpu=True, dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True)
    )
    g = torch.Generator().manual_seed(1)
    x = torch.randn(SAMPLES, 4, generator=g)
    data = TensorDataset(x, x.sum(dim=1, keepdim=True).sin())
    # generator=: the DataLoader draws its base seed from it, not from the global RNG that
    # the checkpoint restores (otherwise a mid-epoch resume shifts the dropout masks)
    loader = DataLoader(data, batch_size=BATCH, shuffle=True, generator=torch.Generator())
    model = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Dropout(0.2), nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.02)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.97**s)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

    state = PublishingState(accelerator, root, keep_last=2)
    step = state.restore()  # 0: a fresh start
    per_epoch = len(loader)
    losses: dict[int, float] = {}
    epoch = step // per_epoch
    while step < TOTAL:
        loader.set_epoch(epoch)  # the seedable sampler's shuffle for this epoch
        skip = step - epoch * per_epoch  # batches of this epoch already trained
        batches = accelerator.skip_first_batches(loader, skip) if skip else loader
        for xb, yb in batches:
            loss = nn.functional.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            step += 1
            losses[step] = loss.item()
            if step % SAVE_EVERY == 0 or step == TOTAL:
                state.save(step)
            if step == kill_at:  # each rank says where it is: the test SIGKILLs it there
                (out / f"at-kill-{accelerator.process_index}").write_text(str(os.getpid()))
                time.sleep(600)
            if step == TOTAL:
                break
        epoch += 1

    accelerator.wait_for_everyone()
    resumed = state.resumed
    report = {
        "restored": 0 if resumed is None else resumed.step,
        "skipped": [] if resumed is None else [list(s) for s in resumed.skipped],
        "losses": losses,
    }
    (out / f"rank-{accelerator.process_index}.json").write_text(json.dumps(report))
    if accelerator.is_main_process:
        torch.save(accelerator.unwrap_model(model).state_dict(), out / "final.pt")
    accelerator.end_training()
    if dist.is_initialized():  # as every other worker here: a gloo group left to the
        dist.destroy_process_group()  # interpreter's exit aborted a rank under load (CI)
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1], Path(sys.argv[2]))
    # Everything is written and the process group destroyed: leave without the interpreter's
    # teardown, where a C++ thread of torch's (not ours: the shim's threads are Python's)
    # still joinable at its destructor aborted a rank with "terminate called without an
    # active exception" in two fresh-clone CI runs under load, after the test's work was done.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
