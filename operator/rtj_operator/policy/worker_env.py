"""The environment and mounts the operator renders into a worker's containers: what rtj-shim
reads (the shim's side of the contract is `rtj_shim.wire.pod_env`), torchrun's rendezvous,
and the resume and progress volumes. Pure; `policy.render` assembles the pod with them.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from rtj_operator.api import keys
from rtj_operator.api.resource import ResilientTrainingJob

Obj = dict[str, Any]
GPU_RESOURCE = "nvidia.com/gpu"


def master_addr(jobset: str) -> str:
    """Rank 0's stable hostname: JobSet pod hostname + subdomain (the headless Service)."""
    return f"{jobset}-{keys.WORKER_REPLICATED_JOB}-0-0.{jobset}"


def env_var(name: str, value: object) -> Obj:
    return {"name": name, "value": str(value)}


def field_env(name: str, annotation: str) -> Obj:
    return field_ref_env(name, f"metadata.annotations['{annotation}']")


def field_ref_env(name: str, path: str) -> Obj:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def shim_env(rtj: ResilientTrainingJob, attempt: int, resume: int | None) -> list[Obj]:
    """What rtj-shim reads: run, attempt, provenance, resume file, retention, protected step."""
    spec, prov = rtj.spec, rtj.spec.provenance
    env = [
        env_var(keys.ENV_RUN_ID, rtj.run_id),
        env_var(keys.ENV_ATTEMPT, attempt),
        env_var(keys.ENV_CHECKPOINT_URI, spec.checkpoint.uri),
        env_var(keys.ENV_RESUME_FILE, keys.DEFAULT_RESUME_FILE),
        env_var(keys.ENV_KEEP_LAST, spec.checkpoint.retention.keep_last),
        env_var(keys.ENV_EMERGENCY_SAVE_SECONDS, spec.checkpoint.emergency_save_seconds),
    ]
    optional = {
        keys.ENV_CODE_COMMIT: prov.code_commit,
        keys.ENV_IMAGE_DIGEST: prov.image_digest,
        keys.ENV_DATASET_SNAPSHOT: prov.dataset_snapshot,
        keys.ENV_KEEP_EVERY: spec.checkpoint.retention.keep_every,
        keys.ENV_MAX_WRITE_BYTES_PER_SECOND: spec.checkpoint.max_write_bytes_per_second,
        keys.ENV_RESUME_STEP: resume,
        keys.ENV_PROTECT_STEP: resume,
    }
    return env + [env_var(k, v) for k, v in optional.items() if v is not None]


def worker_env(rtj: ResilientTrainingJob, attempt: int, resume: int | None, js: str) -> list[Obj]:
    """Shim env plus torchrun-style rendezvous env (PET_* are torchrun's own defaults)."""
    addr, port, nodes = master_addr(js), rtj.spec.master_port, rtj.spec.replicas
    rank = keys.JOB_COMPLETION_INDEX
    return [
        *shim_env(rtj, attempt, resume),
        env_var(keys.ENV_MASTER_ADDR, addr),
        env_var(keys.ENV_MASTER_PORT, port),
        env_var(keys.ENV_WORLD_SIZE, nodes),
        env_var(keys.ENV_NNODES, nodes),
        field_env(keys.ENV_NODE_RANK, rank),
        field_env(keys.ENV_RANK, rank),
        env_var("PET_MASTER_ADDR", addr),
        env_var("PET_MASTER_PORT", port),
        env_var("PET_NNODES", nodes),
        field_env("PET_NODE_RANK", rank),
    ]


def merge_env(user: Iterable[Obj], ours: list[Obj]) -> list[Obj]:
    """The operator's variables win: a stale user RTJ_ATTEMPT would break the protocol."""
    owned = {e["name"] for e in ours}
    return [e for e in user if e.get("name") not in owned] + ours


def resume_mount(read_only: bool) -> Obj:
    return {"name": keys.RESUME_VOLUME, "mountPath": keys.RESUME_DIR, "readOnly": read_only}


def nproc_per_node(container: Obj) -> list[Obj]:
    """`PET_NPROC_PER_NODE` as Kubeflow Trainer sets it for torchrun: one process per GPU
    the container asks for. Only when the user set none and the container asks for GPUs
    (torchrun's own default, 1, stays otherwise)."""
    if any(e.get("name") == "PET_NPROC_PER_NODE" for e in container.get("env") or []):
        return []
    resources = container.get("resources") or {}
    gpus = (resources.get("limits") or {}).get(GPU_RESOURCE) or (
        resources.get("requests") or {}
    ).get(GPU_RESOURCE)
    try:
        count = int(str(gpus))
    except ValueError:
        return []
    return [env_var("PET_NPROC_PER_NODE", count)] if count > 0 else []


def progress_mount(read_only: bool) -> Obj:
    return {"name": keys.PROGRESS_VOLUME, "mountPath": keys.PROGRESS_DIR, "readOnly": read_only}


def worker_container(container: Obj, env: list[Obj], progress: bool = True) -> Obj:
    out = copy.deepcopy(container)
    ours = [*env, *nproc_per_node(container)]
    mounts = [resume_mount(read_only=True)]
    if progress:
        ours.append(env_var(keys.ENV_PROGRESS_DIR, keys.PROGRESS_DIR))
        mounts.append(progress_mount(read_only=False))
    out["env"] = merge_env(out.get("env", []), ours)
    owned = {m["name"] for m in mounts}
    kept = [m for m in out.get("volumeMounts", []) if m.get("name") not in owned]
    out["volumeMounts"] = [*kept, *mounts]
    out.setdefault("terminationMessagePolicy", "FallbackToLogsOnError")
    return out
