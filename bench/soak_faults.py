"""The goodput soak's faults, applied to the current attempt's world: the pod-runner's
processes and nodes, the Eviction API, the checkpoint store and, for a preemption, Kueue."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

from bench.soak_bad_nodes import BadNodes
from bench.soak_schedule import Fault
from bench.soak_training import (
    CLUSTER_QUEUE,
    FLIP_NAME,
    JOB,
    PREEMPTION_HOLD,
    PREEMPTION_PRIORITY,
)
from e2e.cluster import faults as cluster_faults
from e2e.cluster import kueue_preemption
from e2e.demo import drills, story
from e2e.podrunner.runner import descendants


class Injector:
    """Applies one fault to the current attempt's world (pod-runner processes; for a
    preemption, Kueue)."""

    def __init__(
        self,
        opts: story.Options,
        kube: Any,
        api: Any,
        preemption_hold: float = PREEMPTION_HOLD,
        bad_nodes: Path | None = None,
    ) -> None:
        """`bad_nodes`: the folder the platform's preflight check reads (`BadNodes`)."""
        self.opts, self.kube, self.api = opts, kube, api
        self.preemption_hold = preemption_hold
        self.preemptions: list[kueue_preemption.Preemption] = []
        self.bad_nodes = BadNodes(
            bad_nodes, lambda: self.api.list_pods(story.NAMESPACE), self._trainer
        )

    def _current(self, rank: int) -> dict[str, Any] | None:
        status = self.api.get_rtj(story.NAMESPACE, JOB).get("status") or {}
        attempt = status.get("attempt")
        pods = self.api.list_pods(
            story.NAMESPACE,
            f"training.resilient.dev/job={JOB},training.resilient.dev/attempt={attempt}",
        )
        index = "batch.kubernetes.io/job-completion-index"
        running = [p for p in pods if p["metadata"]["labels"].get(index) == str(rank)
                   and (p.get("status") or {}).get("phase") == "Running"]  # fmt: skip
        # a lost node's pod stays Running in the API beside its replacement (restart in
        # place replaces only the pods on a lost node): the one whose trainer is alive
        alive = [p for p in running if self._trainer(p) is not None]
        return next(iter(alive or running), None)

    def _trainer(self, pod: dict[str, Any]) -> int | None:
        """The rank's training process: not torchrun, nor the in-place supervisor, whose
        command lines name the script too."""
        pid_file = story._pod_dir(self.opts, pod) / "containers" / "trainer" / "pid"
        with contextlib.suppress(OSError, ValueError):
            for pid in descendants(int(pid_file.read_text())):
                if drills.is_trainer(pid):
                    return pid
        return None

    def apply(self, fault: Fault) -> str:
        """What was done (or why nothing was: no training world to hit)."""
        pod = self._current(fault.rank)
        pid = self._trainer(pod) if pod is not None else None
        if pod is None or pid is None:
            return "skipped: no running trainer for that rank"
        if fault.kind == "preemption":
            return self._preempt()
        node, name = pod["spec"]["nodeName"], pod["metadata"]["name"]
        if fault.kind == "sdc":
            flip = story._pod_dir(self.opts, pod) / "volumes" / "train-logs" / FLIP_NAME
            flip.write_text("")  # the trainer flips a bit of its weights at its next step
            return f"flipped a bit of rank {fault.rank}'s weights ({name}, on {node})"
        if fault.kind == "bad_node":
            self.bad_nodes.add(node)
            os.kill(pid, signal.SIGKILL)
            return f"{node} went bad (rank {fault.rank}, {name}): SIGKILL pid {pid}, and " \
                "every trainer on it from now on; its preflight check fails"  # fmt: skip
        if fault.kind == "hang":
            os.kill(pid, signal.SIGSTOP)
            return f"SIGSTOP rank {fault.rank} (pid {pid}, {name})"
        if fault.kind == "node_lost":
            off = self.opts.state / "runner" / "power-off" / node
            off.parent.mkdir(parents=True, exist_ok=True)
            off.touch()  # the runner's next heartbeat powers the node off
            return f"powered {node} off silently (rank {fault.rank}, {name})"
        if fault.kind == "eviction":
            self.kube.core.create_namespaced_pod_eviction(
                name, story.NAMESPACE, {"metadata": {"name": name}}
            )
            return f"evicted {name} (Eviction API)"
        if fault.kind == "gpu_xid":
            cluster_faults.gpu_xid(self.kube, node, story.XID)
        if fault.kind == "corrupt_newest":
            what = self._corrupt_newest()
            os.kill(pid, signal.SIGKILL)
            return f"{what}; SIGKILL rank {fault.rank}"
        os.kill(pid, signal.SIGKILL)
        return f"{'XID 79 on ' + node + '; ' if fault.kind == 'gpu_xid' else ''}SIGKILL " \
            f"rank {fault.rank} (pid {pid})"  # fmt: skip

    def _preempt(self) -> str:
        """Kueue preempts the job: an urgent workload needing the ClusterQueue's whole quota
        (`kueue_preemption.kueue_preempt`), gone `preemption_hold` s after its admission."""
        p = kueue_preemption.kueue_preempt(
            self.kube, story.NAMESPACE, story.QUEUE, CLUSTER_QUEUE,
            hold=self.preemption_hold, name=f"urgent-{len(self.preemptions) + 1}",
            priority=PREEMPTION_PRIORITY,
        )  # fmt: skip
        self.preemptions.append(p)
        return preemption_text(p)

    def _corrupt_newest(self) -> str:
        """Flip one byte of a data file of the newest committed step in the store (the
        checkpoint the next attempt will pin; its init containers must reject it)."""
        import base64

        import boto3

        secret = self.kube.core.read_namespaced_secret(story.SECRET, story.NAMESPACE)
        env = {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}
        s3 = boto3.client(
            "s3", endpoint_url=env["AWS_ENDPOINT_URL_S3"], region_name=env["AWS_DEFAULT_REGION"],
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        )  # fmt: skip
        keys: list[str] = []
        for page in s3.get_paginator("list_objects_v2").paginate(
            Bucket=story.BUCKET, Prefix=f"{JOB}/"
        ):
            keys += [o["Key"] for o in page.get("Contents", [])]
        committed = sorted(k.rsplit("/", 1)[0] for k in keys if k.endswith("/COMMITTED"))
        if not committed:
            return "no committed step yet: nothing corrupted"
        step = committed[-1]
        data = [k for k in keys if k.startswith(step + "/") and not k.endswith(
            ("/COMMITTED", "/manifest.json"))]  # fmt: skip
        if not data:
            return f"{step}: no data file"
        key = sorted(data)[0]
        body = bytearray(s3.get_object(Bucket=story.BUCKET, Key=key)["Body"].read())
        body[len(body) // 2] ^= 0xFF
        s3.put_object(Bucket=story.BUCKET, Key=key, Body=bytes(body))
        return f"flipped a byte of {key}"


def preemption_text(p: kueue_preemption.Preemption) -> str:
    """A preemption in words, for the report's list of what was injected."""
    head = (f"Kueue: urgent Job {p.name} ({p.pods} pods x {p.gpus_per_pod} GPUs, the "
            f"ClusterQueue's whole quota, priority {p.priority})")  # fmt: skip
    if p.admitted is None:
        return f"{head} not admitted: nothing preempted"
    gone = f"{p.gone - p.released:.1f} s" if p.gone is not None else "not within the timeout"
    return (f"{head} admitted {p.admitted - p.created:.1f} s after it arrived (ours evicted), "
            f"held the quota {p.released - p.admitted:.1f} s, gone {gone} after its "
            "deletion")  # fmt: skip


def preemption_facts(p: kueue_preemption.Preemption) -> dict[str, Any]:
    """What the injected record keeps of a preemption (Unix times)."""
    return {"preemptor": {"name": p.name, "created": p.created, "admitted": p.admitted,
                          "released": p.released, "gone": p.gone}}  # fmt: skip


def prepare_preemption(kube: Any, plan: list[Fault]) -> bool:
    """Let the ClusterQueue preempt (`withinClusterQueue: LowerPriority`) when the schedule
    holds a preemption. Only then: with one priority level it never preempts anything, but
    a schedule without one keeps the platform exactly as before."""
    if not any(f.kind == "preemption" for f in plan):
        return False
    kueue_preemption.enable_kueue_preemption(kube, CLUSTER_QUEUE)
    return True


def inject(injector: Injector, fault: Fault) -> dict[str, Any]:
    """Apply `fault` now; its record. `at`: when it was done (a preemption, which takes its
    hold to apply: when the urgent workload arrived)."""
    before = len(injector.preemptions)
    what = injector.apply(fault)
    out = {"kind": fault.kind, "rank": fault.rank, "at": time.time(), "scheduled": fault.at,
           "what": what}  # fmt: skip
    if len(injector.preemptions) > before:
        p = injector.preemptions[-1]
        out.update(at=p.created, **preemption_facts(p))
    return out
