"""The models the torch benchmarks train and save, each with AdamW's moments made by one
training step: a stack of ``Linear(2048, 2048)`` layers sized in GiB (bench.torch_state) and
the example trainer's own MLP at a given width, with its scheduler and a fixed batch
(bench.fast_tier); and the size of their state.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
from torch import nn

from bench.common import REPO, GiB

WIDTH = 2048  # Linear(2048, 2048): 16 MiB of float32 weights per layer
BATCH = 16  # the example's --batch 8 x --accum 2


def state_bytes(model: nn.Module, opt: torch.optim.Optimizer) -> int:
    """Parameters and every tensor of the optimizer's state (AdamW: two moments)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    for st in opt.state.values():
        total += sum(v.numel() * v.element_size() for v in st.values() if torch.is_tensor(v))
    return total


# ---------------------------------------------------------------- a stack of Linear layers


def linear_stack(size_gib: float) -> tuple[nn.Sequential, torch.optim.Optimizer, torch.Tensor]:
    """Linear layers whose parameters are a third of ``size_gib`` (the moments the rest)."""
    layer_bytes = WIDTH * WIDTH * 4
    layers = max(1, round(size_gib * GiB / 3 / layer_bytes))
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(WIDTH, WIDTH) for _ in range(layers)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = torch.randn(4, WIDTH)
    train_step(model, opt, batch)  # materialize the AdamW moments
    return model, opt, batch


def train_step(model: nn.Module, opt: torch.optim.Optimizer, batch: torch.Tensor) -> None:
    model(batch).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


# ---------------------------------------------------------------- the example trainer's MLP


def example_trainer() -> ModuleType:
    """``examples/ddp_train.py``, loaded from its file (it is a script, not a package)."""
    name = "rtj_bench_ddp_train"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "examples" / "ddp_train.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@dataclass
class Trainer:
    model: nn.Module
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LRScheduler
    x: torch.Tensor
    y: torch.Tensor
    objects: dict[str, Any]

    @property
    def params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def state_bytes(self) -> int:
        return state_bytes(self.model, self.opt)

    def step(self) -> None:
        self.model.train()
        (self.model(self.x) - self.y).square().mean().backward()  # mse_loss
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.sched.step()
        self.objects["samples_seen"] += BATCH

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.opt.state_dict(),
            "scheduler": self.sched.state_dict(),
            "samples_seen": self.objects["samples_seen"],
        }


def example_model(hidden: int) -> Trainer:
    """The example trainer's ``make_model(hidden)``, AdamW and its warm-up + cosine
    ``LambdaLR``, on a fixed batch of ``BATCH``."""
    ex = example_trainer()
    torch.manual_seed(0)
    model = ex.make_model(hidden)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, ex.lr_lambda(100_000, 100))
    x = torch.randn(BATCH, ex.DIM)
    y = torch.randn(BATCH, 1)
    objects = {"model": model, "optimizer": opt, "scheduler": sched, "samples_seen": 0}
    trainer = Trainer(model, opt, sched, x, y, objects)
    trainer.step()  # materialize AdamW's moments
    return trainer
