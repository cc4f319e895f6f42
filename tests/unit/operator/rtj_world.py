"""Builders for reconcile tests: pods, JobSets, nodes and snapshots as the API server shows them,
and `FakeWorld`, an in-memory cluster that applies plans the way the API server would."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from rtj_test_support import NOW, job_body

from rtj_operator import reconcile as rc
from rtj_operator.api import ResilientTrainingJob, keys
from rtj_operator.policy import spares
from rtj_operator.reconcile.world import PollTarget
from rtj_operator.selection import Selection

Obj = dict[str, Any]


def iso(at: datetime) -> str:
    return at.isoformat().replace("+00:00", "Z")


JOB_UID = "6f1c-uid"
"""The uid of the job `llm` in rtj_test_support.job_body."""


def jobset_uid(name: str, owner: str = JOB_UID) -> str:
    """A JobSet's uid, distinct per owning job (a re-created job's JobSets get new uids)."""
    return f"js-{owner}-{name}"


def rtj_raw(status: Obj | None = None, rv: int = 10, **spec: Any) -> Obj:
    body = job_body(**spec)
    body["metadata"]["resourceVersion"] = str(rv)
    body["status"] = {"observedGeneration": 1, **status} if status else {}
    return body


def jobset(
    attempt: int,
    *,
    job: str = "llm",
    suspended: bool = False,
    completed: bool = False,
    failed: bool = False,
    deleting: bool = False,
    created: datetime = NOW,
    resume: int | None = None,
    owner: str = JOB_UID,
) -> Obj:
    conditions = []
    if completed:
        conditions.append(
            {"type": "Completed", "status": "True", "lastTransitionTime": iso(created)}
        )
    if failed:
        conditions.append(
            {"type": "Failed", "status": "True", "lastTransitionTime": iso(created),
             "message": "jobset failed"}
        )  # fmt: skip
    meta: Obj = {
        "name": f"{job}-a{attempt}",
        "namespace": "team-a",
        "uid": jobset_uid(f"{job}-a{attempt}", owner),
        "labels": {keys.JOB_LABEL: job, keys.ATTEMPT_LABEL: str(attempt)},
        "annotations": {} if resume is None else {keys.RESUME_STEP_ANNOTATION: str(resume)},
        "creationTimestamp": iso(created),
        # as render_jobset writes it: the job controls its JobSets
        "ownerReferences": [{"apiVersion": keys.API_VERSION, "kind": keys.KIND, "name": job,
                             "uid": owner, "controller": True, "blockOwnerDeletion": True}],
    }  # fmt: skip
    if deleting:
        meta["deletionTimestamp"] = iso(created)
    return {"metadata": meta, "spec": {"suspend": suspended}, "status": {"conditions": conditions}}


def pod(
    attempt: int,
    index: int,
    *,
    job: str = "llm",
    phase: str = "Running",
    node: str | None = None,
    exit_code: int | None = None,
    message: str = "",
    reason: str = "Error",
    finished: datetime = NOW,
    deleting: bool = False,
    init: Obj | None = None,
    owner: str = JOB_UID,
) -> Obj:
    js = f"{job}-a{attempt}"
    meta: Obj = {
        "name": f"{js}-worker-0-{index}-abcde",
        "namespace": "team-a",
        "labels": {
            keys.JOB_LABEL: job,
            keys.ATTEMPT_LABEL: str(attempt),
            keys.JOBSET_NAME_LABEL: js,
            keys.JOBSET_UID_LABEL: jobset_uid(js, owner),
            keys.JOB_COMPLETION_INDEX: str(index),
        },
        "annotations": {keys.JOB_COMPLETION_INDEX: str(index)},
        # the Job controller creates the pod: its Job is the controller owner
        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": f"{js}-worker-0",
                             "uid": f"job-uid-{js}-worker-0", "controller": True,
                             "blockOwnerDeletion": True}],
    }  # fmt: skip
    if deleting:
        meta["deletionTimestamp"] = iso(finished + timedelta(seconds=30))
        meta["deletionGracePeriodSeconds"] = 30
    state: Obj = {"running": {"startedAt": iso(finished - timedelta(hours=1))}}
    if exit_code is not None:
        state = {
            "terminated": {
                "exitCode": exit_code,
                "reason": reason,
                "message": message,
                "startedAt": iso(finished - timedelta(hours=1)),
                "finishedAt": iso(finished),
            }
        }
        phase = "Failed" if exit_code else "Succeeded"
    status: Obj = {
        "phase": phase,
        "containerStatuses": [{"name": "trainer", "state": state}],
        "conditions": [
            {"type": "PodScheduled", "status": "True",
             "lastTransitionTime": iso(finished - timedelta(hours=1))}
        ],
    }  # fmt: skip
    if init is not None:
        status["initContainerStatuses"] = [
            {"name": keys.RESUME_INIT_CONTAINER, "state": {"terminated": init}}
        ]
    return {
        "metadata": meta,
        "spec": {"nodeName": node or f"gpu-node-{index:03d}"},
        "status": status,
    }


def node(
    name: str,
    *,
    ready: bool = True,
    taints: list[Obj] | None = None,
    xid: int | None = None,
    annotations: dict[str, str] | None = None,
    **labels: str,
) -> Obj:
    conditions = [
        {"type": "Ready", "status": "True" if ready else "False",
         "lastTransitionTime": iso(NOW - timedelta(days=1))}
    ]  # fmt: skip
    if xid is not None:  # as NVSentinel's syslog health monitor sets it (see the corpus case
        # tests/fixtures/classify/gpu_xid_condition_then_exit_1 for its source)
        conditions.append(
            {"type": "SysLogsXIDError", "status": "True", "reason": "SysLogsXIDErrorIsNotHealthy",
             "message": f"ErrorCode:{xid} GPU:3 PCI:0000:9d:00 XID error occurred "
                        "Recommended Action=RESTART_BM;",
             "lastTransitionTime": iso(NOW - timedelta(seconds=3))}
        )  # fmt: skip
    return {
        "metadata": {"name": name, "labels": labels, "annotations": annotations or {}},
        "spec": {"taints": taints or []},
        "status": {"conditions": conditions},
    }


def nodes_for(pods: list[Obj]) -> dict[str, Obj]:
    return {p["spec"]["nodeName"]: node(p["spec"]["nodeName"]) for p in pods}


def reading(
    step: int | None,
    at: datetime = NOW,
    error: str | None = None,
    excluded: tuple[int, ...] = (),
) -> rc.StoreReading:
    """A store reading started at `at` that excluded the bad steps `excluded`."""
    if error is not None:
        return rc.StoreReading(at, error=error, excluded=frozenset(excluded))
    uri = f"s3://ckpt/team-a/llm/steps/step-{step:012d}" if step is not None else None
    picked = Selection(step, uri, NOW - timedelta(minutes=5) if step else None)
    return rc.StoreReading(at, picked, excluded=frozenset(excluded))


def snapshot(
    raw: Obj,
    *,
    jobsets: list[Obj] | None = None,
    pods: list[Obj] | None = None,
    gone: list[Obj] | None = None,
    gone_jobsets: list[Obj] | None = None,
    nodes: dict[str, Obj] | None = None,
    events: list[Obj] | None = None,
    now: datetime = NOW,
    store: rc.StoreReading | None = None,
    deleted_nodes: frozenset[str] = frozenset(),
) -> rc.Snapshot:
    pods = pods or []
    return rc.Snapshot(
        rtj=ResilientTrainingJob.from_object(raw),
        resource_version=raw["metadata"]["resourceVersion"],
        jobsets=tuple(jobsets or ()),
        pods=tuple(pods),
        gone_pods=tuple(gone or ()),
        gone_jobsets=tuple(gone_jobsets or ()),
        nodes=nodes if nodes is not None else nodes_for(pods + (gone or [])),
        events=tuple(events or ()),
        now=now,
        store=store,
        stored_status=raw.get("status") or {},
        deleted_nodes=deleted_nodes,
    )


def apply_patch(target: Obj, patch: Obj) -> Obj:
    """RFC 7386 merge patch."""
    out = copy.deepcopy(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = apply_patch(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def with_status(raw: Obj, plan: rc.Plan) -> Obj:
    """The job as the API server stores it after the plan's status patch."""
    patch = plan.status_patch
    assert patch is not None, "the plan has no status patch"
    out = copy.deepcopy(raw)
    out["status"] = apply_patch(raw.get("status") or {}, dict(patch.patch))
    out["metadata"]["resourceVersion"] = str(int(raw["metadata"]["resourceVersion"]) + 1)
    return out


class Stop(Exception):
    """The API server refused an action (conflict / already exists): the plan stops there."""


@dataclass
class FakeWorld:
    """An API server plus the controllers the operator relies on, in memory.

    JobSets spawn `replicas` Running pods. A JobSet deleted (background propagation) goes at
    once and its pods on the next `tick` (garbage collector + kubelet); a JobSet that shows a
    deletionTimestamp (foreground, or set by a test) loses its pods on `tick`, then goes
    itself. A pod deleted with its grace period goes on the next `tick`, by force at once.
    """

    raw: Obj
    now: datetime = NOW
    jobsets: dict[str, Obj] = field(default_factory=dict)
    pods: dict[str, Obj] = field(default_factory=dict)
    nodes: dict[str, Obj] = field(default_factory=dict)
    events: list[rc.PostEvent] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    overlaps: list[str] = field(default_factory=list)
    """Objects of an earlier attempt that existed when a JobSet was created (must stay empty)."""
    store_step: int | None = 100

    def snapshot(self) -> rc.Snapshot:
        pods = list(self.pods.values())
        return snapshot(
            self.raw,
            jobsets=list(self.jobsets.values()),
            pods=pods,
            nodes={n: self.nodes.get(n, node(n)) for n in [*nodes_for(pods), *self.quarantined()]},
            now=self.now,
            store=reading(self.store_step, self.now),
        )

    def apply(self, action: rc.Action) -> None:
        if isinstance(action, rc.CreateJobSet):
            body = action.body
            name = body["metadata"]["name"]
            if name in self.jobsets:
                raise Stop("AlreadyExists")
            attempt = int(body["metadata"]["labels"][keys.ATTEMPT_LABEL])
            self.overlaps += [*self.jobsets, *self.pods]
            js = jobset(attempt, created=self.now)
            js["metadata"]["annotations"] = dict(body["metadata"].get("annotations") or {})
            self.jobsets[name] = js
            self.created.append(name)
            replicas = body["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"]
            for i in range(replicas):
                p = pod(attempt, i, finished=self.now)
                self.pods[p["metadata"]["name"]] = p
        elif isinstance(action, rc.DeleteJobSet):
            self.jobsets.pop(action.name, None)
        elif isinstance(action, rc.DeletePod):
            if action.grace_seconds == 0:
                self.pods.pop(action.name, None)
            elif action.name in self.pods:
                meta = self.pods[action.name]["metadata"]
                meta.setdefault("deletionTimestamp", iso(self.now))
        elif isinstance(action, (rc.TaintNode, rc.UntaintNode)):
            n = self.nodes.setdefault(action.node, node(action.node))
            edit = rc.claim if isinstance(action, rc.TaintNode) else rc.release
            annotations = n["metadata"].setdefault("annotations", {})
            held = annotations.get(keys.QUARANTINE_OWNERS_ANNOTATION)
            change = edit(
                n["spec"]["taints"], held, action.taint, rc.Claimant(action.job, action.uid)
            )
            if change is not None:
                n["spec"]["taints"] = change.taints
                if change.annotation is None:
                    annotations.pop(keys.QUARANTINE_OWNERS_ANNOTATION, None)
                else:
                    annotations[keys.QUARANTINE_OWNERS_ANNOTATION] = change.annotation
        elif isinstance(action, rc.SetFinalizer):
            finalizers = [f for f in self.raw["metadata"].get("finalizers", []) if f != action.name]
            self.raw["metadata"]["finalizers"] = finalizers + (
                [action.name] if action.present else []
            )
        elif isinstance(action, rc.PatchStatus):
            if action.resource_version != self.raw["metadata"]["resourceVersion"]:
                raise Stop("Conflict")
            self.raw["status"] = apply_patch(self.raw.get("status") or {}, dict(action.patch))
            rv = int(self.raw["metadata"]["resourceVersion"]) + 1
            self.raw["metadata"]["resourceVersion"] = str(rv)
        elif isinstance(action, rc.PostEvent):
            self.events.append(action)

    def tick(self, seconds: float = 1.0) -> None:
        """Time passes; deleted pods and pods of a JobSet that is gone go; JobSets being
        deleted lose their pods, then go."""
        self.now += timedelta(seconds=seconds)
        for k, p in list(self.pods.items()):
            owner = p["metadata"]["labels"][keys.JOBSET_NAME_LABEL]
            if p["metadata"].get("deletionTimestamp") or owner not in self.jobsets:
                del self.pods[k]
        for name, js in list(self.jobsets.items()):
            if js["metadata"].get("deletionTimestamp"):
                mine = [
                    k
                    for k, p in self.pods.items()
                    if p["metadata"]["labels"][keys.JOBSET_NAME_LABEL] == name
                ]
                for k in mine:
                    self.pods.pop(k)
                if not mine:
                    del self.jobsets[name]

    def quarantined(self) -> list[str]:
        return [q["node"] for q in (self.raw.get("status") or {}).get("quarantinedNodes", [])]

    def fail_pod(
        self,
        index: int = 0,
        message: str = "NCCL timeout: Watchdog caught collective operation timeout",
        xid: int | None = None,
    ) -> str:
        """Fail pod `index` of the current attempt with `message`; with `xid`, its node's
        GPU health agent reports that XID first (node-level evidence)."""
        attempt = int(self.raw["status"]["attempt"])
        for k, p in self.pods.items():
            labels = p["metadata"]["labels"]
            if labels[keys.ATTEMPT_LABEL] == str(attempt) and labels[
                keys.JOB_COMPLETION_INDEX
            ] == str(index):
                if xid is not None:
                    where = p["spec"]["nodeName"]
                    self.nodes[where] = node(where, xid=xid)
                self.pods[k] = pod(attempt, index, exit_code=1, message=message, finished=self.now,
                                   node=p["spec"]["nodeName"])  # fmt: skip
                return k
        raise AssertionError(f"no pod {index} in attempt {attempt}")


def tainted_by(nodes: dict[str, Obj], plan: rc.Plan) -> dict[str, Obj]:
    """The nodes as the API server shows them once the plan's TaintNode claims are placed."""
    out = copy.deepcopy(nodes)
    for action in plan.actions:
        if not isinstance(action, rc.TaintNode) or action.node not in out:
            continue
        found = out[action.node]
        annotations = found.setdefault("metadata", {}).setdefault("annotations", {})
        spec = found.setdefault("spec", {})
        edit = rc.claim(
            spec.get("taints") or [],
            annotations.get(keys.QUARANTINE_OWNERS_ANNOTATION),
            action.taint,
            rc.Claimant(action.job, action.uid),
        )
        if edit is not None:
            spec["taints"] = list(edit.taints)
            annotations[keys.QUARANTINE_OWNERS_ANNOTATION] = edit.annotation or ""
    return out


def target(pod: Obj, raw: Obj) -> PollTarget:
    """The poll target of `pod` in the job's current attempt (its rank, a spare's too)."""
    record = raw["status"]["attempts"][-1]
    assigned, world = dict(record.get("spareRanks") or {}), record.get("worldSize")
    return PollTarget(pod["metadata"]["name"], pod["status"].get("podIP") or "10.0.9.9", 9478,
                      1, spares.rank_of(pod, assigned, world), pod["spec"].get("nodeName"),
                      spares.is_idle(pod, assigned, world))  # fmt: skip
