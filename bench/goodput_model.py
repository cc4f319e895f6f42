"""Projected goodput of a 10k-GPU job (issue 18): measured components, published failure
rates, and the arithmetic shown. A model, not a measurement: every input is named with
where it comes from, and the soak harness (real training under faults) is what will
replace the modelled terms one by one.

    python -m bench.goodput_model [--gpus 10000] [--markdown bench/results/goodput-model.md]

Goodput = 1 - interruptions per hour x (seconds lost per interruption) / 3600 - checkpoint
stall fraction. Seconds lost per interruption = detection + the recovery path's cost, where
a path costs control-plane recovery + start-up + restore + lost work (half the interval of
the checkpoint it resumes from, on average: the work since the newest step that survives).
Paths: the whole world re-created, resuming from the durable tier (also a pod of a faulty or
lost node replaced while the others restart in place, when it resumes from the durable tier:
the new pod's start-up and the durable restore are what the world waits for); host
maintenance with notice, which resumes from the step the emergency save wrote on SIGTERM;
a restart in place (issue 15), resuming from the fast tier when there is one (issue 16),
which only the interruptions that implicate no node take (`IN_PLACE_SHARE`); and, with the
fast tier's peer replica, the replaced pod of a faulty or lost node resuming from the fast
step its holder copied (`REPLACE_SHARE`). The fast tier's terms come from
bench/results/fast-tier.md, projected per byte to `RANK_STATE_BYTES` (`per_byte`).

Three modules: the inputs (bench/goodput_inputs.py), the stacks and their arithmetic
(bench/goodput_stacks.py), and this one, the report with every sum written out.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from bench.goodput_elastic import ElasticPath, section
from bench.goodput_inputs import (
    BOUNDARY_COST,
    BUDDY_COPY_BACK_MEASURED,
    BUDDY_REPLICATION_MEASURED,
    COMMON_RESTORE,
    COPY_BACK_RANK,
    COPY_STREAMS,
    EMERGENCY_SAVE,
    FAST_RESTORE,
    FAST_RESTORE_MEASURED,
    FAST_SAVE_COST,
    FAST_SAVE_COST_CPU,
    FAST_SAVE_STALL,
    FAST_SAVE_STALLS,
    FAST_SAVE_WHOLE_COSTS,
    FAST_WRITE,
    FAST_WRITER_GIL,
    FAST_WRITTEN,
    FAULT_MIX,
    GPU_SHARE,
    IN_PLACE_RECOVERY,
    IN_PLACE_SHARE,
    IN_PLACE_STARTUP,
    LLAMA3_DAYS,
    LLAMA3_GPUS,
    LLAMA3_INTERRUPTIONS,
    MEASURED_STATE,
    META_MTTF_GPUS,
    META_MTTF_HOURS,
    PREFLIGHT,
    PREFLIGHT_NODE_CHECK,
    PREFLIGHT_RING,
    PRELOAD_SAVING,
    RANK_STATE_BYTES,
    RANKS_PER_POD,
    REPLACE_SHARE,
    REPLICA_RESTORE,
    REPLICATION_RANK,
    S3_RESTORE_MEASURED,
    SOAK_FAST_EVERY,
    SOAK_SAVE_EVERY,
    SPARE_RECOVERY,
    STEP_SECONDS,
    WORLD_PODS,
    copy_rounds,
    interruptions_per_hour,
    meta_interruptions_per_hour,
    per_byte,
    stall_line,
)
from bench.goodput_stacks import (
    BASELINE,
    OURS_NOW,
    Stack,
    best_fast_interval,
    fast_tier_break_even,
    retimed,
    stages,
    tuned,
    with_fast_tier,
    with_preload,
    with_spares,
)


def _sum(*terms: float) -> str:
    return " + ".join(f"{t:.4g}" for t in terms) + f" = {sum(terms):.1f} s"


def _paths(stack: Stack) -> list[str]:
    """The table's path cells: durable, planned, in place, peer replica ('-': not taken)."""
    interval = stack.fast_interval or stack.checkpoint_interval
    return [
        _sum(stack.recovery, stack.new_pod_start(), stack.restore, stack.checkpoint_interval / 2),
        _sum(*stack.planned_terms())
        if stack.noticed() else "-",
        _sum(stack.in_place_recovery, stack.in_place_startup, stack.in_place_restore,
             interval / 2) if stack.share() else "-",
        _sum(*stack.replaced_terms()) if stack.replicated() else "-",
    ]  # fmt: skip


def _rows(stacks: Sequence[Stack], rate: float) -> tuple[list[str], list[str]]:
    """The table's rows and each stack's arithmetic."""
    rows, arithmetic = [], []
    for stack in stacks:
        lost = stack.lost_per_interruption()
        replica = stack.replicated() * stack.replica_window()[0]
        shares = " / ".join(f"{x:.1%}" for x in (stack.share(), replica, stack.noticed()))
        rows.append(
            f"| {stack.name} | {stack.detect():.1f} s | "
            + " | ".join(_paths(stack))
            + f" | {shares} | {lost:.0f} s | {stack.stall_fraction + stack.step_tax:.3%} "
            f"| **{stack.goodput(rate):.2%}** |"
        )
        terms = " + ".join(f"{share:.3f} x {seconds:.1f}" for _, share, seconds in stack.terms())
        arithmetic.append(
            f"- {stack.name}: {stack.detect():.1f} + {terms} = {lost:.1f} s per interruption; "
            f"{'(' if stack.spare_share else ''}1 - {rate:.4f} x {lost:.1f} / 3600 - "
            f"{stack.stall_fraction + stack.step_tax:.6f}"
            + (f") x (1 - {stack.spare_share:.5f})" if stack.spare_share else "")
            + f" = {stack.goodput(rate):.2%}"
        )
    return rows, arithmetic


def _no_tax_terms(ours: Stack) -> list[str]:
    """The terms a stack pays while nothing fails, besides its saves: the step boundary and
    the preflight of each new pod (issue 48's no-tax figures, issue 43's preflight)."""
    return [
        "## What the operator charges while nothing fails",
        "",
        f"- **The step boundary**: {BOUNDARY_COST * 1e3:.3f} ms a step that saves nothing "
        "(measured, bench/results/boundary-cost.md: the worst rank's median), against a step "
        f"of {STEP_SECONDS:.0f} s (assumed): {ours.step_tax:.4%} of training time, in every "
        "stage. The in-pod agent (progress sidecar and supervisor) took 0.20% of one core "
        "(bench/results/agent-cpu.md), off the training thread; not charged. The goodput "
        "soak's fault-free draw (bench/results/no-tax.md) still puts the operator 1.3 points "
        "behind the JobSet in the mean of three seeds: there the platform's processes and the "
        "trainers share 2 CPUs and a step is 60 ms, so it is not this projection's tax.",
        f"- **The preflight** (on by default): {PREFLIGHT_RING:.2f} s of ring transfer "
        f"(measured, bench/results/preflight-cost.md) + {PREFLIGHT_NODE_CHECK:.0f} s of node "
        f'check (assumed: `dcgmi diag -r 1`, "normally lasting seconds") = {PREFLIGHT:.1f} s '
        "added to every new pod's start (the whole world's and a replaced pod's; not a warm "
        "spare's, which ran it when it started, nor an in-place restart's). What it buys is "
        "not in the table: a node that would fail again is caught before the world trains on "
        "it (a second interruption avoided).",
        "- **The silent-corruption defences** at their defaults (non-finite check, exact "
        "replica checksums at each save) are part of the save's stall; the opt-in "
        "`AnomalyGuard` with a verdict every 100 steps measured 2.0-2.3% of a 34 ms CPU step "
        "(bench/results/sdc-overhead.md, within the rounds' spread): not in these stacks.",
    ]


def cpu_bound(stack: Stack) -> Stack:
    """A fast-tier stage charged the whole cost of a fast save as measured on the 2-core CPU
    trainer, per byte (`FAST_SAVE_COST_CPU`): a node with no spare cores."""
    name = f"{stack.name}, charged its whole cost on the 2-core CPU trainer"
    return with_fast_tier(stack, stack.fast_interval or 0.0, name, FAST_SAVE_COST_CPU)


def _save_cost_term(own: Stack, rate: float) -> str:
    """The note on what a fast save costs training: its stall, its writer's GIL-held work,
    and the whole cost measured on the CPU trainer."""
    scale = RANK_STATE_BYTES / MEASURED_STATE
    mib = ", ".join(f"{b / 2**20:.1f}" for b, _ in FAST_SAVE_STALLS)
    stalls = ", ".join(f"{s * 1e3:.1f}" for _, s in FAST_SAVE_STALLS)
    wholes = ", ".join(f"{s * 1e3:.1f}" for _, s in FAST_SAVE_WHOLE_COSTS)
    fixed, slope = stall_line()
    interval = own.fast_interval or 0.0
    cpu = cpu_bound(own)
    cpu_f, cpu_tuned = best_fast_interval(cpu, rate), retimed(cpu, best_fast_interval(cpu, rate))
    return (
        f"- **Cost per fast save** (staged into reused host buffers, written by a background "
        f"thread). The training thread's stall, measured {stalls} ms at {mib} MiB, per byte "
        f"from the largest: {FAST_SAVE_STALLS[-1][1] * 1e3:.1f} ms x {scale:.3f} = "
        f"{FAST_SAVE_STALL * 1e3:.2f} ms (the points are nearly flat: a line through them, "
        f"{fixed * 1e3:.2f} ms {slope * 2**30 * 1e3:+.3f} ms per GiB, gives "
        f"{(fixed + slope * RANK_STATE_BYTES) * 1e3:.2f} ms at {RANK_STATE_BYTES / 1e9:.0f} GB; "
        "charging every measured millisecond per byte bounds it from above). The stall is not "
        "the whole cost: the writer thread's Python (pickling, manifest, commit, retention) "
        "holds the GIL the training thread needs. Its whole cost to training, measured, "
        f"{wholes} ms at the same sizes. The model charges a GPU node's trainer the stall per "
        "byte and the writer's GIL-held work, the whole cost at the smallest state less its "
        f"stall ({FAST_SAVE_WHOLE_COSTS[0][1] * 1e3:.1f} - {FAST_SAVE_STALLS[0][1] * 1e3:.1f} "
        f"= {FAST_WRITER_GIL * 1e3:.1f} ms, assumed fixed): {FAST_SAVE_STALL * 1e3:.2f} + "
        f"{FAST_WRITER_GIL * 1e3:.1f} = {FAST_SAVE_COST * 1e3:.1f} ms a save, every "
        f"{interval:.0f} s: {FAST_SAVE_COST / interval:.3%} of training time (the stall column: "
        f"{OURS_NOW.stall_fraction:.2%} + {FAST_SAVE_COST / interval:.3%}). Assumed: the "
        "writer's hashing and copying, which release the GIL, run on the node's spare cores. "
        "Charged instead the whole cost measured on the 2-core CPU trainer, per byte "
        f"({FAST_SAVE_WHOLE_COSTS[-1][1] * 1e3:.1f} ms x {scale:.3f} = "
        f"{FAST_SAVE_COST_CPU:.2f} s: a node with no spare core), the fast tier in its own "
        f"memory costs {FAST_SAVE_COST_CPU / interval:.2%} every {interval:.0f} s, "
        f"**{cpu.goodput(rate):.2%}**, and at its best interval ({cpu_f:.0f} s) "
        f"**{cpu_tuned.goodput(rate):.2%}**; with the peer replica, the table's last row. "
        "The previous version charged the stall alone (0.8 ms x 6.649 = 5.25 ms a save). Not "
        "measured: on a GPU the writer thread's device-to-host copy of the optimizer-owned "
        "tensors has to end within the next forward and backward, or the fence holds "
        "`optimizer.step()`."
    )


def _fast_tier_terms(own: Stack, peer: Stack, rate: float) -> list[str]:
    """The note on the fast tier's inputs: each measured figure scaled per byte."""
    scale = RANK_STATE_BYTES / MEASURED_STATE
    interval = own.fast_interval or 0.0
    copy, keep = peer.replica_copy, peer.fast_keep
    held, age = peer.replica_window()
    rounds = copy_rounds()
    at_once = replace(
        peer, replica_copy=REPLICATION_RANK, replica_restore=COPY_BACK_RANK + FAST_RESTORE
    )
    instant = replace(peer, replica_copy=0.0, replica_restore=FAST_RESTORE)
    s3_rank = per_byte(S3_RESTORE_MEASURED)
    assumed = replace(
        peer,
        replica_copy=RANKS_PER_POD * s3_rank,
        replica_restore=RANKS_PER_POD * s3_rank + FAST_RESTORE,
    )
    assumed_share = assumed.replicated() * assumed.replica_window()[0]
    if copy > interval:
        window = (
            f"longer than the {interval:.0f} s interval: the copies run back to back, each "
            "starting U[0, f) after the step it copies was taken, and one is held from C to 2C "
            f"after its start, so the step a replaced pod finds is {copy:.1f} + U[0, "
            f"{interval:.0f}) + U[0, {copy:.1f}) s old. The other pods keep their {keep} newest "
            f"steps, so the world resumes from the holder's only while it is younger than "
            f"{keep} x {interval:.0f} = {keep * interval:.0f} s: P = {held:.1%} "
            f"(`uniform_sum_below`), then {age:.1f} s old on average; the other "
            f"{1 - held:.1%} resume from the durable tier"
        )
    else:
        window = (
            f"within the {interval:.0f} s interval: the holder starts a copy at each "
            f"publication and holds each step from C after it until C after the next, so the "
            f"step a replaced pod finds is C + U[0, f) old, {copy:.2f} + {interval:.0f} / 2 = "
            f"{age:.1f} s on average, and the other pods still hold it ({keep} x "
            f"{interval:.0f} s > C + {interval:.0f} s): every replaced pod resumes from it"
        )
    return [
        f"Every fast-tier term is a median of bench/results/fast-tier.md at its largest model "
        f"(50.1M parameters with AdamW: {MEASURED_STATE / 2**20:.1f} MiB = "
        f"{MEASURED_STATE / 1e6:.1f} MB of state) scaled per byte to a rank's "
        f"{RANK_STATE_BYTES / 1e9:.0f} GB: x {scale:.3f}.",
        "",
        _save_cost_term(own, rate),
        f"- **Fast restore** (in place: each rank from its own pod's memory, deep-verified): "
        f"{FAST_RESTORE_MEASURED * 1e3:.1f} ms x {scale:.3f} = {FAST_RESTORE:.2f} s.",
        f"- **Lost work**: a restart in place (every pod's memory intact, {own.share():.1%}) "
        f"loses half the fast interval ({interval / 2:.0f} s) instead of half the durable one "
        f"({own.checkpoint_interval / 2:.0f} s). A replaced pod (a GPU fault or a lost node, "
        f"{peer.replicated():.1%}) has lost its memory: with the fast tier in its own memory "
        "only, the world resumes from the durable tier (the whole-world path's cost, as "
        "before); with a peer replica, from the fast step its holder copied (below).",
        f"- **Copy-back** (a replaced pod, from the pod holding its replica): its sidecar "
        f"copies the pinned step of its {RANKS_PER_POD} ranks back over HTTP "
        f"(`rtj_shim.fast.peer_pull.fetch_back`), hashing as it writes, before the trainers start, "
        f"{COPY_STREAMS} ranks at a time (`COPY_STREAMS`): ⌈{RANKS_PER_POD} / {COPY_STREAMS}⌉ "
        f"= {rounds} rounds. Measured (bench/results/fast-tier.md, section 2, from a buddy): "
        f"one rank's copy-back of {MEASURED_STATE / 2**20:.1f} MiB between two sidecars on "
        f"loopback, {BUDDY_COPY_BACK_MEASURED * 1e3:.1f} ms x {scale:.3f} = "
        f"{COPY_BACK_RANK:.2f} s a round (assumed: {COPY_STREAMS} streams at once take as long "
        f"as one, what `COPY_STREAMS` is sized for; the bench has one rank on 2 cores, so not "
        f"measured; nor is a network between nodes: {COPY_STREAMS} streams at the loopback "
        f"rate are {COPY_STREAMS * MEASURED_STATE / BUDDY_COPY_BACK_MEASURED / 1e9:.1f} GB/s "
        f"through the holder's NIC), x {rounds} = {rounds * COPY_BACK_RANK:.2f} s; then the "
        f"trainers' fast restore, {FAST_RESTORE:.2f} s: {REPLICA_RESTORE:.2f} s. The previous "
        f"version assumed the S3 restore instead (loopback moto, deep: "
        f"{S3_RESTORE_MEASURED:.2f} s x {scale:.3f} = {s3_rank:.2f} s a rank) and the ranks one "
        f"after another (x {RANKS_PER_POD} = {RANKS_PER_POD * s3_rank:.1f} s; 73.4 s with the "
        "1.38 s of the run before).",
        f"- **Replica lag**: the holder copies its source pod's newest fast step "
        f"(`ReplicaPuller.pull_once`), in the same rounds. Measured: one rank's copy of "
        f"{MEASURED_STATE / 2**20:.1f} MiB, {BUDDY_REPLICATION_MEASURED * 1e3:.1f} ms x "
        f"{scale:.3f} = {REPLICATION_RANK:.2f} s a round, x {rounds}: C = {copy:.2f} s a step, "
        f"{window}. So {peer.replicated():.1%} x {held:.1%} = "
        f"{peer.replicated() * held:.1%} of interruptions resume from the peer replica. With "
        f"the copies the previous version assumed (C = {assumed.replica_copy:.1f} s, copy-back "
        f"{assumed.replica_restore:.1f} s): {assumed_share:.1%} of interruptions, "
        f"**{assumed.goodput(rate):.2%}** (the previous version, with the run before's "
        f"figures: 16.3%, 97.45%, and 97.77% at its best interval, 74 s). Were all "
        f"{RANKS_PER_POD} ranks copied at once (one round, if the streams scale): every "
        f"replaced pod from a step "
        f"{at_once.replica_window()[1]:.1f} s old, copy-back {at_once.replica_restore:.2f} s: "
        f"**{at_once.goodput(rate):.2%}**. A replica with no lag and no copy-back time (a "
        f"replaced pod loses what an in-place restart does; the upper bound): "
        f"**{instant.goodput(rate):.2%}**.",
        f"- **Shortest interval**: a fast step takes {FAST_WRITTEN * 1e3:.1f} ms x {scale:.3f} "
        f"= {FAST_WRITE:.2f} s to publish (a step due meanwhile is skipped).",
    ]  # fmt: skip


GOALS = {"Llama 3": 0.985, "Meta": 0.97}
"""Issue 48's goals at 10,000 GPUs: goodput at Llama 3's rate and at Meta's."""


def both_rates(stacks: Sequence[Stack], gpus: int) -> list[str]:
    """Each stack at both published rates, and the best fast interval at each (the peer
    replica's stack, `tuned` again at the rate): the section the goals are read from."""
    rates = {"Llama 3": interruptions_per_hour(gpus), "Meta": meta_interruptions_per_hour(gpus)}
    lines = [
        "## At both published rates",
        "",
        f"Llama 3's ({rates['Llama 3']:.3f} an hour, one every {60 / rates['Llama 3']:.0f} min) "
        f"and Meta's: a mean time to failure of {META_MTTF_HOURS} h for "
        f"{META_MTTF_GPUS:,}-GPU jobs (Kokolis et al., HPCA 2025, arXiv:2410.21680), scaled to "
        f"{gpus:,} GPUs: {rates['Meta']:.3f} an hour, one every {60 / rates['Meta']:.1f} min. "
        "The goals (issue 48): " + ", ".join(f"{GOALS[k]:.1%} at {k}'s rate" for k in GOALS) + ".",
        "",
        "| stack | " + " | ".join(f"{k}'s rate" for k in rates) + " |",
        "|---|" + "---|" * len(rates),
    ]
    for stack in stacks:
        cells = " | ".join(f"{stack.goodput(r):.2%}" for r in rates.values())
        lines.append(f"| {stack.name} | {cells} |")
    best = stacks[-1]
    verdicts = []
    for name, rate in rates.items():
        interval, at = tuned(best, rate)
        met = "met" if at.goodput(rate) >= GOALS[name] else "not met"
        verdicts.append(f"{at.goodput(rate):.2%} (fast tier every {interval:.0f} s; goal {met})")
    lines.append(f"| {best.name}, its fast interval chosen for the rate | {' | '.join(verdicts)} |")
    return lines


def report(gpus: int) -> str:
    rate = interruptions_per_hour(gpus)
    ours, in_place, own, peer = stages()
    spares = with_spares(peer, "+ warm spares (issue 15)")
    warm = with_preload(spares, "+ warm standby interpreters (issue 15)")
    rows, arithmetic = _rows(
        [BASELINE, ours, in_place, own, peer, spares, warm, cpu_bound(peer)], rate
    )
    own_f, own_tuned = best_fast_interval(own, rate), retimed(own, best_fast_interval(own, rate))
    peer_f, peer_tuned = tuned(peer, rate)
    cpu_f, cpu_tuned = tuned(cpu_bound(peer), rate)
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
        f"{FAULT_MIX['crash']}; every hang), so {in_place.share():.1%} of interruptions. "
        "The pod of a faulty or lost node replaced, the others restarted in place: "
        + ", ".join(f"{k} {v:.1%}" for k, v in REPLACE_SHARE.items())
        + f" (GPU faults: {GPU_SHARE} / {FAULT_MIX['crash']}; every lost node), so "
        f"{peer.replicated():.1%}. Host maintenance ({FAULT_MIX['planned']:.1%}) makes the "
        "emergency save, then re-creates the world in this stage; from restart in place on it "
        "replaces only the evicted pod, as a faulty node's (a warm spare takes its rank, with "
        "spares), the others' stop giving the save its deadline (the previous version "
        "re-created the world in every stage).",
        "",
        "Each path: control-plane recovery + start-up + restore + lost work (half the "
        "interval of the checkpoint it resumes from; the emergency save's time for host "
        "maintenance; the age of the step its holder copied for a pod resumed from its peer "
        "replica). Shares: in place / peer replica / emergency save; the rest from the durable "
        "tier. Host maintenance resumes from the emergency save's step in this stage and after "
        "(the previous version charged it half the durable interval, 300 s, as any other "
        "interruption: the soak's evictions trained no step again).",
        "",
        "| stack | detect (weighted) | durable: whole world or pod replaced | planned, "
        "emergency save | in place | pod replaced, peer replica | shares | per interruption "
        "| stall | goodput |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        *arithmetic,
        "",
        "Goodput = 1 - rate x per-interruption seconds / 3600 - stall (the saves, and the step "
        "boundary from this stage on: below). Measured: detection "
        "(bench.operator_scale) and whole-world recovery, the operator's "
        f"{OURS_NOW.recovery:.1f} s and JobSet's {BASELINE.recovery:.1f} s (bench.operator_scale "
        "on KWOK at 1,250 workers, the projected job's scale; 17.7 s and 19.8 s at 128, "
        "`WHOLE_WORLD_SCALE`); the in-place control-plane "
        f"recovery, {IN_PLACE_RECOVERY} s (`IN_PLACE_RECOVERY`: bench.in_place_scale on "
        "KWOK at 1,251 pods, the projected job's scale; 1.2 s in the goodput soak's 2 pods); "
        f"the fast tier's interval, {SOAK_FAST_EVERY} of the durable tier's "
        f"{SOAK_SAVE_EVERY} steps as in the soak ({OURS_NOW.checkpoint_interval:.0f} s x "
        f"{SOAK_FAST_EVERY} / {SOAK_SAVE_EVERY} = {own.fast_interval:.0f} s); the fast tier's "
        "stall, restore and copies (below). Assumed: the in-place start-up "
        f"({IN_PLACE_STARTUP:.0f} s: the trainer process starts again in its pod), "
        f"{RANK_STATE_BYTES / 1e9:.0f} GB of state a rank and {RANKS_PER_POD} ranks a pod, "
        f"the emergency save ({EMERGENCY_SAVE:.0f} s: its default deadline; the soak's "
        "evictions trained no step again), the rest as named in bench/goodput_inputs.py.",
        "",
        *_no_tax_terms(ours),
        "",
        "## The fast tier's terms",
        "",
        *_fast_tier_terms(own, peer, rate),
        "",
        f"The fast tier pays for itself while its cost stays under "
        f"{fast_tier_break_even(own, in_place, rate):.2%} of training time in its own memory "
        f"({in_place.lost_per_interruption():.1f} -> {own.lost_per_interruption():.1f} s per "
        f"interruption, {rate:.3f} an hour), "
        f"{fast_tier_break_even(peer, in_place, rate):.2%} with the peer replica; it costs "
        f"{FAST_SAVE_COST / (own.fast_interval or 1):.3%} (on the 2-core CPU trainer: "
        f"{FAST_SAVE_COST_CPU / (own.fast_interval or 1):.2%}). In its own memory its best "
        f"interval is sqrt(2 x {FAST_SAVE_COST:.4f} x 3600 / ({rate:.4f} x "
        f"{own.share():.3f})) = {own_f:.1f} s: **{own_tuned.goodput(rate):.2%}**. With the "
        f"peer replica (every second from {math.ceil(FAST_WRITE)} to "
        f"{peer.checkpoint_interval:.0f} s, since the lag changes at f = C) it is "
        f"{peer_f:.0f} s: **{peer_tuned.goodput(rate):.2%}**; charged the CPU trainer's whole "
        f"cost, {cpu_f:.0f} s: **{cpu_tuned.goodput(rate):.2%}**.",
        "",
        "## Warm spares",
        "",
        f"With `spec.spares: 1` a replaced pod's rank goes to a spare already running on "
        f"another node: the control plane is the spare's takeover, {SPARE_RECOVERY} s "
        "(`SPARE_RECOVERY`: KWOK at 1,251 pods, "
        "bench/results/in-place-scale.md; 1.7 s with 2 pods on the pod runner, 12-14 s when "
        "the Job creates the pod again, its 10 s back-off), and the start-up an in-place "
        "restart's "
        f"({IN_PLACE_STARTUP:.0f} s assumed: the spare's container runs, its trainer "
        f"starts), not a new pod's ({OURS_NOW.startup:.0f} s). Its price: one node of "
        f"{WORLD_PODS + 1:,} idle, {spares.spare_share:.3%} of the GPU time, charged as a "
        "factor on goodput. One spare is enough at this rate (an interruption every "
        f"{1 / rate:.1f} h): the pod its Job creates again is the next spare. "
        f"{peer.replaced():.1f} -> {spares.replaced():.1f} s per replaced pod: "
        f"**{spares.goodput(rate):.2%}**. Measured on the pod runner (2 pods), where a new "
        "pod costs nothing to schedule or start, the whole recovery of a GPU fault, fault to "
        "first step, is dominated by the trainer's own start (torchrun and the worker each "
        "import torch: ~12 s on 2 CPUs), so a spare recovers in about three quarters of the "
        "whole world's time there, not a third (bench/results/in-place-spares.md).",
        "",
        *both_rates([BASELINE, ours, in_place, own, peer, spares, warm], gpus),
        "",
        "## Elastic N-k when no node can be had (issue 45)",
        "",
        *section(ElasticPath(peer), rate),
        "",
        "## Warm standby interpreters",
        "",
        "With `spec.recovery.inPlacePreload: [torch, ...]` every pod keeps the next "
        "generation's Python process with its imports done, so a trainer restarted in place, "
        "or started on a spare, skips torchrun's import of torch and its worker's: "
        f"{PRELOAD_SAVING:.2f} s measured alone on this machine (`PRELOAD_SAVING`: 3.15 + "
        f"3.78 s, medians of 3), taken off the in-place start-up: {IN_PLACE_STARTUP:.0f} -> "
        f"{warm.in_place_startup:.2f} s (CUDA's context and NCCL's communicators are still "
        f"built by each generation). In place {spares.in_place():.1f} -> "
        f"{warm.in_place():.1f} s, a replaced pod on a spare {spares.replaced():.1f} -> "
        f"{warm.replaced():.1f} s: **{warm.goodput(rate):.2%}**. On the pod runner, where "
        "2 trainers share 2 CPUs, the standby took a killed rank's recovery from 14.3 to "
        "3.9 s and a GPU fault's with a warm spare from 14.2 to 3.7 s, against 16.5 and "
        "17.0 s for the whole world (bench/results/in-place-spares.md). Its price: one idle "
        "interpreter's host memory per pod (0.6 GiB resident here), no GPU time.",
        "",
        "Not counted: the time a step takes to be published (the fast tier's "
        f"{FAST_WRITE:.2f} s; the durable tier's background save likewise), the holder's CPU "
        "and network for its copies, the Job controller's back-off before it re-creates a "
        "replaced pod (10 s on the harness: bench/results/in-place.md); and the durable "
        f"restore is assumed ~1 GB a node ({COMMON_RESTORE:.0f} s), where {RANKS_PER_POD} "
        f"ranks of {RANK_STATE_BYTES / 1e9:.0f} GB are {RANKS_PER_POD * RANK_STATE_BYTES / 1e9:.0f}"
        " GB.",
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
