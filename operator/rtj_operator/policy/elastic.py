"""Elastic N-k: when to train on fewer pods, and when to grow back. Pure.

A pod that cannot be replaced (its replacement unscheduled, not admitted, no spare) holds
the whole job today. With ``spec.elastic.minReplicas`` below ``replicas`` the survivors
restart in place as a smaller world once the replacement has waited
``waitForReplacementSeconds``, and the world grows back when pods for the missing ranks
run again. This module decides; the in-place restart carries it out (a run order names each
survivor's new rank and the world size: ``rtj_shim.wire.control.Order``), resuming from the
newest step every member of the new world holds (``policy.fast_tier.pin`` over its pods:
one lineage, durable when they share no fast step; never a mix).

Ranks are renumbered in the order of the ranks the pods were created for (their natural
ranks), so rank 0 of a shrunk world is the surviving pod with the lowest natural rank (and
its host the rendezvous host), and a grow-back gives every pod its natural rank again.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from rtj_operator.api.elastic_spec import DEFAULT_WAIT_FOR_REPLACEMENT_SECONDS
from rtj_operator.api.spec import ResilientTrainingJobSpec


@dataclass(frozen=True)
class ElasticSpec:
    """spec.elastic as the decisions read it (`of`)."""

    min_replicas: int
    wait_for_replacement_seconds: int = DEFAULT_WAIT_FOR_REPLACEMENT_SECONDS
    grow_back: bool = True

    @classmethod
    def of(cls, spec: ResilientTrainingJobSpec) -> ElasticSpec:
        e = spec.elastic
        return cls(spec.elastic_minimum, e.wait_for_replacement_seconds, e.grow_back)

    def enabled(self, replicas: int) -> bool:
        return self.min_replicas < replicas


class Verdict(str, enum.Enum):
    OFF = "Off"
    """Not elastic: the whole-world path waits for a full world, as without this module."""
    FULL = "Full"
    """Every rank has its pod: nothing to do."""
    WAIT = "Wait"
    """A replacement waits, not yet for ``waitForReplacementSeconds``."""
    TOO_FEW = "TooFew"
    """Fewer survivors than ``minReplicas``: the job waits for its replacements."""
    SHRINK = "Shrink"
    GROW = "Grow"
    STAY = "Stay"
    """Shrunk, and no pod (or growBack off) to grow with."""


@dataclass(frozen=True)
class ElasticDecision:
    verdict: Verdict
    ranks: Mapping[str, int] | None = None
    """For SHRINK and GROW: each pod of the new world and its rank in it."""
    reason: str = ""
    """For the Elastic condition's message and the Event."""
    recheck_after: float | None = None
    """For WAIT: seconds until the wait is over."""

    @property
    def world_size(self) -> int | None:
        return None if self.ranks is None else len(self.ranks)


def renumber(natural: Mapping[str, int]) -> dict[str, int]:
    """Ranks 0..k-1 for the pods of `natural` (pod -> the rank it was created for), in
    the order of their natural ranks."""
    return {pod: i for i, pod in enumerate(sorted(natural, key=lambda p: (natural[p], p)))}


def on_missing(
    spec: ElasticSpec,
    replicas: int,
    survivors: Mapping[str, int],
    waiting_since: Mapping[int, float],
    now: float,
) -> ElasticDecision:
    """A full world lost ranks: `survivors` (ready pod -> natural rank) trained on, and the
    replacements of the ranks in `waiting_since` (rank -> when its replacement started to
    wait) are not running. Shrink once the longest wait reached waitForReplacementSeconds."""
    if not spec.enabled(replicas):
        return ElasticDecision(Verdict.OFF, reason="spec.elastic.minReplicas is spec.replicas")
    if not waiting_since:
        return ElasticDecision(Verdict.FULL)
    missing = sorted(waiting_since)
    if len(survivors) < spec.min_replicas:
        return ElasticDecision(
            Verdict.TOO_FEW,
            reason=f"{len(survivors)} of {replicas} pods ready, fewer than "
            f"spec.elastic.minReplicas ({spec.min_replicas}): waiting for rank(s) "
            f"{_ranks(missing)}",
        )
    waited = now - min(waiting_since.values())
    if waited < spec.wait_for_replacement_seconds:
        return ElasticDecision(
            Verdict.WAIT,
            reason=f"rank(s) {_ranks(missing)} waiting for a replacement for {waited:.0f}s of "
            f"{spec.wait_for_replacement_seconds}s",
            recheck_after=spec.wait_for_replacement_seconds - waited,
        )
    ranks = renumber(survivors)
    return ElasticDecision(
        Verdict.SHRINK,
        ranks=ranks,
        reason=f"rank(s) {_ranks(missing)} not replaced within {waited:.0f}s "
        f"(waitForReplacementSeconds: {spec.wait_for_replacement_seconds}): training on "
        f"{len(ranks)} of {replicas}",
    )


def on_shrunk(
    spec: ElasticSpec, replicas: int, world: Mapping[str, int], ready: Mapping[str, int]
) -> ElasticDecision:
    """A shrunk `world` (pod -> its rank now) trains; `ready` (pod -> natural rank) are the
    pods that could train now, the world's own among them. Grow when more are ready: to
    every ready pod, each at its natural rank once the world is whole again."""
    if not spec.grow_back:
        return ElasticDecision(Verdict.STAY, reason="spec.elastic.growBack is false")
    joining = sorted(p for p in ready if p not in world)
    if not joining:
        return ElasticDecision(Verdict.STAY)
    members = {p: r for p, r in ready.items() if p in world or p in joining}
    whole = sorted(members.values()) == list(range(replicas))
    ranks = dict(members) if whole else renumber(members)
    return ElasticDecision(
        Verdict.GROW,
        ranks=ranks,
        reason=f"{len(joining)} pod(s) ready again: growing from {len(world)} to {len(ranks)} "
        f"of {replicas}",
    )


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks)
