"""Elastic N-k in the plan (spec.elastic, issue 45): `policy.elastic` decides, this module
writes the decision into status; the in-place restart carries it out.

- `shrink`: an in-place restart stopping for a replaced pod whose replacement does not
  come (unscheduled, not admitted, no spare) waits `waitForReplacementSeconds`, then makes
  the pods that stopped the world: their ranks renumbered (`status.current.spareRanks`,
  pod -> rank where it is not the pod's own) and its size recorded
  (`status.current.worldSize`, and `status.inPlace.worldSize` for the generation that
  changes it). A pod for a rank the world lacks (the replacement, once it runs) is idle:
  held by its supervisor, no evidence of the world's health (`policy.spares`).
- `grow`: a shrunk world whose missing ranks have pods ready again (running, held) starts
  a new in-place generation as the larger world, every pod at its own rank once whole.
  No restart budget is spent; no failure is recorded (the entry names no class).
- `run_fields`: what every run order names in a world spec.elastic resized: the pod's
  rank, the world size and the rendezvous host (the supervisor keeps an order's values
  for later generations, so after any resize each run order names all three).

A resizing generation resumes from the durable step: the fast tier's copies are per rank,
and the ranks change.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rtj_operator.api.attempts import InPlacePhase, InPlaceRestart
from rtj_operator.api.reasons import ConditionType, InPlaceStage, Reason
from rtj_operator.policy import spares
from rtj_operator.policy.elastic import ElasticSpec, Verdict, on_missing, on_shrunk
from rtj_operator.reconcile.builder import PlanBuilder
from rtj_operator.reconcile.in_place_records import record_entry, update_entry
from rtj_operator.reconcile.ranks import completion_index
from rtj_operator.reconcile.supervised_exits import supervisors
from rtj_operator.reconcile.world import Json, Snapshot, attempt_of, pod_name
from rtj_shim.wire.supervisor_report import STOPPED_STATES


def shrink(b: PlanBuilder, state: InPlacePhase, live: Sequence[Json]) -> bool:
    """In a Stopping in-place restart held for a replacement: wait, or shrink the world to
    the pods that stopped. True: the plan is held (waiting, or the shrink written)."""
    replicas = b.rtj.spec.replicas
    spec = ElasticSpec.of(b.rtj.spec)
    if not spec.enabled(replicas) or state.world_size is not None or not state.replaced_ranks:
        return False
    reports = supervisors(b)
    stopped = {
        pod_name(p): rank
        for p in live
        if (r := reports.get(pod_name(p))) is not None
        and r.shows(state.generation, STOPPED_STATES)
        and (rank := completion_index(p)) is not None
    }
    missing = sorted(set(state.replaced_ranks) - set(stopped.values()))
    others = {completion_index(p) for p in live} - set(state.replaced_ranks)
    if not missing or not others <= set(stopped.values()):
        return False  # the replacement is there, or the other pods have not stopped yet
    since = state.since.timestamp()
    decision = on_missing(spec, replicas, stopped, dict.fromkeys(missing, since), b.now.timestamp())
    if decision.verdict is Verdict.WAIT:
        b.notes.append(f"elastic: {decision.reason}")
        b.requeue_in(min(decision.recheck_after or 1.0, 1.0))
        return True
    if decision.verdict is not Verdict.SHRINK or decision.ranks is None:
        if decision.reason:
            b.notes.append(f"elastic: {decision.reason}")
        return False
    _resize(b, decision.ranks)
    b.update(in_place=state.model_copy(update={"world_size": len(decision.ranks)}))
    update_entry(b, world_size=len(decision.ranks))
    message = f"attempt {b.status.attempt}: {decision.reason}"
    b.event(True, Reason.SHRUNK, message)
    b.condition(ConditionType.ELASTIC, True, Reason.SHRUNK, message)
    b.requeue_in(0.2)
    return True


def grow(b: PlanBuilder, live: Sequence[Json], idle: Sequence[Json]) -> bool:
    """A shrunk world with pods ready for its missing ranks starts growing (a new in-place
    generation, Stopping); True if it began."""
    replicas, world = b.rtj.spec.replicas, b.status.world_size
    if world is None or world >= replicas or b.status.in_place is not None:
        return False
    reports = supervisors(b)
    natural = _natural_ranks(b.snap, replicas)
    members = {pod_name(p): r for p in live if (r := completion_index(p)) is not None}
    ready = {
        name: natural[name]
        for p in idle
        if (name := pod_name(p)) in natural and spares.ready(p, reports.get(name))
    }
    ready.update((name, natural[name]) for name in members if name in natural)
    decision = on_shrunk(ElasticSpec.of(b.rtj.spec), replicas, members, ready)
    if decision.verdict is not Verdict.GROW or decision.ranks is None:
        return False
    generation = b.status.trainer_generation + 1
    size = len(decision.ranks)
    record_entry(b, InPlaceRestart(generation=generation, detected_at=b.now, world_size=size,
                                   evidence=[decision.reason]))  # fmt: skip
    _resize(b, decision.ranks)
    b.update(
        trainer_generation=generation,
        in_place=InPlacePhase(generation=generation, phase=InPlaceStage.STOPPING, since=b.now,
                              world_size=size),
    )  # fmt: skip
    message = f"attempt {b.status.attempt}: {decision.reason}"
    b.event(False, Reason.GROWING_BACK,
            f"{message}; stopping the trainers for generation {generation}")  # fmt: skip
    b.condition(ConditionType.ELASTIC, size < replicas, Reason.GROWING_BACK, message)
    b.requeue_in(1.0)
    return True


def run_fields(snap: Snapshot, rank: int | None) -> tuple[int | None, str | None]:
    """(world size, rendezvous host) a run order names in a world spec.elastic resized
    (None, None otherwise: the pods' own)."""
    status = snap.rtj.status
    world = status.world_size
    if world is None or rank is None:
        return None, None
    assigned = status.spare_ranks
    holder = next(
        (p for p in snap.pods if spares.rank_of(p, assigned, world) == 0 and _current(snap, p)),
        None,
    )
    return world, spares.host(holder) if holder is not None else None


def _resize(b: PlanBuilder, ranks: Mapping[str, int]) -> None:
    record = b.status.current
    if record is None:
        return
    assigned = spares.renumbered(ranks, b.snap.pods)
    b.replace_current(record.model_copy(update={"spare_ranks": assigned,
                                                "world_size": len(ranks)}))  # fmt: skip


def _natural_ranks(snap: Snapshot, replicas: int) -> dict[str, int]:
    """The current attempt's pods by name -> the rank each was created for (a spare: a key
    past every worker's, in name order, so it takes the ranks no worker pod holds last)."""
    pods = sorted((p for p in snap.pods if _current(snap, p)), key=pod_name)
    out: dict[str, int] = {}
    for i, pod in enumerate(pods):
        natural = spares.natural_rank(pod)
        out[pod_name(pod)] = natural if natural is not None else replicas + i
    return out


def _current(snap: Snapshot, pod: Json) -> bool:
    return attempt_of(pod) == snap.rtj.status.attempt
