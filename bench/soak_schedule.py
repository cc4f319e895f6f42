"""The soak's fault schedule: seeded, exponential inter-arrival times, a fault mix. Pure.

A schedule is a list of `Fault(at, kind, rank)`: `at` seconds after training started, drawn
as a Poisson process of rate 1 / `mtbf` (exponential gaps), each fault's kind drawn from
`mix` (weights) and its rank uniformly. A fault too close to the previous one (inside
`min_gap`: the job is still recovering) is pushed back to it, so every fault hits a
training world and each recovery can be measured on its own. `caps` bounds how often a
kind may occur (a GPU fault quarantines its node for good: with few nodes the run would
run out of them).

`preemption` is the one kind that needs no rank (Kueue evicts the whole workload): it still
draws one, so every kind consumes the generator alike.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass

KINDS = (
    "rank_killed", "gpu_xid", "hang", "eviction", "corrupt_newest", "node_lost", "preemption",
    "sdc", "bad_node",
)  # fmt: skip
"""What the harness knows how to inject on pod-runner nodes:

- rank_killed: SIGKILL of one rank's training process (the pod fails, torchrun reports it);
- gpu_xid: the node's GPU agent reports XID 79 and the rank's process dies (quarantine);
- hang: SIGSTOP of one rank's training process (every pod stays Running);
- eviction: the Eviction API on one worker pod (SIGTERM, an emergency save);
- corrupt_newest: a byte of the newest committed step flipped in the store, then a rank
  killed: the pinned step fails verification and an older one is used;
- node_lost: the rank's node loses power silently (the pod runner kills its processes and
  stops renewing its Lease; its pods stay Running in the API): found from the stale Lease;
- preemption: a more urgent workload (a higher WorkloadPriorityClass) arrives in the job's
  ClusterQueue needing all its quota, and Kueue itself evicts the job's Workload; the
  urgent one leaves after a short hold and the job is admitted again;
- sdc: silent data corruption: one bit of the rank's weights flips (its "GPU" computes
  wrong; the example trainer reads a file its pod is given, ``--fault-flip-file``) and the
  rank goes on training. Not in the default mix (the published seeds draw as before): name
  it in ``--mix``.
- bad_node: the rank's node goes bad for good (a GPU that fails every process touching it,
  unseen by its agent: no XID, no condition): its trainer dies at once, and so does every
  trainer started on that node afterwards, within half a second; the platform's preflight
  node check fails there (as ``dcgmi diag -r 1`` would). Not in the default mix: name it.
"""

DEFAULT_MIX: Mapping[str, float] = {
    "rank_killed": 0.25,
    "gpu_xid": 0.1,
    "hang": 0.25,
    "eviction": 0.15,
    "corrupt_newest": 0.15,
    "node_lost": 0.1,
    "preemption": 0.15,
}


@dataclass(frozen=True)
class Fault:
    at: float
    """Seconds after the first training step."""
    kind: str
    rank: int


def schedule(
    seed: int,
    duration: float,
    mtbf: float,
    *,
    ranks: int,
    mix: Mapping[str, float] = DEFAULT_MIX,
    caps: Mapping[str, int] | None = None,
    min_gap: float = 45.0,
    first_after: float = 20.0,
) -> list[Fault]:
    """Faults within `duration` seconds (the last no later than `duration - min_gap`)."""
    if mtbf <= 0 or duration <= 0 or ranks < 1:
        raise ValueError("mtbf, duration and ranks must be positive")
    unknown = set(mix) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown fault kinds in the mix: {sorted(unknown)}")
    rng = random.Random(seed)
    kinds = [k for k in KINDS if mix.get(k, 0) > 0]
    weights = [float(mix[k]) for k in kinds]
    left = dict(caps or {})
    out: list[Fault] = []
    at = first_after
    while True:
        at += rng.expovariate(1.0 / mtbf)
        if out:
            at = max(at, out[-1].at + min_gap)
        if at > duration - min_gap:
            return out
        allowed = [(k, w) for k, w in zip(kinds, weights, strict=True) if left.get(k, 1) > 0]
        if not allowed:
            return out
        kind = rng.choices([k for k, _ in allowed], weights=[w for _, w in allowed])[0]
        if kind in left:
            left[kind] -= 1
        out.append(Fault(round(at, 3), kind, rng.randrange(ranks)))
