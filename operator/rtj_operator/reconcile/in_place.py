"""Restart in place, in the plan (spec.recovery.inPlace, issue 15): a failure that
implicates no node stops the trainers of every pod of the attempt and starts them again in
the same pods, with no JobSet, pod or Kueue Workload touched.

Committed status drives it (`status.inPlace`), and the progress poller carries it out by
sending every pod the order `policy.in_place.order` names on each round:

1. `begin`: the failure is recorded in the attempt's `inPlaceRestarts`, the restart budget
   is spent as for any restart, `trainerGeneration` goes up, phase `Stopping`.
2. `follow`, Stopping: once every pod's supervisor reports `stopped` for the generation
   (every process of the old one gone: the barrier), the step is pinned (the newest
   verified one the operator read, or none: the restored trainer resolves it), and beside
   it, with spec.checkpoint.fastTier, the newest fast-tier step held by or for every pod
   (`policy.fast_tier.pin`: its own copy, or the peer replica a live pod keeps of it, which
   its run order then names; the durable step is the fallback, and why is recorded); the
   phase is `Starting`.
3. `follow`, Starting: once every pod reports the new generation started, `status.inPlace`
   is cleared and the restart recorded as `Running`.
4. Past `spec.recovery.inPlaceDeadlineSeconds`: the whole world is re-created (the budget is
   not spent twice), recorded as `FellBack`.

A pod replaced (its node quarantined or lost) is deleted; with spec.spares, a ready warm spare
on another node takes its rank at `begin` (`policy.spares`, recorded in the attempt's
`spareRanks` before any order names it), so the barrier need not wait for the Job to create
the pod again; a pod being deleted counts as gone once its kubelet reports the terminal
phase. What a supervised exit means: `reconcile.supervised_exits`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta

from rtj_operator.api.attempts import MAX_FAST_SOURCES, InPlacePhase, InPlaceRestart
from rtj_operator.api.ledger import RecoveryPath, Replacement
from rtj_operator.api.reasons import ConditionType, FailureClass, InPlaceStage, Phase, Reason
from rtj_operator.api.status import ResilientTrainingJobStatus
from rtj_operator.policy import fast_tier, in_place, spares
from rtj_operator.policy.classify import (
    Classification,
)
from rtj_operator.policy.decide import Restart, decide
from rtj_operator.policy.intervals import auto_fast_every
from rtj_operator.policy.render import jobset_name
from rtj_operator.reconcile import elastic
from rtj_operator.reconcile import ledger as recovery_ledger
from rtj_operator.reconcile.actions import DeleteJobSet, MetricRecord
from rtj_operator.reconcile.builder import PlanBuilder, trim_evidence
from rtj_operator.reconcile.checkpoints import read_since
from rtj_operator.reconcile.converge import HANG_TEARDOWN_GRACE, delete_pods
from rtj_operator.reconcile.failure import MAX_BAD_STEPS, record_quarantine
from rtj_operator.reconcile.in_place_peers import peer_view
from rtj_operator.reconcile.in_place_records import record_entry, update_entry
from rtj_operator.reconcile.quarantine import claimant, holds_claim, record_taint
from rtj_operator.reconcile.ranks import completion_index
from rtj_operator.reconcile.supervised_exits import supervisors
from rtj_operator.reconcile.world import (
    Json,
    PollTarget,
    Snapshot,
    attempt_of,
    get_in,
    pod_name,
)
from rtj_operator.selection import operator_reads_store
from rtj_shim.wire.control import Order
from rtj_shim.wire.supervisor_report import STARTED_STATES, STOPPED_STATES, SupervisorReport

QUIET_SETTLE = timedelta(seconds=12)
"""How long a supervised exit waits for a silent pod's node to be judged (the Lease is
overdue 11 s after its last renewal; the pods' silence corroborates it at once)."""
LOST_NODE_QUIET_SETTLE = timedelta(seconds=24)
"""How long, from a lost node's last renewal (its failure's onset), its verdict waits for
another silent pod's node: two machines that die at one instant renewed their Leases up to
one renewal interval apart (10 s for a kubelet), so the second is overdue up to 10 s after
the first (11 s + 10 s, and a poll or two)."""
QUIET_CLASSES = {
    FailureClass.UNKNOWN: QUIET_SETTLE,
    FailureClass.NETWORK_FAULT: QUIET_SETTLE,
    FailureClass.NODE_LOST: LOST_NODE_QUIET_SETTLE,
}
"""The failures a silent pod may be part of, and how long each waits for its node."""
REPLACE_GRACE_SECONDS = 2


def _quiet_settling(b: PlanBuilder, found: Classification, choice: in_place.InPlaceChoice) -> bool:
    """A rank that saw its peer's socket close exits before its peer's node can be judged
    lost, and of two nodes that die together one is judged first; while a pod that is
    silent too may be on such a node, wait (QUIET_CLASSES: up to QUIET_SETTLE after the
    exit, LOST_NODE_QUIET_SETTLE after the lost node's last renewal) for the node's verdict,
    which replaces that pod too, before re-creating the whole world. True while waiting."""
    failed_at = found.failed_at
    settle = QUIET_CLASSES.get(found.failure_class)
    if not choice.quiet or failed_at is None or settle is None:
        return False
    if b.now - failed_at >= settle or b.snap.control_key is None:
        return False
    b.notes.append(
        f"in place: {', '.join(choice.quiet[:3])} silent after {found.failure_class.value}; "
        f"waiting up to {settle.total_seconds():.0f} s for its node's verdict"
    )
    b.requeue_in(1.0)
    return True


def _repeated(choice: in_place.InPlaceChoice) -> list[str]:
    """The evidence line of a pod re-created because it failed first again."""
    if choice.repeated is None:
        return []
    return [f"{choice.repeated} failed first again within "
            f"{in_place.REPEAT_WINDOW.total_seconds():.0f} s of its last restart in place: "
            "re-created, so the platform's preflight judges its node"]  # fmt: skip


def begin(
    b: PlanBuilder,
    found: Classification,
    live: Sequence[Json],
    idle: Sequence[Json] = (),
    gone: Sequence[Json] = (),
) -> bool:
    """Restart in place when the job and the failure allow it; True if it began. `idle`:
    the attempt's idle pods, of which a ready warm spare takes each replaced pod's rank;
    `gone`: the world's pods already deleted (an evicted pod may be)."""
    action = decide(b.rtj.spec, b.status, found, b.now)
    pending = action.quarantine if isinstance(action, Restart) else None
    # nodes this plan quarantines count as quarantined: their pods are deleted once the
    # taint holds (`_replace`), so a replacement is never scheduled back onto them
    quarantined = [q.node for q in b.status.quarantined_nodes]
    quarantined += pending.nodes if pending is not None else ()
    choice = in_place.choose(b.rtj, found, live, supervisors(b), quarantined, gone)
    why = choice.refused
    if why is None and b.snap.control_key is None:
        why = "the operator has no control secret (--control-secret-file)"
    if why is not None and _quiet_settling(b, found, choice):
        if pending is not None:  # the node is bad whatever the wait decides
            record_quarantine(b, found, pending)
        return True
    if why is not None:
        if b.rtj.spec.recovery.in_place:
            b.notes.append(f"not restarted in place: {why}")
        return False
    if not isinstance(action, Restart):
        return False  # the budget is spent: on_failure fails the job
    if pending is not None:
        record_quarantine(b, found, pending)
    generation = b.status.trainer_generation + 1
    first = found.first_failed
    victims = [p for p in (*live, *gone) if pod_name(p) in choice.replace]
    ranks = {pod_name(p): r for p in victims if (r := completion_index(p)) is not None}
    avoid = {
        *quarantined,
        *found.nodes_to_quarantine,
        *(n for p in victims if (n := in_place.node_of(p))),
    }
    picked = spares.pick(idle, supervisors(b), ranks, avoid) if victims else None
    took = _took(victims, ranks, idle, picked or {})
    entry = InPlaceRestart(
        generation=generation,
        failure_class=found.failure_class,
        failure_category=found.category,
        first_failed=first,
        evidence=trim_evidence([*_repeated(choice), *found.evidence]),
        detected_at=b.now,
        replaced=[f"{pod_name(p)} on {in_place.node_of(p)}" for p in victims],
        spares=took,
    )
    record_entry(b, entry)
    replacement = Replacement.SPARE if took else Replacement.POD if victims else Replacement.NONE
    recovery_ledger.open_record(
        b, RecoveryPath.IN_PLACE, found.failure_class, found.failed_at,
        detected_at=b.now, replacement=replacement, generation=generation,
    )  # fmt: skip
    if picked:
        assigned = b.status.spare_ranks
        by_name = {pod_name(p): p for p in idle}
        for spare, rank in picked.items():
            assigned = spares.assign(assigned, by_name[spare], rank)
        record = b.status.current
        if record is not None:
            b.replace_current(record.model_copy(update={"spare_ranks": assigned}))
    b.update(
        restarts=action.restarts,
        bad_steps=sorted(action.bad_steps)[-MAX_BAD_STEPS:],
        trainer_generation=generation,
        in_place=InPlacePhase(
            generation=generation, phase=InPlaceStage.STOPPING, since=b.now,
            replacing=list(choice.replace), replaced_ranks=sorted(ranks.values()),
        ),
    )  # fmt: skip
    what = found.evidence[0][:200] if found.evidence else ""
    replacing = f"replacing {', '.join(entry.replaced)}; " if entry.replaced else ""
    if took:
        replacing += f"{'; '.join(took)}; "
    b.event(
        True,
        Reason.RESTARTING_IN_PLACE,
        f"attempt {b.status.attempt}: {found.failure_class.value}; {replacing}stopping the "
        f"trainers of {sum(pod_name(p) not in choice.replace for p in live)} pods for "
        f"generation {generation} "
        f"({what})",
    )
    _replace(b, [p for p in live if pod_name(p) in choice.replace])  # the gone need nothing
    b.metrics.append(MetricRecord("failure", found.failure_class))
    b.metrics.append(MetricRecord("restart", found.failure_class, in_place=True))
    if found.failed_at is not None:
        seconds = max((b.now - found.failed_at).total_seconds(), 0.0)
        b.metrics.append(MetricRecord("detection", found.failure_class, seconds))
    b.requeue_in(1.0)
    return True


def _took(
    victims: Sequence[Json], ranks: Mapping[str, int], idle: Sequence[Json],
    picked: Mapping[str, int],
) -> list[str]:  # fmt: skip
    """The record's lines: which spare took which replaced pod's rank."""
    by_rank = {r: pod_name(p) for p in victims if (r := ranks.get(pod_name(p))) is not None}
    nodes = {pod_name(p): in_place.node_of(p) for p in idle}
    return [
        f"{spare} on {nodes.get(spare)} took rank {rank} of {by_rank.get(rank)}"
        for spare, rank in sorted(picked.items(), key=lambda kv: kv[1])
    ]


def follow(b: PlanBuilder, live: Sequence[Json]) -> bool:
    """Move an in-place restart on; True while it holds the plan (nothing else to judge)."""
    state = b.status.in_place
    if state is None:
        return False
    names = [pod_name(p) for p in live]
    reports = supervisors(b)
    if (b.now - state.since).total_seconds() > b.rtj.spec.recovery.in_place_deadline_seconds:
        why = _overdue(b, state, reports, names)
        if why is not None:
            _fall_back(b, why)
            return True
    if state.phase == InPlaceStage.STOPPING:
        old = [p for p in b.snap.pods if pod_name(p) in state.replacing]
        old = [p for p in old if not _ended(p)]
        _replace(b, old)
        waiting = in_place.reported(reports, names, state.generation, STOPPED_STATES)
        recovery_ledger.note_old_world_stopped(b, state, live, reports, old)
        world = world_size(b)
        if not old and (waiting or len(names) != world) and elastic.shrink(b, state, live):
            return True  # waiting for the replacement, or the survivors made the world
        if old or len(names) != world:
            gone = ", ".join(pod_name(p) for p in old) or "-"
            b.notes.append(f"in place: replacing: still there {gone}; {len(names)} of "
                           f"{world} pods")  # fmt: skip
            b.requeue_in(1.0)
            return True
        if waiting:
            b.notes.append(f"in place: waiting for {', '.join(waiting[:5])} to stop")
            b.requeue_in(1.0)
            return True
        if operator_reads_store(b.rtj.spec.checkpoint.uri) and not read_since(
            b, b.snap.store, state.since
        ):
            b.needs_store = True  # pin what the store holds now: a step committed just
            return True  # before the failure (its reading still under way) counts
        # a grow-back stopped a healthy world, which saved until it stopped (after the
        # store was read): its trainers resolve the newest verified step themselves
        step = None if state.world_size is not None and not state.replaced_ranks else _pin(b)
        fast = (
            fast_tier.FastPin(note=f"the world changes to {state.world_size} pods")
            if state.world_size is not None  # the ranks change: the fast tier's copies are per rank
            else fast_tier.pin(reports, names, step, b.status.bad_steps, peer_view(b, live, state))
        )
        sources = {str(i): a for i, a in sorted(fast.sources.items())[:MAX_FAST_SOURCES]}
        if state.replacing or state.replaced_ranks:
            recovery_ledger.note(b, replacement_ready_at=b.now)
        every = auto_fast_every(b.rtj, b.status)  # everySteps: auto, pinned for the generation
        update_entry(b, stopped_at=b.now, resumed_from_step=step, resumed_from_fast_step=fast.step,
                      fast_sources=sources, fast_tier_fallback=fast.note,
                      fast_every_steps=every)  # fmt: skip
        if fast.note:
            b.notes.append(f"in place: no fast-tier step: {fast.note}")
        b.update(in_place=state.model_copy(update={
            "phase": InPlaceStage.STARTING, "step": step, "fast_step": fast.step,
            "fast_lineage": fast.lineage if fast.step is not None else None,
            "fast_sources": sources, "fast_every_steps": every,
        }))  # fmt: skip
        b.requeue_in(0.5)
        return True
    waiting = in_place.reported(reports, names, state.generation, STARTED_STATES)
    if waiting:
        b.notes.append(f"in place: waiting for {', '.join(waiting[:5])} to start")
        b.requeue_in(1.0)
        return True
    record = b.status.current
    entry = record.in_place_restarts[-1] if record and record.in_place_restarts else None
    update_entry(b, started_at=b.now, outcome="Running")
    recovery_ledger.note(b, started_at=b.now)
    b.update(in_place=None)
    took = (b.now - state.since).total_seconds()
    if entry is not None and entry.failure_class is not None:
        b.metrics.append(MetricRecord("recovery", entry.failure_class, took))
    origin = f"step {state.step}" if state.step is not None else "the newest verified step"
    if state.fast_step is not None:
        durable = f"durable {origin}" if state.step is not None else origin
        copied = "".join(
            f"; pod index {i} copies it from the peer replica on {a}"
            for i, a in sorted(state.fast_sources.items())[:3]
        )
        origin = f"fast-tier step {state.fast_step} ({durable} as fallback{copied})"
    elif entry is not None and entry.fast_tier_fallback:
        origin = f"{origin} (no fast-tier step: {entry.fast_tier_fallback[:300]})"
    b.event(
        False,
        Reason.RESTARTED_IN_PLACE,
        f"attempt {b.status.attempt}: generation {state.generation} runs in every pod"
        f"{f' of a world of {state.world_size}' if state.world_size is not None else ''}, "
        f"{took:.1f}s after the failure was seen, from {origin}",
    )
    return True


def _overdue(
    b: PlanBuilder, state: InPlacePhase, reports: Mapping[str, SupervisorReport],
    names: Sequence[str],
) -> str | None:  # fmt: skip
    """Why a restart past its deadline falls back, naming what held it: the first pods whose
    supervisor had not reported the phase's goal (a hung supervisor, a pod that stopped
    answering), a replaced pod not gone, a replacement not there, the store not read. None:
    every pod already runs the new generation (it finishes; nothing to fall back from)."""
    within = f"within {b.rtj.spec.recovery.in_place_deadline_seconds}s"
    g = state.generation
    if state.phase != InPlaceStage.STOPPING:
        late = in_place.reported(reports, names, g, STARTED_STATES)
        return f"{_first(late)} had not started generation {g} {within}" if late else None
    late = in_place.reported(reports, names, g, STOPPED_STATES)
    if late:
        return f"{_first(late)} had not stopped generation {g} {within}"
    old = [pod_name(p) for p in b.snap.pods if pod_name(p) in state.replacing and not _ended(p)]
    if old:
        return f"{_first(old)} being replaced had not ended {within}"
    if len(names) != world_size(b):
        return f"{len(names)} of {world_size(b)} pods were there {within}"
    if operator_reads_store(b.rtj.spec.checkpoint.uri) and not read_since(
        b, b.snap.store, state.since
    ):
        return f"every pod stopped generation {g}, but the checkpoint store was not read {within}"
    return f"every pod stopped generation {g} only as the deadline passed ({within})"


def _first(pods: Sequence[str]) -> str:
    """The first five pod names, and how many more."""
    more = f" and {len(pods) - 5} more" if len(pods) > 5 else ""
    return f"{', '.join(pods[:5])}{more}"


def replaced_pods(status: ResilientTrainingJobStatus) -> frozenset[str]:
    """The current attempt's pods being replaced or replaced by restarts in place."""
    names = set(status.in_place.replacing if status.in_place is not None else ())
    record = status.current
    if record is not None and record.attempt == status.attempt:
        for entry in record.in_place_restarts:
            names.update(line.split(" on ", 1)[0] for line in entry.replaced)
    return frozenset(names)


def _ended(pod: Json) -> bool:
    """A pod being deleted whose processes have all ended: its kubelet reported the terminal
    phase, which it does only once every container stopped, before the final deletion
    (Kubernetes 1.27 and later, kubernetes/kubernetes#115331). The object may stay a while
    after (the Job controller removes its tracking finalizer up to its back-off later, 10 s
    for a first failure); the old world on it is gone already."""
    deleting = get_in(pod, "metadata", "deletionTimestamp") is not None
    return deleting and get_in(pod, "status", "phase") in ("Failed", "Succeeded")


def _replace(b: PlanBuilder, pods: Sequence[Json]) -> None:
    """Delete the pods being replaced (their Job creates them again, held until ordered):
    briefly, as a broken world cannot save; by force once their node is fenced or gone
    (`converge.delete_pods`), so a lost node's pod does not hold the restart. A pod whose
    node's quarantine is recorded but not yet tainted waits for the taint (a later round of
    `follow`): deleted before it, its replacement could be scheduled back onto the node."""
    waiting = _untainted_quarantines(b)
    fenced = [p for p in pods if in_place.node_of(p) not in waiting]
    if len(fenced) < len(pods):
        b.notes.append(f"in place: replacing after the taint holds on {', '.join(waiting)}")
        b.requeue_in(0.5)
    delete_pods(b, fenced, grace_seconds=REPLACE_GRACE_SECONDS)


def _untainted_quarantines(b: PlanBuilder) -> list[str]:
    """Nodes quarantined by this job whose taint the cached node does not show yet."""
    who = claimant(b)
    waiting = []
    for q in b.status.quarantined_nodes:
        node = b.snap.nodes.get(q.node)
        if node is not None and not holds_claim(node, record_taint(b, q), who):
            waiting.append(q.node)
    return waiting


def _pin(b: PlanBuilder) -> int | None:
    """The newest verified step the operator read and nobody marked bad; None: let the
    restored trainer resolve it (file:// roots, which only the pods can read)."""
    store = b.snap.store
    selection = store.selection if store is not None and store.error is None else None
    step = selection.step if selection is not None else None
    return step if step is not None and step not in b.status.bad_steps else None


def _fall_back(b: PlanBuilder, why: str) -> None:
    """Re-create the whole world (the restart was paid for when the in-place one began)."""
    n = b.status.attempt
    record = b.status.current
    entry = record.in_place_restarts[-1] if record and record.in_place_restarts else None
    update_entry(b, outcome="FellBack")
    record = b.status.current
    if record is not None and entry is not None:
        b.replace_current(record.model_copy(update={
            "ended_at": b.now, "failure_class": entry.failure_class,
            "failure_category": entry.failure_category, "first_failed": entry.first_failed,
            "evidence": trim_evidence([f"in-place restart fell back: {why}", *entry.evidence]),
        }))  # fmt: skip
    b.update(phase=Phase.RESTARTING, in_place=None, next_attempt_at=b.now)
    message = f"attempt {n}: in-place restart fell back ({why}); re-creating the whole world"
    b.condition(ConditionType.RESTARTING, True, Reason.IN_PLACE_FELL_BACK, message)
    b.condition(ConditionType.RUNNING, False, Reason.IN_PLACE_FELL_BACK, message)
    b.after.append(DeleteJobSet(jobset_name(b.rtj.metadata.name, n)))
    # briefly: the world is broken (a rank failed, the others were ordered to stop), so no
    # emergency save can be made; what still runs is what did not stop (a hung supervisor
    # ignores its SIGTERM and would hold the next attempt for the pod's whole grace)
    delete_pods(b, b.snap.pods, grace_seconds=HANG_TEARDOWN_GRACE)
    b.event(True, Reason.IN_PLACE_FELL_BACK, message)
    b.notes.append(message)


def restart_order(snap: Snapshot, target: PollTarget | None = None) -> Order | None:
    """What the progress poller sends the job's pod `target` this round (None: nothing;
    `reconcile.pod_messages`). A pod of the world gets the restart's order, a spare serving
    a replaced pod's rank with that rank, every pod the new rendezvous host once rank 0
    moved to a spare; an idle pod is held (the current generation's stop), and told to
    finish once every pod of the world has."""
    if target is None:
        return in_place.order(snap.rtj)
    return restart_orders(snap, (target,)).get(target.pod)


def restart_orders(snap: Snapshot, targets: Sequence[PollTarget]) -> dict[str, Order]:
    """`restart_order` for each of `targets` (by pod), the world read once for all of them:
    per target, the rendezvous host's search over every pod cost a round at 1,250 pods
    1.5 M pod reads once a spare served a rank."""
    rtj = snap.rtj
    assigned = rtj.status.spare_ranks
    out: dict[str, Order] = {}
    if any(t.idle for t in targets):
        idle = _idle_order(snap, assigned)
        if idle is not None:
            out.update((t.pod, idle) for t in targets if t.idle)
    if rtj.status.in_place is None:
        return out  # only idle pods have an order between restarts
    moved = spares.moved_master(snap.pods, assigned) if assigned else None
    for t in targets:
        if not t.idle:
            world, host = elastic.run_fields(snap, t.index)  # a resized world: every field
            order = in_place.order(rtj, t.index, rank=world is not None or t.pod in assigned,
                                   master_addr=host or moved, world_size=world)  # fmt: skip
            if order is not None:
                out[t.pod] = order
    return out


def world_size(b: PlanBuilder) -> int:
    """The pods the attempt's world has now: spec.replicas unless spec.elastic resized it."""
    return b.status.world_size or b.rtj.spec.replicas


def _idle_order(snap: Snapshot, assigned: Mapping[str, int]) -> Order | None:
    rtj = snap.rtj
    status = rtj.status
    world = [
        p for p in spares.serving(snap.pods, assigned, status.world_size)
        if attempt_of(p) == status.attempt
    ]  # fmt: skip
    done = bool(world) and all(get_in(p, "status", "phase") == "Succeeded" for p in world)
    if done and status.in_place is None:
        return Order(rtj.metadata.uid, status.attempt_generation, "finish")
    generation = status.in_place.generation if status.in_place else status.attempt_generation
    return Order(rtj.metadata.uid, generation, "stop")
