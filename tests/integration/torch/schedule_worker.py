"""A torchrun worker (2 ranks, gloo): save decisions every rank shares without user code.

Writes ``<out>/rank-<r>.json``: the steps at which ``step_boundary()`` saved on this rank.

1. every_seconds, no metric monitored (the agreement one boundary late): only rank 1's
   interval has passed (rank 0's is an hour); the flag is reduced over ranks and acted on at
   the next boundary, so both save at steps 2 and 4: the flag raised at a boundary that
   saved is dropped (that save reset the interval);
2. save if improved (monitor=, the agreement synchronous): only rank 0 evaluates (rank 1
   passes None); both save when rank 0's metric improved, at that step, and only then;
3. as 1, with steps longer than the lag's limit (made 0.05 s here, the steps 0.1 s): the
   reductions of boundaries 2, 3 and 4 carry long steps, so at the fifth both ranks end the
   lag and act on that boundary's own flag: saves at 2 and 4 (lagged), then 5, 6, 7, 8.
   (1 and 3 reduce at every boundary: `AGREE_PERIOD_S` 0.)
4. as 1, reducing only every few boundaries (`AGREE_PERIOD_S` made endless, `MAX_CADENCE`
   4): the first two boundaries reduce (the second takes the first's result, whose step time
   is unknown: cadence 1), then every fourth. Boundaries in between do no collective and
   decide nothing but the schedule's steps; the reductions at 1, 2, 3, 7, 11, 15, 19 act on
   the one before, each raised-then-saved flag dropped: saves at 2, 7 and 15.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from rtj_shim.torch import Checkpointer, agreement, init_process_group


def main(root: Path, out: Path) -> int:
    init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    state: dict[str, Any] = {"model": nn.Linear(2, 2), "epoch": 0}
    seen: dict[str, list[int]] = {"time": [], "metric": []}

    agreement.AGREE_PERIOD_S = 0.0  # a reduction at every boundary (cases 1 to 3)
    timed = Checkpointer(root / "time", every_seconds=3600.0 if rank == 0 else 1e-9)
    for step in range(1, 6):
        if timed.step_boundary(step, state) is not None:
            seen["time"].append(step)

    scored = Checkpointer(root / "metric", monitor="val_loss", mode="min")
    metrics = {1: 0.5, 2: 0.6, 3: 0.4, 4: 0.4}
    for step in range(1, 5):
        metric = metrics[step] if rank == 0 else None  # a rank-0-only evaluation
        if scored.step_boundary(step, state, metric=metric) is not None:
            seen["metric"].append(step)

    agreement.LAGGED_MAX_STEP_S = 0.05
    slow = Checkpointer(root / "slow", every_seconds=3600.0 if rank == 0 else 1e-9)
    seen["slow"] = []
    for step in range(1, 9):
        if slow.step_boundary(step, state) is not None:
            seen["slow"].append(step)
        time.sleep(0.1)

    agreement.AGREE_PERIOD_S, agreement.MAX_CADENCE = 1e9, 4
    agreement.LAGGED_MAX_STEP_S = 1e9
    sparse = Checkpointer(root / "sparse", every_seconds=3600.0 if rank == 0 else 1e-9)
    seen["sparse"] = []
    for step in range(1, 21):
        if sparse.step_boundary(step, state) is not None:
            seen["sparse"].append(step)

    (out / f"rank-{rank}.json").write_text(json.dumps(seen))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
