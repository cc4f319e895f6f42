"""A worker for test_torch_sdc: DDP on gloo, 3 ranks by torchrun. Trains to step 8 with a
save at step 4, then does what argv[2] says before the save of step 8:

* ``clean``: nothing (both saves publish);
* ``flip``: flips one bit of one element of rank 2's first Linear weight, as a silently
  failing GPU would, after the step's all-reduce (DDP then never repairs it);
* ``between``: the same flip at step 6, with ``integrity_every_steps=2``: caught by the
  check at step 6, before any save;
* ``spike``: rank 1's loss at step 7 is reported a million times larger (a flipped
  exponent bit shows this way), with an AnomalyGuard on every rank;
* ``scaled``: rank 1's gradient at step 7 is scaled ten thousand times before DDP's
  all-reduce (a tensor hook on its parameters, as a bad GPU's arithmetic in backward),
  with an AnomalyGuard and ``watch_gradients`` on every rank, each passing the norm after
  the all-reduce as ``grad_norm`` (off on every rank alike: it names no one);
* ``scaled-fast``: the same with a fast tier every 2 steps (argv[3]: its directory): the
  fast save of step 8 takes the anomaly verdict first and keeps nothing.

Rank 0 prints JSON: the steps published and the error each rank raised.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from rtj_shim.checkpoint.layout import step_key
from rtj_shim.torch import AnomalyGuard, Checkpointer, FastTierConfig, SuspectState
from rtj_shim.torch.options import IntegrityOptions


def main(root: str, mode: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))
    model = DistributedDataParallel(net)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    guard = AnomalyGuard(window=16, warmup=4) if mode.startswith(("spike", "scaled")) else None
    every = 2 if mode == "between" else None
    fast = FastTierConfig(sys.argv[3], 2) if mode == "scaled-fast" else None
    ckpt = Checkpointer(root, integrity=IntegrityOptions(anomaly_guard=guard, every_steps=every),
                        fast_tier=fast)  # fmt: skip
    scale = {"now": False}
    if mode.startswith("scaled"):
        ckpt.watch_gradients(model)
        if rank == 1:
            for p in net.parameters():
                p.register_hook(lambda g: g * 1e4 if scale["now"] else g)
    flip_at = {"flip": 8, "between": 6}.get(mode)
    objects = {"model": model, "opt": opt}
    data = torch.Generator().manual_seed(100 + rank)
    error = None
    for step in range(1, 9):
        loss = model(torch.randn(32, 64, generator=data)).pow(2).mean()
        scale["now"] = step == 7
        loss.backward()
        norm = nn.utils.clip_grad_norm_(model.parameters(), float("inf"))  # after the all-reduce
        opt.step()
        opt.zero_grad()
        if step == flip_at and rank == 2:
            with torch.no_grad():
                net[0].weight.view(-1).view(torch.int32)[4097] ^= 1 << 3
        reported = loss * 1e6 if mode == "spike" and step == 7 and rank == 1 else loss
        try:
            ckpt.step_boundary(step, objects, loss=reported.detach(), grad_norm=norm)
            if step in (4, 8):
                ckpt.save(step, objects)
        except SuspectState as exc:
            error = f"{type(exc).__name__}: {exc}"
            break
    ckpt.close()
    errors = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    if rank == 0:
        published = [s for s in (4, 8) if os.path.exists(os.path.join(root, step_key(s)))]
        print(json.dumps({"published": published, "errors": errors}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
