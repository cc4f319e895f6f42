"""The simulated ranks of the hang-detection bench (pure): a synchronous job's steps in
sections, what each rank's progress record holds at any moment, a frozen rank and the
others waiting for it in the next collective, and the `GET /progress` body of a pod."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rtj_shim.agent.progress_report import rank_json
from rtj_shim.wire.progress_record import Record

PHASES = (("data", 0.05), ("forward", 0.30), ("backward", 0.40), ("allreduce", 0.15),
          ("optimizer", 0.10))  # fmt: skip
"""One synchronous step: its sections and their shares of the step time."""
WAIT = 3  # the PHASES index of the collective every rank waits in


@dataclass(frozen=True)
class Sim:
    t0_ns: int  # CLOCK_MONOTONIC when step `base_step` began
    step_ns: int
    wall_offset_ns: int = 0  # time.time_ns() - time.monotonic_ns()
    ranks_per_pod: int = 8
    base_step: int = 100


@dataclass(frozen=True)
class Freeze:
    rank: int
    at_ns: int


def address(pod: int) -> str:
    """The loopback address standing in for pod `pod`'s IP."""
    return f"127.3.{pod // 250}.{pod % 250 + 1}"


def pod_name(pod: int) -> str:
    return f"hang-a1-worker-0-{pod}-sim"


def _edge_ns(sim: Sim, index: int) -> int:
    return sum(int(frac * sim.step_ns) for _, frac in PHASES[:index])


def _offset_ns(rank: int) -> int:
    return (rank * 7919) % 1000 * 10_000  # ranks start their steps 0-10 ms apart


def phase_at(sim: Sim, rank: int, t_ns: int) -> tuple[int, int, int]:
    """(steps since base_step, PHASES index, when that section began) of `rank` at `t_ns`."""
    k, within = divmod(t_ns - sim.t0_ns - _offset_ns(rank), sim.step_ns)
    index = max(i for i in range(len(PHASES)) if _edge_ns(sim, i) <= within)
    return k, index, t_ns - within + _edge_ns(sim, index)


def stop_ns(sim: Sim, rank: int, freeze: Freeze | None) -> int | None:
    """When `rank` stops making progress: the frozen rank at the freeze, every other one
    when it enters the next collective (where it waits for the frozen one)."""
    if freeze is None or rank == freeze.rank:
        return None if freeze is None else freeze.at_ns
    k, index, _ = phase_at(sim, freeze.rank, freeze.at_ns)
    k += 1 if index >= WAIT else 0
    return sim.t0_ns + _offset_ns(rank) + k * sim.step_ns + _edge_ns(sim, WAIT)


def rank_record(sim: Sim, rank: int, now_ns: int, freeze: Freeze | None = None) -> Record:
    """The record `rank`'s trainer would hold at `now_ns`: a full ring of step times
    (+-1%), the allreduce as its waiting time, no checkpoint yet."""
    stop = stop_ns(sim, rank, freeze)
    k, index, since = phase_at(sim, rank, now_ns if stop is None else min(now_ns, stop))
    ring = tuple(int(sim.step_ns * (1 + ((rank * 31 + j * 17) % 21 - 10) / 1000))
                 for j in range(16))  # fmt: skip
    waits = tuple(int(s * PHASES[WAIT][1]) for s in ring)
    local, step = rank % sim.ranks_per_pod, sim.base_step + k
    return Record(
        seq=2 * (k * len(PHASES) + index) + 2, rank=rank, local_rank=local, pid=100 + local,
        restart=0, state=1, step=step, steps_completed=step,
        started_ns=max(1, sim.t0_ns - sim.base_step * sim.step_ns), section_started_ns=since,
        updated_ns=since, updated_wall_ns=since + sim.wall_offset_ns,
        step_done_ns=since - _edge_ns(sim, index), last_step_ns=ring[-1], last_wait_ns=waits[-1],
        last_checkpoint_ns=0, max_checkpoint_ns=0, checkpoints=0, section=PHASES[index][0],
        step_ns=ring, wait_ns=waits,
    )  # fmt: skip


def pod_body(sim: Sim, pod: int, now_ns: int, freeze: Freeze | None = None) -> dict[str, Any]:
    """Pod `pod`'s `GET /progress`, in the shape of the product server's `report()`."""
    ranks = range(pod * sim.ranks_per_pod, (pod + 1) * sim.ranks_per_pod)
    return {"schema": 1, "pod_wall_time": round((now_ns + sim.wall_offset_ns) / 1e9, 6),
            "hostname": pod_name(pod), "errors": [],
            "ranks": [_with_milestones(sim, rank_json(rank_record(sim, r, now_ns, freeze), now_ns))
                      for r in ranks]}  # fmt: skip


def _with_milestones(sim: Sim, entry: dict[str, Any]) -> dict[str, Any]:
    """The rank's start-up milestones, as the product server adds them: its process
    restored `base_step` and completed the next one, one step after the simulation's start."""
    first = (sim.t0_ns - (sim.base_step - 1) * sim.step_ns + sim.wall_offset_ns) / 1e9
    marks = {"restored": {"at": first - sim.step_ns / 1e9, "step": sim.base_step},
             "first_step": {"at": first, "step": sim.base_step + 1}}  # fmt: skip
    return {**entry, "milestones": marks}


def freeze_point(sim: Sim, rank: int, after_ns: int) -> int:
    """The middle of `rank`'s `forward` in the first step it starts after `after_ns`."""
    k = phase_at(sim, rank, after_ns)[0] + 1
    start = sim.t0_ns + _offset_ns(rank) + k * sim.step_ns
    return start + _edge_ns(sim, 1) + int(PHASES[1][1] * sim.step_ns) // 2
