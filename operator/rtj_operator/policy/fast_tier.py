"""The fast checkpoint tier (spec.checkpoint.fastTier, issue 16). Pure.

Rendering: the trainer saves each rank's state every few steps into a pod-local emptyDir
(:func:`render`); the progress sidecar mounts it read-only and reports the newest step every
rank of its pod holds (``fast_tier`` in ``GET /progress``), which :func:`summary` turns into
the job's fast-tier step and age. Deciding: at an in-place restart's barrier each pod's
supervisor reports with ``stopped`` the fast steps every rank of its pod holds, and the step
every pod holds is pinned beside the durable one (:func:`pin`), which stays the fallback.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from rtj_operator.api import keys
from rtj_operator.api.resource import ResilientTrainingJob

Obj = dict[str, Any]


def render(spec: Obj, rtj: ResilientTrainingJob, trainer_name: str) -> bool:
    """Give the trainer container the fast tier's emptyDir and the environment the shim
    reads it from, and the progress sidecar the same volume read-only (the rendered pod
    spec, changed in place); False (nothing changed) when
    spec.checkpoint.fastTier is unset. Only with the supervisor: a re-created pod starts
    with an empty emptyDir, so only a restart in place finds the fast tier again."""
    tier = rtj.spec.checkpoint.fast_tier
    trainer = next((c for c in spec["containers"] if c.get("name") == trainer_name), None)
    if tier is None or trainer is None:
        return False
    ours = [
        {"name": keys.ENV_FAST_TIER_DIR, "value": keys.FAST_TIER_DIR},
        {"name": keys.ENV_FAST_EVERY_STEPS, "value": str(tier.every_steps)},
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
        sidecar["env"] = [
            *(e for e in sidecar.get("env", []) if e.get("name") != keys.ENV_FAST_TIER_DIR),
            {"name": keys.ENV_FAST_TIER_DIR, "value": keys.FAST_TIER_DIR},
        ]
        sidecar["volumeMounts"] = [
            *(m for m in sidecar.get("volumeMounts", [])
              if m.get("name") != keys.FAST_TIER_VOLUME),
            {**mount, "readOnly": True},
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


def pin(
    reports: Mapping[str, Mapping[str, Any]],
    pods: Sequence[str],
    durable_step: int | None,
    bad_steps: Collection[int],
) -> int | None:
    """The fast-tier step to pin beside `durable_step`: the newest step every pod's
    supervisor reports holding (`fast_steps`), not marked bad, and no older than the durable
    step (an older one would lose steps the store already has; None: the operator could not
    read the store, and any common fast step goes). None when a pod has no report or no
    list (no fast tier there: the durable step alone)."""
    common: set[int] | None = None
    for pod in pods:
        held = (reports.get(pod) or {}).get("fast_steps")
        if not isinstance(held, list):
            return None
        steps = {s for s in held if isinstance(s, int) and not isinstance(s, bool) and s >= 0}
        common = steps if common is None else common & steps
    usable = [
        s for s in common or ()
        if s not in bad_steps and (durable_step is None or s >= durable_step)
    ]  # fmt: skip
    return max(usable, default=None)


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
