"""The checkpointing a careful user writes without the shim (the goodput soak's JobSet
baseline, ``bench/goodput_baseline.py``, runs ``examples/ddp_train.py
--plain-checkpoints DIR``): rank 0 saves the whole training state with plain
``torch.save`` to ``DIR/step-N.pt`` (a temporary name, then a rename), every rank resumes
from the highest-numbered file present, nothing is verified."""

from __future__ import annotations

import os
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

PLAIN_FILE = re.compile(r"^step-(\d+)\.pt$")


def newest_plain_step(names: list[str]) -> int | None:
    """The highest step among ``step-N.pt`` names (temporary and other files ignored)."""
    steps = [int(m.group(1)) for n in names if (m := PLAIN_FILE.match(n))]
    return max(steps, default=None)


@dataclass(frozen=True)
class PlainRestore:
    source: str
    skipped: tuple[tuple[int, str], ...] = ()
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class PlainSave:
    step: int
    seconds: float


class PlainCheckpoints:
    """The checkpointing a careful user writes without the shim; the Checkpointer's methods
    that ``main`` calls. Every object with ``state_dict`` is saved through it, anything else
    as it is; each rank's RNGs are gathered to rank 0 (dropout differs per rank) and put
    back on the same rank. The file is trusted as it is: no checksum, no fallback."""

    def __init__(
        self, directory: Path, every: int, rank: int, world: int, heartbeats: bool = False
    ) -> None:
        """`heartbeats`: send NVRx's rank heartbeat at every step boundary (`NvrxHeartbeats`:
        the trainer runs under its ``ft_launcher``)."""
        self.dir, self.every, self.rank, self.world = directory, every, rank, world
        self.last_restore: PlainRestore | None = None
        self.last_save: PlainSave | None = None
        self.heartbeats = NvrxHeartbeats() if heartbeats else None
        self.dir.mkdir(parents=True, exist_ok=True)

    def _rng(self) -> list[Any]:
        # the trainer draws from torch's and Python's generators (NumPy's: never)
        mine = {"torch": torch.get_rng_state(), "python": random.getstate()}
        if self.world == 1:
            return [mine]
        every: list[Any] = [None] * self.world
        dist.all_gather_object(every, mine)
        return every

    def restore(self, objects: dict[str, Any]) -> int:
        step = newest_plain_step([p.name for p in self.dir.iterdir()])
        if step is None:
            self.last_restore = PlainRestore("fresh")
            return 0
        path = self.dir / f"step-{step}.pt"
        # weights_only=True: the state is tensors, numbers, strings and containers of them
        # (Python's RNG state is a tuple of ints), all of which the safe unpickler allows
        state = torch.load(path, map_location="cpu", weights_only=True)
        for name, obj in objects.items():
            saved = state["objects"][name]
            if hasattr(obj, "load_state_dict"):
                obj.load_state_dict(saved)
            else:
                objects[name] = saved
        rng = state["rng"][self.rank]
        torch.set_rng_state(rng["torch"])
        random.setstate((rng["python"][0], tuple(rng["python"][1]), rng["python"][2]))
        self.last_restore = PlainRestore(str(path))
        return int(state["step"])

    def save(self, step: int, objects: dict[str, Any], **_: Any) -> None:
        started = time.perf_counter()
        rng = self._rng()  # collective: every rank, before rank 0 writes
        if self.rank == 0:
            state = {
                "step": step,
                "objects": {
                    n: o.state_dict() if hasattr(o, "state_dict") else o for n, o in objects.items()
                },
                "rng": rng,
            }
            tmp = self.dir / f".step-{step}.pt.tmp"
            torch.save(state, tmp)
            os.replace(tmp, self.dir / f"step-{step}.pt")
        self.last_save = PlainSave(step, time.perf_counter() - started)

    def step_boundary(self, step: int, objects: dict[str, Any], **kw: Any) -> None:
        if step % self.every == 0:
            self.save(step, objects, **kw)
        if self.heartbeats is not None:
            self.heartbeats.beat()

    def wait(self) -> None:
        pass

    def close(self) -> None:
        if self.heartbeats is not None:
            self.heartbeats.close()


class NvrxHeartbeats:
    """NVIDIA Resiliency Extension's rank monitor client, as its fault-tolerance guide has a
    training loop use it (``nvidia_resiliency_ext.fault_tolerance.RankMonitorClient``): a
    heartbeat every iteration; ``ft_launcher``'s rank monitor judges a rank that sends none
    within ``--ft-rank-heartbeat-timeout`` (the first within the initial timeout) hung, and
    restarts the worker group in the job (the goodput soak's NVRx baseline)."""

    def __init__(self) -> None:
        from nvidia_resiliency_ext import fault_tolerance as ft

        self.client = ft.RankMonitorClient()
        self.client.init_workload_monitoring()

    def beat(self) -> None:
        self.client.send_heartbeat()

    def close(self) -> None:
        self.client.shutdown_workload_monitoring()
