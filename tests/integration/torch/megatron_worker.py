"""A small tensor-parallel training loop checkpointed by Megatron Core's
``dist_checkpointing`` through ``PublishingDistCheckpoint``, run under ``torchrun`` (gloo,
CPU) by test_megatron_integration.py.

    megatron_worker.py ROOT OUT_DIR

``parallel_state`` with tensor parallelism over every process (``TP`` = the world size):
a two-layer MLP whose first layer is split by rows (column-parallel) and second by columns
(row-parallel), the partial outputs summed by an autograd-aware all-reduce; SGD with
momentum; 16 steps, saved every 4 (and at the end) with ``keep_last=2``. The weights and
the momentum buffers are Megatron ``ShardedTensor``s at their global offsets; the step's
batch is drawn from the step (every TP rank sees the same rows). ``KILL_AT=N``: after step N
every rank writes its pid into ``OUT_DIR/at-kill-<rank>`` and sleeps. ``STOP_AFTER_RESTORE=1``:
report right after the restore and train nothing. At the end every rank writes
``OUT_DIR/rank-<r>.json`` (the step restored, the skipped steps, each step's loss, its
shards at every save and at the end, as lists) and rank 0 ``OUT_DIR/final.pt``.

On a machine without CUDA, Megatron Core 0.16.1's save calls ``torch.cuda.synchronize()``
(``strategies/filesystem_async.py``, ``preload_tensors``, with ``non_blocking=True`` fixed)
and ``torch.cuda.current_device()`` (``strategies/state_dict_saver.py``, the finalize step's
failure flag); both are replaced by CPU no-ops here, before Megatron is imported. Nothing
else of Megatron is changed. (``torch.distributed.nn.functional.all_reduce`` warns that it
is deprecated: it is still the one that carries gradients back.)
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

TOTAL, SAVE_EVERY, HIDDEN, IN = 16, 4, 16, 8


def main(root: str, out: Path) -> int:
    # imported here, not at the top: the Manager process Megatron's save spawns imports this
    # module again, and would pay for torch and Megatron (seconds) for nothing
    import torch
    import torch.distributed as dist

    torch.cuda.synchronize = lambda *args, **kwargs: None  # type: ignore[assignment]
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]

    from megatron.core import parallel_state
    from megatron.core.dist_checkpointing import ShardedTensor
    from torch.distributed.nn.functional import all_reduce

    from rtj_shim.integrations.megatron import PublishingDistCheckpoint

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=world)
    tp = parallel_state.get_tensor_model_parallel_rank()
    torch.manual_seed(0)  # the full weights, the same on every rank; each keeps its part
    full_w1, full_w2 = torch.randn(HIDDEN, IN) * 0.3, torch.randn(1, HIDDEN) * 0.3
    part = HIDDEN // world
    params = {
        "w1": full_w1[tp * part : (tp + 1) * part].clone().requires_grad_(),
        "w2": full_w2[:, tp * part : (tp + 1) * part].clone().requires_grad_(),
    }
    opt = torch.optim.SGD(list(params.values()), lr=0.05, momentum=0.9)

    def buffers() -> dict[str, torch.Tensor]:
        return {n: opt.state[p].get("momentum_buffer", torch.zeros_like(p))
                for n, p in params.items()}  # fmt: skip

    def sharded() -> dict[str, Any]:
        """Each tensor at its global offset: w1 split along rows, w2 along columns."""
        axes = {"w1": 0, "w2": 1}
        out: dict[str, Any] = {}
        for name, tensor in {**params, **{f"m_{n}": b for n, b in buffers().items()}}.items():
            axis = axes[name.removeprefix("m_")]
            out[name] = ShardedTensor.from_rank_offsets(name, tensor.detach(), (axis, tp, world))
        return out

    ckpt = PublishingDistCheckpoint(root, keep_last=2)
    step, loaded = ckpt.restore(sharded())
    if loaded is not None:
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(loaded[name])
        for name, p in params.items():
            opt.state[p]["momentum_buffer"] = loaded[f"m_{name}"].clone()

    def shards() -> dict[str, Any]:
        """This rank's weights and momentum, as exact lists."""
        mine = {n: p.detach() for n, p in params.items()}
        mine |= {f"m_{n}": b for n, b in buffers().items()}
        return {n: t.tolist() for n, t in mine.items()}

    losses: dict[int, float] = {}
    saved: dict[int, dict[str, Any]] = {}
    kill_at = int(os.environ.get("KILL_AT", "0"))
    while step < TOTAL and not os.environ.get("STOP_AFTER_RESTORE"):
        step += 1
        g = torch.Generator().manual_seed(step)  # this step's rows, the same on every TP rank
        x = torch.randn(8, IN, generator=g)
        y = torch.sin(x.sum(dim=1, keepdim=True))
        hidden = torch.relu(x @ params["w1"].T)  # this rank's hidden units
        out_ = all_reduce(hidden @ params["w2"].T) if world > 1 else hidden @ params["w2"].T
        loss = torch.nn.functional.mse_loss(out_, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses[step] = loss.item()
        if step % SAVE_EVERY == 0 or step == TOTAL:
            ckpt.save(step, sharded())
            saved[step] = shards()
        if step == kill_at:
            (out / f"at-kill-{rank}").write_text(str(os.getpid()))
            time.sleep(600)
    resumed = ckpt.resumed
    report = {
        "restored": 0 if resumed is None else resumed.step,
        "skipped": [] if resumed is None else [list(s) for s in resumed.skipped],
        "losses": losses,
        "params": shards(),
        "saved": saved,
    }
    (out / f"rank-{rank}.json").write_text(json.dumps(report))
    if rank == 0:
        torch.save({n: p.detach() for n, p in params.items()}, out / "final.pt")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":  # required: Megatron's save spawns a Manager, which imports __main__
    # a plain exit (not os._exit): the interpreter's finalizers stop that Manager, which
    # otherwise outlives the rank holding its stdout
    sys.exit(main(sys.argv[1], Path(sys.argv[2])))
