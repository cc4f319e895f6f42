"""The goodput model's stacks (bench/goodput_model.py writes the report): how each way of
running the job spends an interruption, path by path, and its checkpoint stalls; the
baseline, this stage, and the stages built on it. Inputs: bench/goodput_inputs.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from bench.goodput_inputs import (
    COMMON_RESTORE,
    COMMON_STARTUP,
    EMERGENCY_SAVE,
    FAST_KEEP,
    FAST_RESTORE,
    FAST_SAVE_COST,
    FAST_WRITE,
    FAULT_MIX,
    IN_PLACE_RECOVERY,
    IN_PLACE_SHARE,
    IN_PLACE_STARTUP,
    JOBSET_RECOVERY,
    NCCL_TIMEOUT,
    PREFLIGHT,
    PRELOAD_SAVING,
    REPLACE_SHARE,
    REPLICA_COPY,
    REPLICA_RESTORE,
    SOAK_FAST_EVERY,
    SOAK_SAVE_EVERY,
    SPARE_RECOVERY,
    STEP_TAX,
    WHOLE_WORLD_RECOVERY,
    WORLD_PODS,
)


def uniform_sum_below(limit: float, w1: float, w2: float) -> tuple[float, float]:
    """For S = X + Y, X ~ U[0, w1) and Y ~ U[0, w2) independent (w1 = 0: X = 0), w2 > 0:
    P(S < limit) and E[S; S < limit], integrating S's trapezoid density piece by piece."""
    a, b = sorted((w1, w2))
    x = min(max(limit, 0.0), a + b)
    if a == 0:
        return x / b, x * x / (2 * b)
    u = min(x, a)  # rising: s / ab
    p, m = u**2 / (2 * a * b), u**3 / (3 * a * b)
    if x > a:  # flat: 1 / b
        u = min(x, b)
        p, m = p + (u - a) / b, m + (u**2 - a**2) / (2 * b)
    if x > b:  # falling: (a + b - s) / ab
        p += ((a + b) * (x - b) - (x**2 - b**2) / 2) / (a * b)
        m += ((a + b) * (x**2 - b**2) / 2 - (x**3 - b**3) / 3) / (a * b)
    return p, m


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
    replica_share: Mapping[str, float] = field(default_factory=dict)
    """Per symptom, the share whose replaced pod resumes from its peer replica's fast step
    (missing: none; a replaced pod resumes from the durable tier: the whole-world path)."""
    replica_restore: float = 0.0
    replica_copy: float = 0.0
    """Seconds the holder takes to copy one fast step of its source pod (`replica_window`)."""
    fast_keep: int = FAST_KEEP
    fast_save_cost: float = FAST_SAVE_COST
    """Seconds of training each fast save costs (`with_fast_tier` adds it per interval)."""
    spare_recovery: float | None = None
    """With warm spares (spec.spares): the control plane of a replacement, a spare taking the
    replaced pod's rank, and no new pod to schedule, pull and start: its trainer starts as
    an in-place restart's does (`in_place_startup`). None: no spares."""
    spare_share: float = 0.0
    """The share of the job's GPUs that are idle spares (spares / (pods + spares)): GPU time
    that never trains, charged against goodput."""
    emergency_save: float | None = None
    """Seconds of the emergency save on notice (host maintenance), which then loses no work
    (None: no emergency save: half the durable interval, as any other interruption)."""
    evicted_pod_replaced: bool = False
    """An eviction replaces only the evicted pod and the others restart in place, after the
    world's emergency save (`planned`). False: the world is re-created after the save."""
    preflight: float = 0.0
    """Seconds the preflight adds to a new pod's start (not a spare's, not in place)."""
    step_tax: float = 0.0
    """The fraction of training time the step boundary costs while nothing fails."""

    def detect(self) -> float:
        return sum(FAULT_MIX[k] * self.detection[k] for k in FAULT_MIX)

    def share(self) -> float:
        """The share of interruptions restarted in place."""
        return sum(FAULT_MIX[k] * self.in_place_share.get(k, 0.0) for k in FAULT_MIX)

    def replicated(self) -> float:
        """The share of interruptions whose pod is replaced with a peer replica to copy its
        fast step back from (how many find one the other pods still hold: `replica_window`)."""
        return sum(FAULT_MIX[k] * self.replica_share.get(k, 0.0) for k in FAULT_MIX)

    def noticed(self) -> float:
        """The share that comes with notice and an emergency save."""
        return FAULT_MIX["planned"] if self.emergency_save is not None else 0.0

    def whole_world(self) -> float:
        return self.recovery + self.new_pod_start() + self.restore + self.checkpoint_interval / 2

    def new_pod_start(self) -> float:
        """A new pod's start-up: its preflight, then its trainer's start."""
        return self.preflight + self.startup

    def planned(self) -> float:
        """Host maintenance: the emergency save, then the whole world re-created, or (with
        restart in place) only the evicted pod replaced as a faulty node's is (a warm spare's
        takeover, with spares); every rank resumes from the save's step (durable)."""
        return sum(self.planned_terms())

    def planned_terms(self) -> tuple[float, float, float, float]:
        """`planned`'s four terms: control plane, start-up, restore, the emergency save."""
        control, start = self.recovery, self.new_pod_start()
        if self.evicted_pod_replaced:
            control, start = self.replaced_terms()[:2]
        return control, start, self.restore, self.emergency_save or 0.0

    def in_place(self) -> float:
        interval = self.fast_interval if self.fast_interval is not None else (
            self.checkpoint_interval
        )  # fmt: skip
        return self.in_place_recovery + self.in_place_startup + self.in_place_restore + (
            interval / 2
        )  # fmt: skip

    def replica_window(self) -> tuple[float, float]:
        """(the share of replaced pods whose holder has a fast step the other pods still
        hold, the mean age of that step). The holder copies its source's newest published
        step, C seconds a copy. With C <= f it starts at each publication and holds step k
        from C after it until C after the next: the step is C + U[0, f) old. With C > f the
        copies run back to back, each starting U[0, f) after the step it copies was taken,
        and one is held from C to 2C after its start: C + U[0, f) + U[0, C) old. The other
        pods keep their `fast_keep` newest steps: the world resumes from the holder's only
        while its step is younger than keep x f (else: no common step, the durable tier)."""
        f, c = self.fast_interval, self.replica_copy
        if f is None:
            return 0.0, 0.0
        widths = (0.0, f) if c <= f else (f, c)
        held, moment = uniform_sum_below(self.fast_keep * f - c, *widths)
        return held, (c + moment / held if held else 0.0)

    def replaced(self) -> float:
        """A replaced pod resuming from its peer replica (the others restart in place and
        wait for it): control plane, a new pod's start-up (a warm spare's trainer start
        instead, with spares), copy-back and fast restore, and the work since the fast step
        its holder had (`replica_window`)."""
        return sum(self.replaced_terms())

    def replaced_terms(self) -> tuple[float, float, float, float]:
        """`replaced`'s four terms: control plane, start-up, restore, lost work."""
        control, start = self.recovery, self.new_pod_start()
        if self.spare_recovery is not None:
            control, start = self.spare_recovery, self.in_place_startup
        return control, start, self.replica_restore, self.replica_window()[1]

    def terms(self) -> list[tuple[str, float, float]]:
        """(path, share of interruptions, seconds): what `lost_per_interruption` sums."""
        in_place, noticed = self.share(), self.noticed()
        replica = self.replicated() * self.replica_window()[0]
        durable = max(0.0, 1 - in_place - replica - noticed)
        out = []
        if durable > 1e-9:
            out.append(("whole world / pod replaced, durable", durable, self.whole_world()))
        if noticed:
            out.append(("planned, from the emergency save", noticed, self.planned()))
        if in_place:
            out.append(("in place", in_place, self.in_place()))
        if replica:
            out.append(("pod replaced, from the peer replica", replica, self.replaced()))
        return out

    def lost_per_interruption(self) -> float:
        return self.detect() + sum(share * seconds for _, share, seconds in self.terms())

    def goodput(self, interruptions_per_hour: float) -> float:
        lost = interruptions_per_hour * self.lost_per_interruption() / 3600
        stalls = self.stall_fraction + self.step_tax
        return max(0.0, 1.0 - lost - stalls) * (1.0 - self.spare_share)


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
    recovery=JOBSET_RECOVERY,  # measured at 1,250 workers (19.6 s at 128): JobSet recreate
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
    recovery=WHOLE_WORLD_RECOVERY,  # measured at 1,250 workers (13.4-17.7 s at 128)
    startup=COMMON_STARTUP,
    restore=COMMON_RESTORE,
    checkpoint_interval=600.0,
    # assumed: an async save blocks only while staging to CPU memory. Its whole cost as
    # measured on the 2-core CPU trainer (bench/results/fast-tier.md, 573.7 MiB: the 8.1 ms
    # stall and 649.5 ms of slower steps while it is written), per byte to 4 GB: 4.37 s a
    # save, 0.73% of training time every 10 min, fits under it
    stall_fraction=0.01,
    emergency_save=EMERGENCY_SAVE,
    preflight=PREFLIGHT,
    step_tax=STEP_TAX,
)


def stages() -> list[Stack]:
    """This stage, then restart in place (issue 15), then the fast tier (issue 16) kept in
    each pod's own memory, then with its peer replica (`fastTier.peerReplicas`, default 1)."""
    in_place = replace(
        OURS_NOW,
        name="+ restart in place (issue 15)",
        in_place_share=IN_PLACE_SHARE,
        in_place_recovery=IN_PLACE_RECOVERY,
        in_place_startup=IN_PLACE_STARTUP,
        in_place_restore=COMMON_RESTORE,
        evicted_pod_replaced=True,
    )
    interval = OURS_NOW.checkpoint_interval * SOAK_FAST_EVERY / SOAK_SAVE_EVERY
    own = with_fast_tier(in_place, interval, "+ fast tier (own memory only; issue 16)")
    peer = with_peer_replica(own, "+ fast tier with a peer replica (issue 16)")
    return [OURS_NOW, in_place, own, peer]


def with_fast_tier(
    stack: Stack, interval: float, name: str, save_cost: float | None = None
) -> Stack:
    """`stack` with a fast tier every `interval` seconds: in-place restarts resume from it,
    and each of its saves costs training `save_cost` seconds (default: the stack's own,
    `FAST_SAVE_COST` unless set)."""
    cost = stack.fast_save_cost if save_cost is None else save_cost
    return replace(
        stack,
        name=name,
        fast_interval=interval,
        fast_save_cost=cost,
        in_place_restore=FAST_RESTORE,
        stall_fraction=OURS_NOW.stall_fraction + cost / interval,
    )


def with_spares(stack: Stack, name: str, spares: int = 1, pods: int = WORLD_PODS) -> Stack:
    """`stack` (with a peer replica) whose replaced pods' ranks go to `spares` warm spares
    beside `pods` worker pods; their GPUs idle is the price. One is enough at Llama 3's rate
    (an interruption every few hours): the pod its Job creates again is the next spare."""
    return replace(stack, name=name, spare_recovery=SPARE_RECOVERY,
                   spare_share=spares / (pods + spares))  # fmt: skip


def with_preload(stack: Stack, name: str) -> Stack:
    """`stack` whose restarted trainers (in place, and a warm spare taking a rank) start in a
    warm standby interpreter with their imports done (spec.recovery.inPlacePreload): the
    in-place start-up less `PRELOAD_SAVING`. A new pod's start is unchanged."""
    return replace(stack, name=name,
                   in_place_startup=max(0.0, stack.in_place_startup - PRELOAD_SAVING))  # fmt: skip


def with_peer_replica(stack: Stack, name: str) -> Stack:
    """`stack` (with a fast tier) whose replaced pods copy their fast step back from the
    pod that holds their replica."""
    return replace(
        stack,
        name=name,
        replica_share=REPLACE_SHARE,
        replica_restore=REPLICA_RESTORE,
        replica_copy=REPLICA_COPY,
    )


def best_fast_interval(stack: Stack, rate: float) -> float:
    """The fast-tier interval f that minimises lost work + cost when only in-place restarts
    resume from it: rate x share x f / 2 / 3600 + cost / f is least at
    f = sqrt(2 x cost x 3600 / (rate x share)); at least `FAST_WRITE` (a fast step due
    while the previous one is written is skipped)."""
    cost = stack.fast_save_cost
    return max(FAST_WRITE, math.sqrt(2 * cost * 3600 / (rate * stack.share())))


def fast_tier_break_even(stack: Stack, without: Stack, rate: float) -> float:
    """The stall fraction below which the fast tier pays for itself: the work it saves per
    hour (`without`: the same stack with no fast tier), as a fraction of training time."""
    saved = without.lost_per_interruption() - stack.lost_per_interruption()
    return rate * saved / 3600


def tuned(stack: Stack, rate: float) -> tuple[float, Stack]:
    """The fast interval, in whole seconds from `FAST_WRITE` to the durable interval, at
    which `stack`'s goodput is highest (numerically: with a peer replica the lost work is not
    smooth in the interval), and the stack at it."""
    start = math.ceil(FAST_WRITE)
    best = max(
        range(start, int(stack.checkpoint_interval) + 1),
        key=lambda f: retimed(stack, float(f)).goodput(rate),
    )
    return float(best), retimed(stack, float(best))


def retimed(stack: Stack, interval: float) -> Stack:
    """`stack` with its fast tier every `interval` seconds instead."""
    return with_fast_tier(stack, interval, stack.name)
