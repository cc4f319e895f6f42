"""The goodput model's inputs (bench/goodput_model.py): published failure rates, what the
benches measured, what is assumed, each named with where it comes from. The fast tier's
terms are medians of bench/results/fast-tier.md at its largest model, projected per byte to
`RANK_STATE_BYTES` (`per_byte`); the peer replica's copies run `COPY_STREAMS` ranks of a pod
at once, as `rtj_shim.fast.peer_pull` does (`copy_rounds`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from rtj_shim.fast import peer_pull

LLAMA3_INTERRUPTIONS = 419
LLAMA3_DAYS = 54
LLAMA3_GPUS = 16_384
"""Llama 3 pre-training: 419 unexpected interruptions in 54 days on 16,384 GPUs, 78%
hardware (The Llama 3 Herd of Models, 2024, section 3.3.4 and Table 5)."""

FAULT_MIX: Mapping[str, float] = {
    "crash": 0.75,
    "hang": 0.10,
    "silent_node_loss": 0.075,
    "planned": 0.075,
}
"""How interruptions show themselves, grouped from Llama 3's Table 5: GPU, HBM and SRAM
faults and software bugs mostly end the process (crash); network switch/cable/NIC faults
and NCCL watchdog timeouts stall a collective (hang); power, chassis, CPU, memory and SSD
failures take the host down without a word (silent node loss); host maintenance comes
with notice (planned). A modelling assumption: the table names causes, not symptoms."""


GPU_SHARE = 0.587
"""GPU issues (NVLink included) among Llama 3's 419 unexpected interruptions (58.7%): they
implicate the node (quarantine, replacement), so no restart in place cures them."""

IN_PLACE_SHARE: Mapping[str, float] = {
    "crash": round(1 - GPU_SHARE / FAULT_MIX["crash"], 3),
    "hang": 1.0,
    "silent_node_loss": 0.0,
    "planned": 0.0,
}
"""Per symptom, the share that restarts in place with every pod's memory intact, as the
operator decides (`IN_PLACE_CLASSES`: a process that died or hung, a collective that broke):
the crashes that are not GPU faults (software bugs and the like: 1 - 0.587 / 0.75), every
hang (a stalled collective; the processes restart in their pods). A lost node and host
maintenance take the node away."""

REPLACE_SHARE: Mapping[str, float] = {
    "crash": round(1 - IN_PLACE_SHARE["crash"], 3),
    "silent_node_loss": 1.0,
}
"""Per symptom, the share whose faulty or lost node's pod is replaced while the others
restart in place (the operator's `REPLACE_CLASSES`: a GPU fault, a lost node): the crashes
that are GPU faults (0.587 / 0.75), every silent node loss. The replaced pod's memory is
gone: without a peer replica it resumes from the durable tier (costed as the whole-world
path); with one, from the fast step its holder copied. An eviction (host maintenance) also
replaces only the evicted pod from restart in place on, but after the world's emergency save:
`Stack.planned`."""

SOAK_SAVE_EVERY, SOAK_FAST_EVERY = 100, 10
"""The goodput soak's durable and fast-tier intervals (bench.goodput: `save_every`,
`--fast-every`): the fast tier saves 10 times as often as the durable one."""

KWOK_SPARE_RECOVERY: tuple[tuple[int, float], ...] = (
    (9, 1.64 - 1.03), (129, 1.67 - 0.75), (1251, 10.53 - 2.53),
)  # fmt: skip
"""Measured (bench.in_place_scale, bench/results/in-place-scale.md, KWOK, stand-in sidecars,
2026-12-03 09:40-09:53 on 2 CPUs): pods (workers and a spare) -> seconds from the restart's
`detectedAt` to `startedAt` (every pod runs the new generation, the spare serving the GPU
fault's rank): the quarantine pass and the operator's barrier rounds. The other 1,251-pod
readings that day: 9.78 - 1.61 and 8.61 - 2.32 s (the slowest of the three is used)."""


IN_PLACE_RECOVERY = round(KWOK_SPARE_RECOVERY[-1][1], 1)
"""The in-place restart's control plane, fault seen to every pod running the new generation,
at 1,251 pods on KWOK (KWOK_SPARE_RECOVERY): the projected job's own scale (1,250 pods of 8
ranks), as the whole-world paths below. At 2 pods the goodput soak's seven restarts took
0.54-1.61 s (mean 1.2 s); the same barrier with no spare costs the same rounds."""

WHOLE_WORLD_SCALE: Mapping[str, tuple[tuple[int, float], ...]] = {
    "operator": ((8, 1.69 - 1.0), (128, 18.65 - 1.0), (1250, 262.08 - 1.0)),
    "jobset": ((8, 2.63), (128, 19.83), (1250, 197.31)),
}
"""Measured (bench.operator_scale --jobs 1 --faults 1 --stagger 0, KWOK, 2026-12-03
13:06-13:27 on 2 CPUs; bench/results/recovery-cost.md): workers -> seconds from the failed
pod's Failed status to every pod of the next world Running, the whole world re-created: the
operator (less its 1 s back-off) and JobSet's `RestartJobSet` (BlockingRecreate; at 1,250 its
restart decision itself came 128 s after the failure: the Job controller ends the other
1,249 pods before it marks the Job failed). 1,250 workers: the old pods took 140 s to go
after the operator had them all marked deleting (the Job controller's and garbage
collector's finalizer removal), the next world's pods 89 s to be scheduled and run."""

WHOLE_WORLD_RECOVERY = WHOLE_WORLD_SCALE["operator"][-1][1]
"""The operator's whole-world control plane at the projected job's scale (1,250 pods)."""
JOBSET_RECOVERY = WHOLE_WORLD_SCALE["jobset"][-1][1]
"""JobSet's `RestartJobSet` at the projected job's scale, failure to every pod Running."""

SPARE_RECOVERY = IN_PLACE_RECOVERY
"""The same with a warm spare taking the replaced pod's rank (the KWOK trials' case; 1.63-
1.70 s on the pod runner with 2 pods, bench/results/in-place-spares.md, against 12.1-13.9 s
when the Job creates the replaced pod again, its 10 s back-off)."""

IN_PLACE_STARTUP = 20.0
"""Assumed, not measured at scale: the trainer's restart inside its pod. No scheduling, image
or container start, but the process starts again (framework import, CUDA context, NCCL
communicators): in the soak, 4-8 s from every pod running the new generation to the first
step on 2 CPUs (gloo), which says nothing of NCCL initialisation at 10k ranks. The recovery
ledger's breakdown of the same span (bench/results/recovery-ledger.md, no warm interpreter,
loaded machine): 11.5-20.7 s, of which the trainer's start to its process group 10.5-18.8 s,
the restore 0.9-1.8 s, the first step 0.06-0.10 s."""

PRELOAD_SAVING = 3.15 + 3.78
"""Measured (2026-12-01, this machine alone, medians of 3): what a warm standby interpreter
(spec.recovery.inPlacePreload) spares a restarted trainer: torchrun's own import
(`python -c "import torch.distributed.run"`: 2.55, 3.21, 3.15 s) and the worker's (`import
torch, rtj_shim.torch`: 3.58, 3.78, 3.90 s). Taken off IN_PLACE_STARTUP. Under load it is
more: bench/results/in-place-spares.md, 2 trainers on 2 CPUs, saw 14.3 -> 3.9 s."""

MiB = float(1 << 20)
RANK_STATE_BYTES = 4e9
"""Llama 3: each GPU's checkpointed state is 1 MB to 4 GB; the largest, assumed."""
RANKS_PER_POD = 8
"""10,000 GPUs on 1,250 nodes, one pod of 8 ranks per node (`COMMON_STARTUP`)."""
WORLD_PODS = 1250
"""The 10,000-GPU job's pods (one per node): what a warm spare's idle GPUs are a share of."""

MEASURED_STATE = 573.7 * MiB
"""bench/results/fast-tier.md, the largest model measured (50.1M parameters, AdamW):
573.7 MiB of state. Every fast-tier term below is its median there, scaled per byte; the
save's stall and whole cost from the run of 2026-12-01 14:09 UTC, the restores and copies
from the run of 07:10 UTC."""
FAST_SAVE_STALLS: tuple[tuple[float, float], ...] = (
    (0.1 * MiB, 1.7e-3),
    (11.7 * MiB, 1.7e-3),
    (287.3 * MiB, 1.9e-3),
    (MEASURED_STATE, 2.1e-3),
)
"""Measured (bench/results/fast-tier.md, section 1): the training thread's stall per fast
save, staged and written in the background (the capture, the copies of what the next
forward and backward may change into reused host buffers, the fence's wait at the next
`optimizer.step()`), by state size: 1.7, 1.7, 1.9 and 2.1 ms (medians, 8 rounds each; 0.8 ms
at 11.7 to 573.7 MiB in the run of 07:10, before the writer thread wrote its small files
itself and so holds the GIL more while the next capture runs)."""
FAST_SAVE_WHOLE_COSTS: tuple[tuple[float, float], ...] = (
    (0.1 * MiB, 18.9e-3),
    (11.7 * MiB, 29.9e-3),
    (287.3 * MiB, 275.3e-3),
    (MEASURED_STATE, 609.1e-3),
)
"""Measured (bench/results/fast-tier.md, section 1, 'its whole cost to training'): the
saving `step_boundary` less a non-saving one, plus the steps trained until the step is
published less as many plain steps. The writer thread's Python (pickling, manifest, commit,
retention) holds the GIL the training thread needs; on this 2-core CPU trainer its hashing
and copying (GIL released) also take the cores the trainer's two torch threads use."""
FAST_WRITER_GIL = FAST_SAVE_WHOLE_COSTS[0][1] - FAST_SAVE_STALLS[0][1]
"""The writer thread's GIL-held work per fast save beyond the stall, 17.2 ms: the whole cost
at the smallest state (0.1 MiB: no hashing or copying to speak of, all fixed Python work)
less its stall. Assumed fixed in the state's size: it grows with the number of tensors
pickled, not their bytes (the 50.1M model has 8 parameter tensors; an LLM shard of 4 GB has
hundreds)."""
FAST_WRITTEN = 0.6470
"""Measured: a fast step is published 647.0 ms after its `step_boundary` (573.7 MiB; the
writer thread's serialization, SHA-256 and publish; 844.0 ms in the run before). A step due
meanwhile is skipped."""
FAST_KEEP = 2
"""Fast steps each rank keeps (`spec.checkpoint.fastTier.keep`, its default and least)."""
FAST_RESTORE_MEASURED = 0.3007
"""Measured (section 2): a restarted trainer's restore from the fast tier, deep-verified,
573.7 MiB: 300.7 ms (17.8 ms at 11.7 MiB, 160.4 ms at 287.3 MiB: nearly per byte; 281.1 ms
in the run before)."""
BUDDY_COPY_BACK_MEASURED = 0.5505
"""Measured (section 2, from a buddy): one rank's copy-back of its fast step from the holder's
replica (`peer_pull.fetch_back`: loopback HTTP between two sidecars, hashed as written, under
the commit protocol, into an empty fast tier), 573.7 MiB: 550.5 ms (22.7 ms at 11.7 MiB,
256.9 ms at 287.3 MiB; ~1.0 GiB/s from 287.3 MiB on; 511.0 ms in the run before). Then the
restore from the copy: 851.1 ms in all."""
BUDDY_REPLICATION_MEASURED = 0.5261
"""Measured (section 2, from a buddy): the holder's copy of one rank's fast step from the
source's sidecar (`ReplicaPuller.pull_once`, its retention included), 573.7 MiB: 526.1 ms
(21.7 ms at 11.7 MiB, 259.3 ms at 287.3 MiB; 523.6 ms in the run before)."""
S3_RESTORE_MEASURED = 1.37
"""Measured (section 2): the durable S3 restore (loopback moto, deep), 573.7 MiB: 1.37 s
(1.35 s in the run before). What the previous version of this model assumed each rank's
copy took, the ranks one after another (9.18 s a rank x 8 = 73.4 s a pod)."""
COPY_STREAMS = peer_pull.COPY_STREAMS
"""Ranks a sidecar copies at once (`rtj_shim.fast.peer_pull.COPY_STREAMS`, 4): both the holder's
copy and the copy-back run a pod's ranks in rounds of this many."""


def copy_rounds(ranks: int = RANKS_PER_POD, streams: int = COPY_STREAMS) -> int:
    """The rounds a sidecar's copy of a pod's `ranks` takes, `streams` at a time: a round
    ends with its slowest rank, and the next starts then (8 ranks, 4 at once: 2)."""
    return math.ceil(ranks / max(1, streams))


def per_byte(measured_seconds: float, nbytes: float = RANK_STATE_BYTES) -> float:
    """A figure measured on `MEASURED_STATE`, scaled to `nbytes` in proportion."""
    return measured_seconds * nbytes / MEASURED_STATE


def stall_line() -> tuple[float, float]:
    """The least-squares line through `FAST_SAVE_STALLS`: (seconds, seconds per byte)."""
    xs, ys = [x for x, _ in FAST_SAVE_STALLS], [y for _, y in FAST_SAVE_STALLS]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    return my - slope * mx, slope


FAST_SAVE_STALL = per_byte(FAST_SAVE_STALLS[-1][1])
"""Seconds a fast save stalls training at `RANK_STATE_BYTES`: the largest measured point's
stall charged per byte (2.1 ms x 4 GB / 573.7 MiB). The points are nearly flat (most of the
stall is fixed), so this bounds the line through them (`stall_line`) from above."""
FAST_SAVE_COST = FAST_SAVE_STALL + FAST_WRITER_GIL
"""What a fast save costs training on a GPU node, the model's charge: the stall per byte
plus the writer's GIL-held Python (`FAST_WRITER_GIL`). Assumed: a GPU node's spare cores
(tens per GPU) take the writer's hashing and copying, which release the GIL; a trainer whose
Python thread launches the kernels pays only what holds the GIL."""
FAST_SAVE_COST_CPU = per_byte(FAST_SAVE_WHOLE_COSTS[-1][1])
"""The whole cost measured on this 2-core CPU trainer at its largest state, charged per byte
(609.1 ms x 4 GB / 573.7 MiB = 4.05 s): the bound for a node with no spare cores, where the
writer's hashing and copying take the trainer's own."""
FAST_RESTORE = per_byte(FAST_RESTORE_MEASURED)
"""Each rank reads its own state from pod memory (no network), verifies and loads it."""
FAST_WRITE = per_byte(FAST_WRITTEN)
"""How long a fast step takes to be published: the shortest useful fast interval."""
COPY_BACK_RANK = per_byte(BUDDY_COPY_BACK_MEASURED)
"""One rank's fast step copied back from the holder over HTTP, hashed as it is written."""
REPLICATION_RANK = per_byte(BUDDY_REPLICATION_MEASURED)
"""One rank's fast step copied by the holder from its source (the peer replica's copy)."""
REPLICA_COPY = copy_rounds() * REPLICATION_RANK
"""A pod's fast step copied by its holder's sidecar (`ReplicaPuller.pull_once`), its ranks
`COPY_STREAMS` at a time: 2 rounds of 4 at 8 ranks a pod, each as long as one rank's copy
(assumed: 4 streams at once no slower than one, what `COPY_STREAMS` is sized for; the bench
has one rank on 2 cores, so this is not measured)."""
REPLICA_RESTORE = copy_rounds() * COPY_BACK_RANK + FAST_RESTORE
"""A replaced pod's restore: its fast step copied back from the holder before its trainers
start (`fetch_back`, the same rounds), then the trainers' fast restore (every rank at once)."""

EMERGENCY_SAVE = 30.0
"""Host maintenance comes with notice: SIGTERM, and the trainer's emergency save at the next
step boundary (`spec.checkpoint.emergencySaveSeconds`, 30 s by default; its whole deadline
assumed, as the baseline's blocking save of the same state). The world resumes from that
step: the soak's evictions trained 0 steps again (bench/results/goodput-comparison.md). With
restart in place the other pods' stop gives the save this deadline too
(`policy.in_place.save_grace`: every rank is alive to join it)."""


PREFLIGHT_RING = 0.16
"""Measured (bench/results/preflight-cost.md, `bench.preflight_cost --worlds 2,4,8
--payload-mib 16`, medians of 5 on 2 CPUs): what the preflight's ring transfer adds to a new
world's start, the most of the three worlds (4 pods)."""
PREFLIGHT_NODE_CHECK = 10.0
"""Assumed: the platform's node check, `dcgmi diag -r 1` by default ("quick deployment
checks, normally lasting seconds": NVIDIA's dcgmi-diag reference). Not run here (no GPU)."""
PREFLIGHT = PREFLIGHT_RING + PREFLIGHT_NODE_CHECK
"""Seconds the preflight (`spec.detection.preflight`, on by default) adds to a new pod's
start: the whole world's and a replaced pod's, not a warm spare's (it ran when the spare
started) nor an in-place restart's (its init containers do not run again)."""

BOUNDARY_COST = 0.048e-3
"""Measured (bench/results/boundary-cost.md, 2 gloo ranks on 2 CPUs): the worst rank's
median cost of a step boundary that saves nothing (the progress record, the guard's note of
the loss, the lagged agreement's share)."""
STEP_SECONDS = 5.0
"""Assumed: the projected job's step (a Llama 3 405B-sized step of 16M tokens at 10k GPUs is
several seconds; shorter steps pay the boundary more often, so a short one is assumed)."""
STEP_TAX = BOUNDARY_COST / STEP_SECONDS
"""The fraction of training time the step boundary costs while nothing fails."""

COMMON_STARTUP = 90.0
"""Assumed for both stacks at 1,250 nodes (image cached; CUDA + NCCL init at 10k ranks)."""
COMMON_RESTORE = 5.0
"""Assumed: ~1 GB of shards per node read in parallel from object storage."""
NCCL_TIMEOUT = 600.0
"""The NCCL watchdog's default collective timeout (ProcessGroupNCCL, 10 min)."""


def interruptions_per_hour(gpus: int) -> float:
    """Llama 3's rate, scaled linearly with the GPU count."""
    per_gpu_hour = LLAMA3_INTERRUPTIONS / (LLAMA3_DAYS * 24 * LLAMA3_GPUS)
    return per_gpu_hour * gpus


META_MTTF_HOURS = 7.9
META_MTTF_GPUS = 1_024
"""Meta's research clusters: a mean time to failure of 7.9 h for 1,024-GPU jobs (Kokolis et
al., "Revisiting Reliability in Large-Scale Machine Learning Research Clusters", HPCA 2025,
arXiv:2410.21680; the figure as issue 48 quotes it). Published, not measured here."""


def meta_interruptions_per_hour(gpus: int) -> float:
    """Meta's 1,024-GPU rate, scaled linearly with the GPU count (about one every 48.5 min at
    10,000 GPUs)."""
    return gpus / (META_MTTF_HOURS * META_MTTF_GPUS)
