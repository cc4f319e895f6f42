"""A torchrun worker (2 ranks, gloo) for the placement tests of plain state.

Writes ``<out>/rank-<r>.json`` with what it observed; the test reads it. Phases:

1. a per-rank value saved replicated is refused on every rank, naming it;
2. the same value named ``rank_local`` saves; replicated values beside it are saved once;
3. ``peek()`` gives every rank the replicated values (not the rank-local one);
4. a restore on the same world size gives every rank its own value back.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from rtj_shim.torch import Checkpointer, CheckpointError, init_process_group


def state(rank: int) -> dict[str, Any]:
    torch.manual_seed(0)
    return {
        "model": nn.Linear(2, 2),
        "epoch": 3,
        "meta": {"config": {"hidden": 64}, "tokens": 1234},
        "batch": torch.full((2,), float(rank)),  # differs between ranks
    }


def main(root: str, out: Path) -> int:
    init_process_group("gloo")
    rank = dist.get_rank()
    seen: dict[str, Any] = {"rank": rank}
    try:
        Checkpointer(root).save(1, state(rank))
        seen["replicated_batch"] = "saved"
    except CheckpointError as exc:
        seen["replicated_batch"] = str(exc)
    Checkpointer(root, rank_local=("batch",)).save(2, state(rank))
    fresh: dict[str, Any] = {"model": nn.Linear(2, 2), "epoch": 0, "meta": {}, "batch": None}
    ckpt = Checkpointer(root, rank_local=("batch",))
    info = ckpt.peek()  # collective: rank 0 reads, every rank gets the values
    assert info is not None
    seen["peek"] = {
        "step": info.step,
        "meta": info.values["meta"],
        "has_batch": "batch" in info.values,
    }
    seen["restored_step"] = ckpt.restore(fresh)
    seen["batch"] = fresh["batch"].tolist()
    seen["epoch"] = fresh["epoch"]
    seen["meta"] = fresh["meta"]
    (out / f"rank-{rank}.json").write_text(json.dumps(seen))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], Path(sys.argv[2])))
