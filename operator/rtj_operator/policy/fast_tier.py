"""The fast checkpoint tier (spec.checkpoint.fastTier, issue 16). Pure.

Rendering: the trainer saves each rank's state every few steps into a pod-local emptyDir
(:func:`render`); the progress sidecar mounts it (read-write with a peer replica, which it
keeps under ``peer/``: `policy.peer_replica`) and reports the newest step every rank of its
pod holds (``fast_tier`` in ``GET /progress``), which :func:`summary` turns into the job's
fast-tier step and age. Deciding: at an in-place restart's barrier each pod's supervisor
reports with ``stopped`` the fast steps every rank of its pod holds, each holder's sidecar
the steps it keeps of its source, and the newest step held by or for every pod is pinned
beside the durable one (:func:`pin`), which stays the fallback.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from rtj_operator.api import keys
from rtj_operator.api.resource import ResilientTrainingJob
from rtj_operator.policy import peer_replica
from rtj_operator.policy.intervals import AUTO_FAST_EVERY_START, auto_fast_every
from rtj_operator.policy.peer_replica import PeerView
from rtj_shim.checkpoint import lineage
from rtj_shim.checkpoint.lineage import Held
from rtj_shim.wire.supervisor_report import SupervisorReport

Obj = dict[str, Any]


def fast_every(rtj: ResilientTrainingJob) -> int:
    """The steps between fast saves a new world's pods start with: the job's, or for
    `everySteps: auto` what the operator chose last (`AUTO_FAST_EVERY_START` before a choice)."""
    tier = rtj.spec.checkpoint.fast_tier
    assert tier is not None
    if isinstance(tier.every_steps, int):
        return tier.every_steps
    return auto_fast_every(rtj, rtj.status) or AUTO_FAST_EVERY_START


def replicated(rtj: ResilientTrainingJob) -> bool:
    """Whether the job's pods keep a peer replica of each other's fast steps
    (spec.checkpoint.fastTier.peerReplicas)."""
    tier = rtj.spec.checkpoint.fast_tier
    return tier is not None and tier.peer_replicas > 0


def render(spec: Obj, rtj: ResilientTrainingJob, trainer_name: str) -> bool:
    """Give the trainer container the fast tier's emptyDir and the environment the shim
    reads it from, and the progress sidecar the same volume (the rendered pod spec, changed
    in place): read-only, or read-write with a peer replica (the sidecar writes its source's
    copies under ``peer/`` and, in a replaced pod, the step it copies back; it also gets
    ``RTJ_FAST_KEEP``, the steps it keeps of its source). False (nothing changed) when
    spec.checkpoint.fastTier is unset. Only with the supervisor: a re-created pod starts
    with an empty emptyDir, so only a restart in place finds the fast tier again (its own,
    or with a peer replica the copy another pod holds)."""
    tier = rtj.spec.checkpoint.fast_tier
    trainer = next((c for c in spec["containers"] if c.get("name") == trainer_name), None)
    if tier is None or trainer is None:
        return False
    ours = [
        {"name": keys.ENV_FAST_TIER_DIR, "value": keys.FAST_TIER_DIR},
        {"name": keys.ENV_FAST_EVERY_STEPS, "value": str(fast_every(rtj))},
        {"name": keys.ENV_FAST_KEEP, "value": str(tier.keep)},
    ]
    owned = {e["name"] for e in ours}  # the operator's values win over stale user ones
    trainer["env"] = [*(e for e in trainer.get("env", []) if e.get("name") not in owned), *ours]
    mount = {"name": keys.FAST_TIER_VOLUME, "mountPath": keys.FAST_TIER_DIR}
    trainer["volumeMounts"] = [
        *(m for m in trainer.get("volumeMounts", []) if m.get("name") != keys.FAST_TIER_VOLUME),
        mount,
    ]
    sidecar = next(
        (c for c in spec.get("initContainers", []) if c.get("name") == keys.PROGRESS_SIDECAR),
        None,
    )
    if sidecar is not None:  # reads what the pod holds, for status and metrics
        replica = replicated(rtj)  # and writes its source's copies (peer/) and copies back
        env = [{"name": keys.ENV_FAST_TIER_DIR, "value": keys.FAST_TIER_DIR}]
        if replica:
            env.append({"name": keys.ENV_FAST_KEEP, "value": str(tier.keep)})
        mine = {e["name"] for e in env}
        sidecar["env"] = [*(e for e in sidecar.get("env", []) if e.get("name") not in mine), *env]
        sidecar["volumeMounts"] = [
            *(m for m in sidecar.get("volumeMounts", [])
              if m.get("name") != keys.FAST_TIER_VOLUME),
            dict(mount) if replica else {**mount, "readOnly": True},
        ]  # fmt: skip
    empty_dir: Obj = {}
    if tier.medium == "Memory":
        empty_dir["medium"] = "Memory"
    if tier.size_limit is not None:
        empty_dir["sizeLimit"] = tier.size_limit
    spec["volumes"] = [
        *(v for v in spec.get("volumes", []) if v.get("name") != keys.FAST_TIER_VOLUME),
        {"name": keys.FAST_TIER_VOLUME, "emptyDir": empty_dir},
    ]
    return True


MAX_NOTE = 480
"""The fallback reason's length at most (status.inPlace's entry keeps 512)."""


@dataclass(frozen=True)
class FastPin:
    """The fast-tier step pinned at an in-place restart's barrier (None: the durable step
    alone), the peer replicas the pods that do not hold it copy it from (completion index
    -> the holder's progress sidecar, ``ip:port``), and why none was pinned."""

    step: int | None = None
    sources: Mapping[int, str] = field(default_factory=dict)
    note: str | None = None
    lineage: str | None = None  # the history `step` is of on every pod (checkpoint.lineage)


def pin(
    reports: Mapping[str, SupervisorReport],
    pods: Sequence[str],
    durable_step: int | None,
    bad_steps: Collection[int],
    peers: PeerView | None = None,
) -> FastPin:
    """The fast-tier step to pin beside `durable_step`: the newest step every pod holds
    in one lineage (one history: `FastPin.lineage`), in its own fast tier (its supervisor's
    `fast_held`; a step of unknown lineage is never pinned) or, with `peers`, in the peer
    replica a live pod keeps of it (the holder's ``replica.steps``; the pod then copies it
    from there: `sources`); not marked bad, and no older than the durable step (an older
    one would lose steps the store already has; None: the operator could not read the
    store, and any goes). A pod's own copy is preferred. No step when none is held by or for
    every pod; the note then says why, naming the pod (none when no pod keeps a fast tier)."""
    if not pods:
        return FastPin()
    peers = peers or PeerView()
    own = {pod: r.holdings if (r := reports.get(pod)) is not None else frozenset() for pod in pods}
    listed = any(r.lists_fast_tier for p in pods if (r := reports.get(p)) is not None)
    held = peer_replica.holders(peers)
    kept = {pod: held.get(peers.indexes[pod], []) if pod in peers.indexes else [] for pod in pods}

    def usable(step: int) -> bool:
        return step not in bad_steps and (durable_step is None or step >= durable_step)

    candidates = {h for p in pods for h in own[p] if h.pinnable and usable(h.step)}
    for candidate in sorted(candidates, reverse=True):
        sources = _sources(candidate, pods, own, kept, peers)
        if sources is not None:
            return FastPin(candidate.step, sources, lineage=candidate.lineage)
    if not listed and not held:
        return FastPin()  # no fast tier in these pods
    steps = {p: frozenset(h.step for h in own[p] if h.pinnable) for p in pods}
    return FastPin(note=_why(pods, steps, kept, peers, usable, durable_step)[:MAX_NOTE])


def _sources(
    candidate: Held,
    pods: Sequence[str],
    own: Mapping[str, frozenset[Held]],
    kept: Mapping[str, list[tuple[str, frozenset[int]]]],
    peers: PeerView,
) -> dict[int, str] | None:
    """Where each pod that does not hold `candidate` itself copies it from (None: some pod
    can get it nowhere). A holder's copy must be of `candidate`'s lineage too (its
    replica's ``held``); an older sidecar's report has steps alone, and the restoring
    trainer's check of every rank's lineage then guards the copy (else the durable tier)."""
    sources: dict[int, str] = {}
    for pod in pods:
        if candidate in own[pod]:
            continue
        holder = next(
            (h for h, steps in kept[pod]
             if candidate.step in steps and h in peers.addresses
             and _replica_holds(peers.replicas.get(h), candidate)),
            None,
        )  # fmt: skip
        if holder is None:
            return None
        sources[peers.indexes[pod]] = peers.addresses[holder]
    return sources


def _replica_holds(report: Mapping[str, Any] | None, candidate: Held) -> bool:
    """Whether a holder's replica report shows `candidate` in its lineage (steps alone,
    from a sidecar without lineages: any)."""
    pairs = (report or {}).get("held")
    return not isinstance(pairs, list) or candidate in lineage.parse_all(pairs)


def _why(
    pods: Sequence[str],
    own: Mapping[str, frozenset[int]],
    kept: Mapping[str, list[tuple[str, frozenset[int]]]],
    peers: PeerView,
    usable: Callable[[int], bool],
    durable_step: int | None,
) -> str:
    """Why no fast step is held by or for every pod, in plain words naming the first pod
    (by completion index) that has none."""

    def name(pod: str) -> str:
        index = peers.indexes.get(pod)
        return f"pod index {index} ({pod})" if index is not None else f"pod {pod}"

    good = "at least the durable step and not marked bad" if durable_step is not None else (
        "not marked bad")  # fmt: skip
    order = sorted(pods, key=lambda p: (peers.indexes.get(p, 1 << 30), p))
    copies = {p: frozenset[int]().union(*(steps for _, steps in kept[p])) for p in pods}
    for pod in order:
        if any(map(usable, own[pod] | copies[pod])):
            continue
        mine = f"holds no fast step {good}" if own[pod] else "holds no fast step"
        if kept[pod]:
            held = f" {good}" if copies[pod] else ""
            return f"{name(pod)} {mine} and its replica on {name(kept[pod][0][0])} holds none{held}"
        return f"{name(pod)} {mine} and no pod holds its replica{_no_holder(peers, pod, name)}"
    shown = "; ".join(
        f"{name(p)} {', '.join(str(s) for s in sorted(filter(usable, own[p] | copies[p]))[-3:])}"
        for p in order[:4]
    )
    return f"no fast step {good} is held by or for every pod ({shown})"


def _no_holder(peers: PeerView, pod: str, name: Callable[[str], str]) -> str:
    """Why no live pod holds `pod`'s replica, when the reports tell."""
    if not any(isinstance(r, Mapping) for r in peers.replicas.values()):
        return " (no pod keeps a peer replica)"
    index = peers.indexes.get(pod)
    holder = peer_replica.holder_index(peers, index) if index is not None else None
    if holder is None:
        return ""
    if holder in peers.replaced:
        return f" (its holder, pod index {holder}, was replaced too)"
    by_index = {i: p for p, i in peers.indexes.items()}
    return f" (its holder, {name(by_index[holder])}, does not report holding it)"


def summary(
    tiers: Mapping[str, Mapping[str, Any] | None], pods: Sequence[str]
) -> tuple[int, datetime] | None:
    """The job's fast-tier step: the newest step every pod's sidecar reports holding (each
    reports only its newest, so this is the oldest of those), and when it became complete on
    every pod (the latest of their times). None while a pod reports none."""
    found: list[tuple[int, float]] = []
    for pod in pods:
        tier = tiers.get(pod)
        step = tier.get("step") if isinstance(tier, Mapping) else None
        when = tier.get("committed_wall_time") if isinstance(tier, Mapping) else None
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            return None
        if not isinstance(when, int | float) or isinstance(when, bool):
            return None
        found.append((step, float(when)))
    if not found:
        return None
    step = min(s for s, _ in found)
    when = max(t for _, t in found)
    return step, datetime.fromtimestamp(when, timezone.utc)
