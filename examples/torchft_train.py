"""The goodput soak's TorchFT baseline (c): ddp_train's model and data, trained as
TorchFT's own ``train_ddp.py`` sets a replica group up (torchft 0.2.0).

One process per replica group (``torchrun --standalone``, one worker: the group's own
store), ``REPLICA_GROUP_ID``/``NUM_REPLICA_GROUPS`` and ``TORCHFT_LIGHTHOUSE`` from the
environment as torchft's ``torchx.py`` sets them. The loop is TorchFT's: a ``Manager`` over
``ProcessGroupGloo`` (5 s timeout, as its example), ``min_replica_size=1``, the quorum
synchronous (``use_async_quorum=False``: a group that heals knows its step, so its batch,
before it trains),
``torchft.DistributedDataParallel`` and ``torchft.Optimizer`` (``zero_grad`` starts the
quorum, ``step`` commits only when every participant finished the step). A group that
starts behind the quorum heals live from a peer (the Manager's ``load_state_dict``). The
data are sharded over the groups by ``torchft.data.DistributedSampler``; a group's batch at
global step ``s`` is batch ``s`` of its shard (its data position kept with the step, as the
Manager's docstring asks), so a group missing from a step never trains that step's batch.

Durable checkpoints as the docs recommend: the quorum's participating rank 0 ``torch.save``s
the model, optimizer and ``manager.state_dict()`` to ``<dir>/step-N.pt`` every
``--save-every`` committed steps (a temporary name, then a rename); a group that starts
loads the newest before its first quorum (the only copy when every group starts again).

Each committed step logs one JSON line to ``<log-dir>/group-<g>.jsonl``: ``{step, loss,
participants, samples, time}``; the end logs the model's fingerprint, so the judge can
tell whether the groups agree (`bench.baseline_torchft`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ddp_train import Synthetic, lr_lambda, make_model
from plain_checkpoints import newest_plain_step
from train_faults import flip_a_bit


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoints", type=Path, required=True, help="the shared volume")
    p.add_argument("--log-dir", type=Path, required=True)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--save-every", type=int, default=50)
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--batch", type=int, default=16, help="per group and step")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds per step (tests)")
    p.add_argument("--fault-flip-file", type=Path, help="if it exists: flip a weight's bit")
    return p.parse_args(argv)


def batch_of(sampler: Any, step: int, batch: int) -> list[int]:
    """The group's sample ids at global step `step`: its shard's batches, epoch after
    epoch, in the sampler's seeded order."""
    per_epoch = len(sampler) // batch
    sampler.set_epoch(step // per_epoch)
    at = (step % per_epoch) * batch
    return list(sampler)[at : at + batch]


def fingerprint(model: nn.Module) -> str:
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo
    from torchft.data import DistributedSampler

    group = int(os.environ.get("REPLICA_GROUP_ID", 0))
    groups = int(os.environ.get("NUM_REPLICA_GROUPS", 2))
    args.log_dir.mkdir(parents=True, exist_ok=True)
    log = (args.log_dir / f"group-{group}.jsonl").open("a", buffering=1)

    def emit(record: dict[str, Any]) -> None:
        log.write(json.dumps({**record, "time": time.time()}) + "\n")

    torch.manual_seed(args.seed)  # every group starts from the same weights
    model = make_model(args.hidden)
    inner = torch.optim.AdamW(model.parameters(), lr=args.lr)
    state_dict, load_state_dict = state_functions(model, inner)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=5)),
        min_replica_size=1,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"group_{group}",
        timeout=timedelta(seconds=10),
        use_async_quorum=False,  # the step (the data position) is known before the batch
    )
    resumed = resume(args.checkpoints, load_state_dict, manager)
    emit({"event": "restore", "step": manager.current_step(), "source": resumed})
    ddp = DistributedDataParallel(manager, model)
    optimizer = Optimizer(manager, inner)
    data = Synthetic(args.samples, args.seed)
    sampler = DistributedSampler(
        data, replica_rank=group, num_replica_groups=groups, group_rank=0, num_replicas=1,
        shuffle=True, seed=args.seed,
    )  # fmt: skip
    schedule = lr_lambda(args.steps, max(1, args.steps // 20))
    while manager.current_step() < args.steps:
        ddp.train()
        optimizer.zero_grad()  # the quorum (a group behind it heals here, before the step)
        step = manager.current_step()
        ids = batch_of(sampler, step, args.batch)
        torch.manual_seed(args.seed + 1000003 * step + group)  # dropout, per step and group
        for g in inner.param_groups:
            g["lr"] = args.lr * schedule(step)
        x, y = data.x[ids], data.y[ids]
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()  # the gradients' all-reduce over the quorum's participants
        optimizer.step()  # commits only if every participant finished the step
        if manager.current_step() == step:
            emit({"event": "uncommitted", "step": step + 1})
            continue
        step += 1
        emit({"step": step, "loss": float(loss.detach()), "samples": ids,
              "participants": manager.num_participants()})  # fmt: skip
        if args.step_sleep:
            time.sleep(args.step_sleep)
        if args.fault_flip_file is not None and args.fault_flip_file.exists():
            flip_a_bit(model, group, step)  # a bad GPU's silent error, once
            args.fault_flip_file.unlink()
        if step % args.save_every == 0 and manager.participating_rank() == 0:
            save(args.checkpoints, step, state_dict(), manager.state_dict())
    emit({"event": "done", "step": manager.current_step(), "fingerprint": fingerprint(model)})
    manager.shutdown(wait=False)
    return 0


def state_functions(model: nn.Module, optim: torch.optim.Optimizer) -> tuple[Any, Any]:
    """The Manager's `state_dict` and `load_state_dict`: what a healing group gets from a
    peer, and what the durable files hold (besides the manager's own step)."""

    def state_dict() -> dict[str, Any]:
        return {"model": model.state_dict(), "optim": optim.state_dict()}

    def load_state_dict(state: dict[str, Any]) -> None:
        model.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])

    return state_dict, load_state_dict


def resume(directory: Path, load: Any, manager: Any) -> str | None:
    """The newest durable file, loaded into the model, optimizer and manager (None: none)."""
    step = newest_plain_step([p.name for p in directory.glob("step-*.pt")])
    if step is None:
        return None
    path = directory / f"step-{step}.pt"
    state = torch.load(path, weights_only=True)
    load(state["user"])
    manager.load_state_dict(state["torchft"])
    return path.name


def save(directory: Path, step: int, user: dict[str, Any], torchft: dict[str, int]) -> None:
    tmp = directory / f".step-{step}.pt.tmp"
    torch.save({"user": user, "torchft": torchft}, tmp)
    os.replace(tmp, directory / f"step-{step}.pt")


if __name__ == "__main__":
    sys.exit(main())
