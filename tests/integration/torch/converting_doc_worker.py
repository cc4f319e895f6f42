"""Runs one "after" block of docs/converting.md as a training script would, in a fresh
process, with the names the script has around it (a tiny model on CPU); the test runs it
twice to check the second run resumes from the step the first one saved.

    converting_doc_worker.py NAME TOTAL RESULT_JSON

NAME: the block's marker (``<!-- converting-example: NAME -->``); TOTAL: the script's
length (``total_steps``, or ``max_epochs`` for Lightning). The checkpoint root comes from
``RTJ_CHECKPOINT_URI``, as in the operator's pod. The one change made to a block: on a
machine without CUDA, ``init_process_group("nccl")`` runs with ``"gloo"``. Writes
RESULT_JSON: the step restored (when the block's objects tell it), the last step trained
and what the example checks besides.
"""

from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

DOC = Path(__file__).resolve().parents[3] / "docs" / "converting.md"
BLOCK = re.compile(r"<!-- converting-example: ([\w-]+) -->\n```(\w+)\n(.*?)\n```\n", re.S)
NCCL = 'init_process_group("nccl")'

Namespace = dict[str, Any]


def blocks(text: str) -> dict[str, tuple[str, str]]:
    """Each marked block of the doc: name -> (language, body)."""
    found: dict[str, tuple[str, str]] = {}
    for match in BLOCK.finditer(text):
        name, lang, body = match.groups()
        if name in found:
            raise ValueError(f"two blocks are marked converting-example: {name}")
        found[name] = (lang, body)
    return found


def after_code(lang: str, body: str) -> str:
    """The code a diff leaves (its context and ``+`` lines); a python block as it is."""
    if lang == "python":
        return body + "\n"
    if lang != "diff":
        raise ValueError(f"a converting-example block is diff or python, not {lang}")
    kept: list[str] = []
    for line in body.splitlines():
        if line.startswith("-"):
            continue
        if line and not line.startswith(("+", " ")):
            raise ValueError(f"a diff line without +, - or a space: {line!r}")
        kept.append(line[1:])
    return "\n".join(kept) + "\n"


def source(name: str) -> str:
    lang, body = blocks(DOC.read_text())[name]
    code = after_code(lang, body)
    if not torch.cuda.is_available():
        code = code.replace(NCCL, 'init_process_group("gloo")')
    return code


def run(name: str, namespace: Namespace) -> Namespace:
    exec(compile(source(name), f"{DOC}:{name}", "exec"), namespace)
    return namespace


def regression_data(samples: int) -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(samples, 4, generator=g)
    return TensorDataset(x, x.sum(dim=1, keepdim=True).sin())


def small_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def plain(total: int) -> dict[str, Any]:
    net = small_net()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=100, gamma=0.9)
    scaler = torch.amp.GradScaler("cpu")
    ns: Namespace = {}

    def train_step(batch: list[torch.Tensor]) -> float:
        x, y = batch
        loss = nn.functional.mse_loss(ns["model"](x), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        sched.step()
        return loss.item()

    ns.update(
        torch=torch,
        DDP=nn.parallel.DistributedDataParallel,
        DataLoader=DataLoader,
        net=net,
        opt=opt,
        sched=sched,
        scaler=scaler,
        dataset=regression_data(64),  # 8 steps an epoch
        train_step=train_step,
        total_steps=total,
        out="out",
    )
    run("plain", ns)
    report = ns["ckpt"].last_restore
    torch.distributed.destroy_process_group()
    return {"restored": report.step, "source": report.source, "final": ns["step"]}


def dcp(total: int) -> dict[str, Any]:
    model = small_net()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(2)

    def train_step() -> None:
        x = torch.randn(8, 4, generator=g)
        loss = nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True).sin())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    ns = run("dcp", {"model": model, "optimizer": optimizer, "train_step": train_step,
                     "total_steps": total})  # fmt: skip
    report = ns["ckpt"].last_restore
    return {"restored": report.step, "source": report.source, "final": ns["step"]}


def lightning(max_epochs: int) -> dict[str, Any]:
    from lightning.pytorch import LightningModule, Trainer
    from lightning.pytorch.callbacks import ModelCheckpoint

    rng_state = run("lightning-rng", {})["RngState"]  # the doc's mixin, saved and restored
    restored_rng: list[bool] = []

    class Tiny(rng_state, LightningModule):  # type: ignore[misc,valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.net = small_net()

        def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters(), lr=0.01)

        def train_dataloader(self) -> DataLoader[tuple[torch.Tensor, ...]]:
            return DataLoader(regression_data(16), batch_size=8)  # 2 steps an epoch

        def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            for draw in (random.random, np.random.rand, torch.seed):
                draw()  # this process's RNGs moved on from the saved states
            super().on_load_checkpoint(checkpoint)
            rng = checkpoint["rng"]
            restored_rng.append(
                random.getstate() == rng["python"]
                and torch.equal(torch.get_rng_state(), rng["torch"])
                and np.array_equal(np.random.get_state()[1], rng["numpy"][0].numpy())
            )

    ns = run("lightning", {"Trainer": Trainer, "ModelCheckpoint": ModelCheckpoint,
                           "model": Tiny(), "max_epochs": max_epochs, "out": "out"})  # fmt: skip
    resumed = ns["io"].resumed
    return {
        "restored": 0 if resumed is None else resumed.step,
        "final": ns["trainer"].global_step,
        "rng_restored": restored_rng,
    }


def hf(total: int) -> dict[str, Any]:
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    ids = torch.randint(0, 64, (32, 16), generator=torch.Generator().manual_seed(1))
    ns = run("hf", {"TrainingArguments": TrainingArguments, "Trainer": Trainer,
                    "model": GPT2LMHeadModel(config),
                    "dataset": [{"input_ids": row, "labels": row} for row in ids],
                    "out": "out", "total_steps": total})  # fmt: skip
    return {"final": ns["trainer"].state.global_step}


def accelerate(total: int) -> dict[str, Any]:
    from accelerate import Accelerator, DataLoaderConfiguration

    net = small_net()
    ns: Namespace = {}

    def train_step(batch: list[torch.Tensor]) -> None:
        x, y = batch
        loss = nn.functional.mse_loss(ns["model"](x), y)
        ns["optimizer"].zero_grad()
        ns["accelerator"].backward(loss)
        ns["optimizer"].step()
        ns["scheduler"].step()

    optimizer = torch.optim.Adam(net.parameters(), lr=0.01)
    ns.update(
        Accelerator=Accelerator,
        DataLoaderConfiguration=DataLoaderConfiguration,
        model=net,
        optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.9),
        loader=DataLoader(regression_data(40), batch_size=8, shuffle=True,
                          generator=torch.Generator()),  # 5 steps an epoch
        train_step=train_step,
        total_steps=total,
        out="out",
    )  # fmt: skip
    run("accelerate", ns)
    resumed = ns["state"].resumed
    return {"restored": 0 if resumed is None else resumed.step, "final": ns["step"]}


def deepspeed(total: int) -> dict[str, Any]:
    import os

    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed as ds

    ds.init_distributed(dist_backend="gloo")  # the doc's initialize finds it initialized

    def train_step(engine: Any, step: int) -> None:
        g = torch.Generator().manual_seed(step)
        x = torch.randn(8, 4, generator=g)
        engine.backward(nn.functional.mse_loss(engine(x), x.sum(dim=1, keepdim=True).sin()))
        engine.step()

    adamw = {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}}
    config = {"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 1},
              "optimizer": adamw}  # fmt: skip
    ns = run("deepspeed", {"deepspeed": ds, "model": small_net(), "ds_config": config,
                           "train_step": train_step, "total_steps": total})  # fmt: skip
    resumed = ns["state"].resumed
    torch.distributed.destroy_process_group()
    return {"restored": 0 if resumed is None else resumed.step, "final": ns["step"]}


def orbax(total: int) -> dict[str, Any]:
    import os

    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax
    import jax.numpy as jnp

    def train_step(state: dict[str, Any], step: int) -> dict[str, Any]:
        x = jax.random.normal(jax.random.fold_in(jax.random.key(0), step), (8, 4))
        grad = jax.grad(lambda w: jnp.mean((x @ w - jnp.sin(x.sum(axis=1))) ** 2))(state["w"])
        return {"w": state["w"] - 0.05 * grad}

    ns = run("orbax", {"jax": jax, "state": {"w": jnp.zeros((4,))}, "train_step": train_step,
                       "total_steps": total})  # fmt: skip
    resumed = ns["ckpt"].resumed
    return {"restored": 0 if resumed is None else resumed.step, "final": ns["step"]}


EXAMPLES = {
    "plain": plain, "dcp": dcp, "lightning": lightning, "hf": hf, "accelerate": accelerate,
    "deepspeed": deepspeed, "orbax": orbax,
}  # fmt: skip


def main(name: str, total: int, result: Path) -> int:
    result.write_text(json.dumps(EXAMPLES[name](total)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])))
