"""A worker for test_torch_config_guard: restore (any world size), train one step, save the
step given on the command line, print what it restored and saved (rank 0)."""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

from rtj_shim.torch import Checkpointer


def main(root: str, step: int) -> None:
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
    objects = {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.01)}
    ckpt = Checkpointer(root, config={"lr": 0.01})
    restored = ckpt.restore(objects, strict=False)  # rank-local RNGs of another world
    loss = model(torch.randn(8, 4)).pow(2).mean()
    loss.backward()
    objects["opt"].step()
    ckpt.save(step, objects)
    ckpt.close()
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(json.dumps({"restored": restored, "saved": step}))
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
