"""The goodput soak's baseline, as a user would write it without the operator. Pure.

A JobSet (jobset.x-k8s.io/v1alpha2, JobSet v0.11.1 as the local cluster pins it) with one
replicated job of `replicas` pods, `failurePolicy.maxRestarts` large and no rules (so every
failed Job is the default action, RestartJobSet, with the default Recreate strategy: all
Jobs deleted, foreground, and created again), `backoffLimit: 0` and `restartPolicy: Never`
(one failed pod fails its Job), labelled for the Kueue LocalQueue. Each pod runs torchrun
with the static rendezvous JobSet's own examples use: rank 0's stable hostname
`<jobset>-<rjob>-0-0.<jobset>` (the headless Service, `network.enableDNSHostnames`) as the
master address, the Job completion index as the node rank. The trainer is
examples/ddp_train.py with `--plain-checkpoints` on a shared volume (a PersistentVolumeClaim
bound to a static PersistentVolume: the NFS share a user would mount; on the pod runner
every node sees one claim directory), its step logs in an emptyDir, one directory per
JobSet restart (`jobset.sigs.k8s.io/restart-attempt`, the harness tells attempts apart by
it).
"""

from __future__ import annotations

import io
import struct
import zipfile
from collections.abc import Mapping, Sequence
from typing import Any

Obj = dict[str, Any]

NAME = "baseline"
RJOB = "worker"
CLAIM = "baseline-checkpoints"
CKPT_DIR = "/checkpoints"
LOG_DIR = "/var/log/train"
MAX_RESTARTS = 1000
RESTARTS_LABEL = "jobset.sigs.k8s.io/restart-attempt"
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
JOBSET_UID_LABEL = "jobset.sigs.k8s.io/jobset-uid"
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


LAUNCHERS = ("torchrun", "nvrx")
NVRX_HEARTBEAT_TIMEOUTS = (60, 15)
"""NVRx's ``--ft-initial-rank-heartbeat-timeout`` (the first heartbeat: the trainer's import,
rendezvous and resume) and ``--ft-rank-heartbeat-timeout`` (between two steps), in seconds:
the operator's soak detects a hang after ``hangTimeoutSeconds`` 15 too."""


def master_addr(name: str = NAME) -> str:
    return f"{name}-{RJOB}-0-0.{name}"


def launcher_command(launcher: str, replicas: int) -> list[str]:
    """How each pod starts its trainer: ``torchrun`` with the static rendezvous JobSet's own
    examples use (a failed rank fails the pod: its JobSet restarts), or NVRx's ``ft_launcher``
    (nvidia-resiliency-ext) as its fault-tolerance guide sets it up: torchrun's elastic agent
    with the c10d rendezvous on rank 0's host, its rank monitor's heartbeat timeouts, and
    in-job restarts: a failed or hung rank restarts every pod's worker group in place (the
    agents rendezvous again), up to ``--max-restarts`` times, before the pod fails."""
    if launcher == "torchrun":
        return ["torchrun", f"--nnodes={replicas}", "--nproc-per-node=1",
                "--node-rank=$(NODE_RANK)", "--master-addr=$(MASTER_ADDR)",
                "--master-port=$(MASTER_PORT)"]  # fmt: skip
    if launcher == "nvrx":
        initial, every = NVRX_HEARTBEAT_TIMEOUTS
        return ["ft_launcher", f"--nnodes={replicas}", "--nproc-per-node=1",
                "--rdzv-backend=c10d", "--rdzv-endpoint=$(MASTER_ADDR):$(MASTER_PORT)",
                "--rdzv-id=$(JOBSET_UID)-$(RESTART_ATTEMPT)", f"--max-restarts={MAX_RESTARTS}",
                f"--ft-initial-rank-heartbeat-timeout={initial}",
                f"--ft-rank-heartbeat-timeout={every}"]  # fmt: skip
    raise ValueError(f"launcher: expected one of {', '.join(LAUNCHERS)}, got {launcher!r}")


def jobset(
    namespace: str,
    queue: str,
    replicas: int,
    trainer_args: Sequence[str],
    *,
    name: str = NAME,
    claim: str = CLAIM,
    launcher: str = "torchrun",
) -> Obj:
    """The JobSet a careful user writes for `replicas` workers of ddp_train under
    `launcher` (`launcher_command`)."""
    command = [
        *launcher_command(launcher, replicas),
        "examples/ddp_train.py", f"--plain-checkpoints={CKPT_DIR}",
        f"--log-dir={LOG_DIR}/restart-$(RESTART_ATTEMPT)", *trainer_args,
        *(["--nvrx-heartbeats"] if launcher == "nvrx" else []),
    ]  # fmt: skip
    container = {
        "name": "trainer",
        "image": "ghcr.io/example/rtj-trainer:dev",
        "command": command,
        "env": [
            {"name": "MASTER_ADDR", "value": master_addr(name)},
            {"name": "MASTER_PORT", "value": "29500"},
            field_env("NODE_RANK", f"metadata.annotations['{INDEX_ANNOTATION}']"),
            field_env("RESTART_ATTEMPT", f"metadata.labels['{RESTARTS_LABEL}']"),
            field_env("JOBSET_UID", f"metadata.labels['{JOBSET_UID_LABEL}']"),
        ],
        "resources": {
            "requests": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"},
            "limits": {"memory": "2Gi", "nvidia.com/gpu": "1"},
        },
        "volumeMounts": [
            {"name": "train-logs", "mountPath": LOG_DIR},
            {"name": "checkpoints", "mountPath": CKPT_DIR},
        ],
    }
    pod_spec = {
        "restartPolicy": "Never",
        "containers": [container],
        "volumes": [
            {"name": "train-logs", "emptyDir": {}},
            {"name": "checkpoints", "persistentVolumeClaim": {"claimName": claim}},
        ],
    }
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": namespace, "labels": {QUEUE_LABEL: queue}},
        "spec": {
            "suspend": True,  # Kueue admits it (its JobSet samples say so too)
            "failurePolicy": {"maxRestarts": MAX_RESTARTS},
            "network": {"enableDNSHostnames": True},
            "replicatedJobs": [
                {
                    "name": RJOB,
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "parallelism": replicas,
                            "completions": replicas,
                            "completionMode": "Indexed",
                            "backoffLimit": 0,
                            "template": {"spec": pod_spec},
                        }
                    },
                }
            ],
        },
    }


def field_env(name: str, path: str) -> Obj:
    """An environment variable from the downward API (`fieldRef`)."""
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def shared_volume(namespace: str, *, claim: str = CLAIM) -> tuple[Obj, Obj]:
    """A static PersistentVolume (hostPath standing for the NFS share) and its claim."""
    pv_name = f"{namespace}-{claim}"
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": pv_name},
        "spec": {
            "capacity": {"storage": "10Gi"},
            "accessModes": ["ReadWriteMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "hostPath": {"path": f"/srv/{pv_name}"},
            "claimRef": {"namespace": namespace, "name": claim},
        },
    }
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim, "namespace": namespace},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "volumeName": pv_name,
            "resources": {"requests": {"storage": "10Gi"}},
        },
    }
    return pv, pvc


def current_pod(pods: Sequence[Mapping[str, Any]], restarts: int, rank: int) -> Obj | None:
    """The running, undeleted pod of `rank` in the JobSet's current restart attempt."""
    for pod in pods:
        meta = pod["metadata"]
        if (
            (meta.get("labels") or {}).get(RESTARTS_LABEL) == str(restarts)
            and (meta.get("annotations") or {}).get(INDEX_ANNOTATION) == str(rank)
            and (pod.get("status") or {}).get("phase") == "Running"
            and not meta.get("deletionTimestamp")
        ):
            return dict(pod)
    return None


def finished(jobset_obj: Mapping[str, Any]) -> str | None:
    """'Completed' or 'Failed' once the JobSet has a true terminal condition, else None."""
    for c in (jobset_obj.get("status") or {}).get("conditions") or []:
        if c.get("type") in ("Completed", "Failed") and c.get("status") == "True":
            return str(c["type"])
    return None


def stall_summary(
    jobset_obj: Mapping[str, Any],
    pods: Sequence[Mapping[str, Any]],
    last_step: int | None,
    seconds_since_last_step: float | None,
    last_errors: Mapping[str, str],
) -> str:
    """Why an unfinished baseline was not training at the cap, in one line: the JobSet's
    restarts, each pod's phase (and whether it is stuck terminating), the trainer's last
    error line per pod."""
    status = jobset_obj.get("status") or {}
    parts = [f"JobSet restarts {status.get('restarts', 0)}"]
    if last_step is not None and seconds_since_last_step is not None:
        parts.append(f"last step {last_step}, {seconds_since_last_step:.0f} s before the cap")
    for pod in sorted(pods, key=lambda p: str(p["metadata"]["name"])):
        meta = pod["metadata"]
        phase = (pod.get("status") or {}).get("phase", "?")
        where = (pod.get("spec") or {}).get("nodeName") or "unscheduled"
        label = (meta.get("labels") or {}).get(RESTARTS_LABEL, "?")
        state = "terminating" if meta.get("deletionTimestamp") else phase
        text = f"pod {meta['name']} (restart {label}) {state} on {where}"
        error = last_errors.get(str(meta["name"]))
        parts.append(f"{text}: {error}" if error else text)
    return "; ".join(parts)


def largest_tensor_middle(body: bytes) -> tuple[str, int]:
    """A `torch.save` file is a zip of a pickle and one record per tensor storage: the
    largest record's name and the offset of its middle byte in the file. (The middle of
    the file itself may fall in a record's header padding, which torch never reads: a flip
    there corrupts nothing.)"""
    with zipfile.ZipFile(io.BytesIO(body)) as z:
        info = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    # the local file header: 30 bytes, then the name and the extra field (torch's alignment)
    name_len, extra_len = struct.unpack(
        "<HH", body[info.header_offset + 26 : info.header_offset + 30]
    )
    start = info.header_offset + 30 + name_len + extra_len
    return info.filename, start + info.file_size // 2
