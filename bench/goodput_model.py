"""Projected goodput of a 10k-GPU job (issue 18): measured components, published failure
rates, and the arithmetic shown. A model, not a measurement: every input is named with
where it comes from, and the soak harness (real training under faults) is what will
replace the modelled terms one by one.

    python -m bench.goodput_model [--gpus 10000] [--markdown bench/results/goodput-model.md]

Goodput = 1 - interruptions per hour x (seconds lost per interruption) / 3600 - checkpoint
stall fraction. Seconds lost per interruption = detection + the recovery path's cost, where
a path costs control-plane recovery + start-up + restore + lost work (half the interval of
the checkpoint it resumes from, on average: the work since the newest step that survives).
Two paths: the whole world re-created (resuming from the durable tier), and a restart in
place (issue 15; resuming from the fast tier when there is one, issue 16), which only the
interruptions that implicate no node take (`IN_PLACE_SHARE`): the goodput soak
(bench/results/goodput*.md) shows a GPU fault or a lost node replacing pods or the whole
world and resuming from the durable tier.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

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
maintenance take the node away: its pods are re-created, with the durable tier only."""

SOAK_SAVE_EVERY, SOAK_FAST_EVERY = 100, 10
"""The goodput soak's durable and fast-tier intervals (bench.goodput: `save_every`,
`--fast-every`): the fast tier saves 10 times as often as the durable one."""

IN_PLACE_RECOVERY = 1.2
"""Measured (bench.goodput, every feature on, MTBF 45 s and 90 s, seed 4, 2 pods;
bench/results/goodput.md and goodput-runs/all-features-mtbf90.md): the mean of the seven
in-place restarts' control-plane time, from the failure seen (`detectedAt`) until every pod
runs the new generation (`startedAt`): barrier, pin, run order. 1.06, 1.06, 1.55, 0.54 s
and 1.43, 1.06, 1.61 s. At 2 pods, not at scale (the poller sends the orders: a round at
1,250 pods costs what a progress poll costs)."""

IN_PLACE_STARTUP = 20.0
"""Assumed, not measured at scale: the trainer's restart inside its pod. No scheduling, image
or container start, but the process starts again (framework import, CUDA context, NCCL
communicators): in the soak, 4-8 s from every pod running the new generation to the first
step on 2 CPUs (gloo), which says nothing of NCCL initialisation at 10k ranks."""

FAST_RESTORE = 2.0
"""Assumed: each rank reads its own state from pod memory (no network)."""

RANK_STATE_BYTES = 4e9
"""Llama 3: each GPU's checkpointed state is 1 MB to 4 GB; the largest, assumed."""
FAST_SAVE_BYTES_PER_SECOND = 573.7 * 2**20 / 0.1176
"""Measured (bench/results/fast-tier.md, the 50M-parameter model): a fast-tier save into
tmpfs stalls training 117.6 ms for 573.7 MiB (serialised and hashed on the training thread),
~5.1 GB/s."""
FAST_SAVE_STALL = RANK_STATE_BYTES / FAST_SAVE_BYTES_PER_SECOND
"""Seconds a fast-tier save blocks training: the largest state at the measured rate (the
device-to-host copy a GPU adds is not counted)."""


@dataclass(frozen=True)
class Stack:
    """One way of running the job: seconds per interruption, by symptom and path, and
    stalls."""

    name: str
    detection: Mapping[str, float]
    recovery: float
    """Teardown + admission + scheduling until every new pod runs (control plane)."""
    startup: float
    """Container start, framework import, CUDA and NCCL initialisation."""
    restore: float
    checkpoint_interval: float
    stall_fraction: float
    """Training time lost to checkpoint saves (blocking part of each save / interval)."""
    in_place_share: Mapping[str, float] = field(default_factory=dict)
    """Per symptom, the share restarted in place (missing: none; the whole world)."""
    in_place_recovery: float = 0.0
    in_place_startup: float = 0.0
    in_place_restore: float = 0.0
    fast_interval: float | None = None
    """The fast tier's interval, which an in-place restart resumes from (None: no fast tier:
    the durable interval)."""

    def detect(self) -> float:
        return sum(FAULT_MIX[k] * self.detection[k] for k in FAULT_MIX)

    def share(self) -> float:
        """The share of interruptions restarted in place."""
        return sum(FAULT_MIX[k] * self.in_place_share.get(k, 0.0) for k in FAULT_MIX)

    def whole_world(self) -> float:
        return self.recovery + self.startup + self.restore + self.checkpoint_interval / 2

    def in_place(self) -> float:
        interval = self.fast_interval if self.fast_interval is not None else (
            self.checkpoint_interval
        )  # fmt: skip
        return self.in_place_recovery + self.in_place_startup + self.in_place_restore + (
            interval / 2
        )  # fmt: skip

    def lost_per_interruption(self) -> float:
        share = self.share()
        return self.detect() + (1 - share) * self.whole_world() + share * self.in_place()

    def goodput(self, interruptions_per_hour: float) -> float:
        lost = interruptions_per_hour * self.lost_per_interruption() / 3600
        return max(0.0, 1.0 - lost - self.stall_fraction)


def interruptions_per_hour(gpus: int) -> float:
    """Llama 3's rate, scaled linearly with the GPU count."""
    per_gpu_hour = LLAMA3_INTERRUPTIONS / (LLAMA3_DAYS * 24 * LLAMA3_GPUS)
    return per_gpu_hour * gpus


COMMON_STARTUP = 90.0
"""Assumed for both stacks at 1,250 nodes (image cached; CUDA + NCCL init at 10k ranks)."""
COMMON_RESTORE = 5.0
"""Assumed: ~1 GB of shards per node read in parallel from object storage."""
NCCL_TIMEOUT = 600.0
"""The NCCL watchdog's default collective timeout (ProcessGroupNCCL, 10 min)."""

BASELINE = Stack(
    name="JobSet RestartJobSet + torchrun + torch.save every 10 min",
    detection={
        "crash": 8.0,  # measured: JobSet's restart decision, p50 (bench.operator_scale)
        "hang": NCCL_TIMEOUT,
        # node controller NotReady 50 s + taint eviction 300 s; the pods then stay
        # Terminating (no kubelet): a human has to act, assumed within 30 min
        "silent_node_loss": 1800.0,
        "planned": 0.0,
    },
    recovery=19.6,  # measured at 128 workers (issue 15's bench run): JobSet recreate
    startup=COMMON_STARTUP,
    restore=COMMON_RESTORE,
    checkpoint_interval=600.0,
    stall_fraction=30.0 / 600.0,  # assumed: a blocking torch.save of the shard, 30 s
)

OURS_NOW = Stack(
    name="RTJ operator (this stage)",
    detection={
        "crash": 0.16,  # measured: p50 detection, 50 jobs x 8 workers (bench.operator_scale)
        # rank progress (issue 12): the automatic allowance's 30 s floor (5x a step time
        # under 6 s) plus one 5 s poll; the drill measured 10.8 s against a fixed 10 s
        # allowance polled every second (e2e/demo/test_rank_drills.py)
        "hang": 35.0,
        "silent_node_loss": 20.0,  # node Lease silence: 2 renewal intervals of 10 s
        "planned": 0.0,  # SIGTERM emergency save
    },
    recovery=13.4,  # measured at 128 workers (issue 15's bench run)
    startup=COMMON_STARTUP,
    restore=COMMON_RESTORE,
    checkpoint_interval=600.0,
    stall_fraction=0.01,  # assumed: an async save blocks only while staging to CPU memory
)


def stages() -> list[Stack]:
    """This stage, then what issues 15 and 16 built applied on top, then what is not built
    yet (the upper bound the previous version of this model showed)."""
    in_place = replace(
        OURS_NOW,
        name="+ restart in place (issue 15)",
        in_place_share=IN_PLACE_SHARE,
        in_place_recovery=IN_PLACE_RECOVERY,
        in_place_startup=IN_PLACE_STARTUP,
        in_place_restore=COMMON_RESTORE,
    )
    interval = OURS_NOW.checkpoint_interval * SOAK_FAST_EVERY / SOAK_SAVE_EVERY
    fast = with_fast_tier(in_place, interval, "+ fast checkpoint tier (issue 16)")
    upper = replace(
        fast,
        name="not built: every interruption in place from memory (peer replica for replaced pods)",
        in_place_share=dict.fromkeys(FAULT_MIX, 1.0),
    )
    return [OURS_NOW, in_place, fast, upper]


def with_fast_tier(stack: Stack, interval: float, name: str) -> Stack:
    """`stack` with a fast tier every `interval` seconds: in-place restarts resume from it,
    and each of its saves stalls training `FAST_SAVE_STALL` seconds."""
    return replace(
        stack,
        name=name,
        fast_interval=interval,
        in_place_restore=FAST_RESTORE,
        stall_fraction=OURS_NOW.stall_fraction + FAST_SAVE_STALL / interval,
    )


def best_fast_interval(stack: Stack, rate: float) -> float:
    """The fast-tier interval f that minimises lost work + stall: rate x share x f / 2 / 3600
    + stall / f is least at f = sqrt(2 x stall x 3600 / (rate x share))."""
    return math.sqrt(2 * FAST_SAVE_STALL * 3600 / (rate * stack.share()))


def fast_tier_break_even(stack: Stack, rate: float) -> float:
    """The stall fraction below which the fast tier pays for itself: the lost work it saves
    per hour (in-place restarts resume `interval - fast interval` / 2 later), as a fraction."""
    if stack.fast_interval is None:
        return 0.0
    saved = stack.share() * (stack.checkpoint_interval - stack.fast_interval) / 2
    return rate * saved / 3600


def _path(recovery: float, startup: float, restore: float, interval: float) -> str:
    total = recovery + startup + restore + interval / 2
    return (f"{recovery:.1f} + {startup:.0f} + {restore:.0f} + {interval / 2:.0f} "
            f"= {total:.1f} s")  # fmt: skip


def report(gpus: int) -> str:
    rate = interruptions_per_hour(gpus)
    lines = [
        f"# Projected goodput, {gpus:,} GPUs",
        "",
        f"Interruptions: {LLAMA3_INTERRUPTIONS} in {LLAMA3_DAYS} days on {LLAMA3_GPUS:,} GPUs "
        f"(Llama 3), scaled to {gpus:,} GPUs: {rate:.3f} per hour (one every "
        f"{1 / rate:.2f} h).",
        "",
        "Fault mix: " + ", ".join(f"{k} {v:.1%}" for k, v in FAULT_MIX.items()) + ". "
        "Restarted in place, where the stack can: "
        + ", ".join(f"{k} {IN_PLACE_SHARE[k]:.1%}" for k in FAULT_MIX)
        + f" of each (the crashes that are not GPU faults: 1 - {GPU_SHARE} / "
        f"{FAULT_MIX['crash']}; every hang), so "
        f"{sum(FAULT_MIX[k] * IN_PLACE_SHARE[k] for k in FAULT_MIX):.1%} of interruptions.",
        "",
        "Each path: control-plane recovery + start-up + restore + lost work (half the "
        "interval of the checkpoint it resumes from).",
        "",
        "| stack | detect (weighted) | whole world | in place | share in place | "
        "per interruption | stall | goodput |",
        "|---|---|---|---|---|---|---|---|",
    ]
    arithmetic = []
    for stack in [BASELINE, *stages()]:
        share = stack.share()
        whole = _path(stack.recovery, stack.startup, stack.restore, stack.checkpoint_interval)
        interval = stack.fast_interval or stack.checkpoint_interval
        in_place = (_path(stack.in_place_recovery, stack.in_place_startup,
                          stack.in_place_restore, interval) if share else "-")  # fmt: skip
        lines.append(
            f"| {stack.name} | {stack.detect():.1f} s | {whole} | {in_place} | {share:.1%} "
            f"| {stack.lost_per_interruption():.0f} s | {stack.stall_fraction:.2%} "
            f"| **{stack.goodput(rate):.2%}** |"
        )
        arithmetic.append(
            f"- {stack.name}: {stack.detect():.1f} + {1 - share:.3f} x {stack.whole_world():.1f}"
            f" + {share:.3f} x {stack.in_place():.1f} = {stack.lost_per_interruption():.1f} s "
            f"per interruption; 1 - {rate:.4f} x {stack.lost_per_interruption():.1f} / 3600 - "
            f"{stack.stall_fraction:.4f} = {stack.goodput(rate):.2%}"
        )
    _, in_place_only, fast, _ = stages()
    best = best_fast_interval(fast, rate)
    tuned = with_fast_tier(in_place_only, best, "tuned")
    lines += [
        "",
        *arithmetic,
        "",
        "Goodput = 1 - rate x per-interruption seconds / 3600 - stall. Measured: detection and "
        "whole-world recovery (bench.operator_scale, 128 workers); the in-place control-plane "
        f"recovery, {IN_PLACE_RECOVERY} s (the goodput soak, 2 pods: `IN_PLACE_RECOVERY`); "
        f"the fast tier's interval, {SOAK_FAST_EVERY} of the durable tier's "
        f"{SOAK_SAVE_EVERY} steps as in the soak ({OURS_NOW.checkpoint_interval:.0f} s x "
        f"{SOAK_FAST_EVERY} / {SOAK_SAVE_EVERY} = {fast.fast_interval:.0f} s). Assumed: the "
        f"in-place start-up ({IN_PLACE_STARTUP:.0f} s: the trainer process starts again in its "
        f"pod), the fast restore ({FAST_RESTORE:.0f} s) and the fast tier's stall "
        f"({FAST_SAVE_STALL:.2f} s a save: {RANK_STATE_BYTES / 1e9:.0f} GB of a rank's state at "
        f"the {FAST_SAVE_BYTES_PER_SECOND / 1e9:.1f} GB/s bench.fast_tier measured, every "
        f"{fast.fast_interval:.0f} s: +{FAST_SAVE_STALL / (fast.fast_interval or 1):.2%}), the "
        "rest as named in bench/goodput_model.py.",
        "",
        f"The fast tier pays for itself while its stall stays under "
        f"{fast_tier_break_even(fast, rate):.2%} of training time: it only shortens the lost "
        f"work of the {fast.share():.1%} of interruptions restarted in place "
        f"({fast.share():.3f} x ({OURS_NOW.checkpoint_interval:.0f} - "
        f"{fast.fast_interval:.0f}) / 2 s each, {rate:.3f} an hour). At "
        f"{FAST_SAVE_STALL:.2f} s a save the best interval is sqrt(2 x {FAST_SAVE_STALL:.2f} x "
        f"3600 / ({rate:.4f} x {fast.share():.3f})) = {best:.0f} s: "
        f"**{tuned.goodput(rate):.2%}** (in place alone: {in_place_only.goodput(rate):.2%}).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.goodput_model")
    p.add_argument("--gpus", type=int, default=10_000)
    p.add_argument("--markdown", type=Path, default=None)
    args = p.parse_args(argv)
    text = report(args.gpus)
    print(text)
    if args.markdown is not None:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
