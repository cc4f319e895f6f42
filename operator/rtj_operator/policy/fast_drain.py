"""The fast tier's drain to the durable store (spec.checkpoint.fastTier.drainEverySteps,
issue 16). Pure.

The progress sidecar of the pod holding rank 0 (completion index 0) publishes every fast step
that is a multiple of ``drainEverySteps`` as a durable step (`rtj_shim.fast.drain_sidecar`),
reading the other ranks' files from their pods' sidecars. Rendering (:func:`render`): every
pod's sidecar gets what the shim needs to write the store (the run, the root, retention,
the credentials secret, the trainer's volume mounts for a ``file://`` root on a shared
volume) and memory for the uploads; the operator orders only index 0's. Deciding
(:func:`order`): the signed order names the writer attempt of the running world (``a``, or
``a.g`` after in-place restarts, as the trainers write) and the other pods' sidecars; it is
sent again whenever index 0's report (``drain`` in ``GET /progress``) does not show it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rtj_operator.api import keys
from rtj_operator.api.resource import ResilientTrainingJob
from rtj_shim.wire.control import writer_attempt
from rtj_shim.wire.drain_order import peers_digest

Obj = dict[str, Any]

DRAIN_MEMORY_LIMIT = "1Gi"
"""The sidecar's memory limit with a drain: up to 4 files uploaded at once, each with up to
5 parts of 16 MiB in memory on S3 (`rtj_shim.checkpoint.storage.s3_upload`), 320 MiB, plus Python
and boto3."""
DRAIN_MEMORY_REQUEST = "128Mi"


def drained(rtj: ResilientTrainingJob) -> bool:
    tier = rtj.spec.checkpoint.fast_tier
    return tier is not None and tier.drain_every_steps is not None


def render(spec: Obj, rtj: ResilientTrainingJob, store_env: Sequence[Obj], trainer: Obj) -> bool:
    """Give the pod's progress sidecar what the drain needs (the rendered pod spec, changed
    in place); ``store_env``: what the shim reads to write the store (run, root, retention).
    False (nothing changed) without a drain or a sidecar."""
    sidecar = next(
        (c for c in spec.get("initContainers", []) if c.get("name") == keys.PROGRESS_SIDECAR),
        None,
    )
    if not drained(rtj) or sidecar is None:
        return False
    names = {e["name"] for e in store_env}
    sidecar["env"] = [
        *(e for e in sidecar.get("env", []) if e.get("name") not in names),
        *(dict(e) for e in store_env),
    ]
    secret = rtj.spec.checkpoint.credentials_secret_name
    if secret is not None:
        sidecar["envFrom"] = [{"secretRef": {"name": secret}}]
    mounted = {m.get("name") for m in sidecar.get("volumeMounts", [])}
    ours = {keys.RESUME_VOLUME, keys.PROGRESS_VOLUME, keys.FAST_TIER_VOLUME}
    sidecar["volumeMounts"] = [
        *sidecar.get("volumeMounts", []),
        *(dict(m) for m in trainer.get("volumeMounts", [])
          if m.get("name") not in mounted and m.get("name") not in ours),
    ]  # fmt: skip
    resources = sidecar.setdefault("resources", {})
    resources.setdefault("requests", {})["memory"] = DRAIN_MEMORY_REQUEST
    resources.setdefault("limits", {})["memory"] = DRAIN_MEMORY_LIMIT
    return True


@dataclass(frozen=True)
class DrainTarget:
    """The pod whose sidecar drains (completion index 0) and what its order says."""

    pod: str
    attempt: str
    every_steps: int
    peers: tuple[str, ...]


def order(
    rtj: ResilientTrainingJob,
    generation: int,
    members: Mapping[int, tuple[str, str]],
) -> DrainTarget | None:
    """The drain order of the running world: ``members`` maps each running pod's completion
    index to (pod name, sidecar address). None without a drain, without index 0, or while
    some pod of the world has no address yet (every rank's file is needed)."""
    tier = rtj.spec.checkpoint.fast_tier
    if tier is None or tier.drain_every_steps is None or 0 not in members:
        return None
    if sorted(members) != list(range(rtj.spec.replicas)):
        return None
    peers = tuple(address for index, (_, address) in sorted(members.items()) if index != 0)
    return DrainTarget(
        members[0][0], writer_attempt(rtj.status.attempt, generation), tier.drain_every_steps,
        peers,
    )  # fmt: skip


def shown(target: DrainTarget, report: Mapping[str, Any] | None) -> bool:
    """Whether index 0's sidecar report shows it follows ``target`` (then nothing is sent)."""
    if not report:
        return False
    return (
        report.get("attempt") == target.attempt
        and report.get("every_steps") == target.every_steps
        and report.get("peers_digest") == peers_digest(target.peers)
    )


def drained_step(reports: Mapping[str, Mapping[str, Any] | None]) -> int | None:
    """The newest step the pods' drains report handled (published, or the trainers' own)."""
    steps = [
        r["step"] for r in reports.values()
        if r and isinstance(r.get("step"), int) and not isinstance(r.get("step"), bool)
    ]  # fmt: skip
    return max(steps) if steps else None
