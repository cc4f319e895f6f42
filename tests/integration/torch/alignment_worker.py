"""A worker for test_torch_alignment: DDP on gloo, 3 ranks by torchrun, learning y =
tanh(x w) from batches drawn for each (rank, step). argv: the checkpoint root, the mode,
the first step, the last step.

* ``train``: from step 1 (fresh) to the last step, giving each step's loss to
  ``step_boundary``; saves the last step.
* ``clean``: resumes and trains on, every rank reading the batches it would have read.
* ``shifted`` / ``shifted-fail``: the same, but rank 1 reads its labels one record off its
  features after the resume (a packed file read from the wrong position);
  ``shifted-fail`` with ``AlignmentCheck(fail=True)``.

Rank 0 prints JSON: the step restored, the error each rank raised.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from rtj_shim.torch import AlignmentCheck, Checkpointer, IntegrityOptions, MisalignedResume

W = torch.randn(32, 1, generator=torch.Generator().manual_seed(7))


def batch(rank: int, step: int, shifted: bool) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(65, 32, generator=gen)
    y = torch.tanh(x @ W) + 0.05 * torch.randn(65, 1, generator=gen)
    return (x[:64], y[1:]) if shifted else (x[:64], y[:64])


def main(root: str, mode: str, first: int, last: int) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 1)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    check = AlignmentCheck(fail=mode == "shifted-fail")
    ckpt = Checkpointer(root, integrity=IntegrityOptions(data_alignment=check))
    objects = {"model": model, "opt": opt}
    restored = ckpt.restore(objects)
    assert restored == first - 1, (restored, first)
    error = None
    try:
        for step in range(first, last + 1):
            x, y = batch(rank, step, shifted=mode.startswith("shifted") and rank == 1)
            loss = (model(x) - y).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            ckpt.step_boundary(step, objects, loss=loss.detach())
        if mode == "train":
            ckpt.save(last, objects)
    except MisalignedResume as exc:
        error = f"{type(exc).__name__}: {exc}"
    ckpt.close()
    errors = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    if rank == 0:
        print(json.dumps({"restored": restored, "errors": errors}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
