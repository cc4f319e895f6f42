"""The goodput soak's TorchFT baseline (c): its JobSet and its judge. Pure.

How a TorchFT user runs on Kubernetes without the operator, from TorchFT's own launcher
(`torchft/torchx.py`, torchft 0.2.0): one role per replica group, each a `torchrun` of one
worker with its own store, `REPLICA_GROUP_ID`/`NUM_REPLICA_GROUPS` and `TORCHFT_LIGHTHOUSE`
in the environment, restarted on its own when it fails (`max_retries`); the lighthouse run
outside the groups (`torchft_lighthouse --min_replicas 1 --quorum_tick_ms 100
--join_timeout_ms 10000`, its README's command). As a JobSet (v1alpha2, v0.11.1): a
`lighthouse` replicated job of one pod and a `group` replicated job of one Job per replica
group, each Job `backoffLimit` large (a failed pod is replaced by its Job alone: no other
group stops), the JobSet complete when every group is (`successPolicy`), queued in Kueue
like the other baselines. The trainer is examples/torchft_train.py, durable files on the
same shared claim as (b).

The judge (`judge`) counts what TorchFT's design implies: a global step is committed by
the groups in its quorum, never trained again unless every group starts over from a file;
a step with fewer groups than all trains a smaller global batch (the missing groups' samples
are never trained on). Goodput counts each surviving step at the run's own median step time
with every group in it, weighted by the share of the global batch it trained, over the wall
time from the JobSet's creation to the last step (the surviving groups train the model out
while a hung one never ends its Job: the model is done then, the JobSet is not).
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench import baseline_jobset as bj
from bench import soak_accounting as acc

Obj = dict[str, Any]

LIGHTHOUSE = "lighthouse"
GROUP = "group"
LIGHTHOUSE_PORT = 29510  # torchft_lighthouse's default --bind port
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
RJOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
LIGHTHOUSE_COMMAND = ["torchft_lighthouse", "--min_replicas", "1", "--quorum_tick_ms", "100",
                      "--join_timeout_ms", "10000"]  # fmt: skip
"""The lighthouse as TorchFT's README starts it (heartbeat timeout: its default, 5 s)."""
TORCHFT_VERSION = "0.2.0"


def lighthouse_host(name: str = bj.NAME) -> str:
    return f"{name}-{LIGHTHOUSE}-0-0.{name}"


def jobset(
    namespace: str, queue: str, groups: int, trainer_args: Sequence[str], *, name: str = bj.NAME
) -> Obj:
    """The JobSet for `groups` replica groups of examples/torchft_train.py."""
    group_container = {
        "name": "trainer",
        "image": "ghcr.io/example/rtj-trainer:dev",
        "command": [
            "torchrun",
            "--standalone",
            "--nnodes=1",
            "--nproc-per-node=1",
            "examples/torchft_train.py",
            f"--checkpoints={bj.CKPT_DIR}",
            f"--log-dir={bj.LOG_DIR}",
            *trainer_args,
        ],
        "env": [
            bj.field_env("REPLICA_GROUP_ID", f"metadata.labels['{JOB_INDEX_LABEL}']"),
            {"name": "NUM_REPLICA_GROUPS", "value": str(groups)},
            {"name": "LIGHTHOUSE_HOST", "value": lighthouse_host(name)},
            {"name": "TORCHFT_LIGHTHOUSE", "value": f"http://$(LIGHTHOUSE_HOST):{LIGHTHOUSE_PORT}"},
        ],
        "resources": {
            "requests": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"},
            "limits": {"memory": "2Gi", "nvidia.com/gpu": "1"},
        },
        "volumeMounts": [
            {"name": "train-logs", "mountPath": bj.LOG_DIR},
            {"name": "checkpoints", "mountPath": bj.CKPT_DIR},
        ],
    }
    lighthouse_container = {
        "name": "lighthouse",
        "image": "ghcr.io/example/rtj-trainer:dev",
        "command": [*LIGHTHOUSE_COMMAND, "--bind", f"[::]:{LIGHTHOUSE_PORT}"],
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
    }
    volumes = [
        {"name": "train-logs", "emptyDir": {}},
        {"name": "checkpoints", "persistentVolumeClaim": {"claimName": bj.CLAIM}},
    ]
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": namespace, "labels": {bj.QUEUE_LABEL: queue}},
        "spec": {
            "suspend": True,
            "failurePolicy": {"maxRestarts": bj.MAX_RESTARTS},
            "successPolicy": {"operator": "All", "targetReplicatedJobs": [GROUP]},
            "network": {"enableDNSHostnames": True},
            "replicatedJobs": [
                _replicated(LIGHTHOUSE, 1, {"containers": [lighthouse_container]}),
                _replicated(GROUP, groups, {"containers": [group_container], "volumes": volumes}),
            ],
        },
    }


def _replicated(rjob: str, replicas: int, pod_spec: Obj) -> Obj:
    job = {"parallelism": 1, "completions": 1, "backoffLimit": bj.MAX_RESTARTS,
           "template": {"spec": {"restartPolicy": "Never", **pod_spec}}}  # fmt: skip
    return {"name": rjob, "replicas": replicas, "template": {"spec": job}}


def group_pods(pods: Sequence[Mapping[str, Any]], group: int) -> list[Obj]:
    """The group's running, undeleted pods (a lost node's pod stays Running in the API
    beside its replacement until Kubernetes evicts it)."""
    return [
        dict(p) for p in pods
        if (p["metadata"].get("labels") or {}).get(RJOB_LABEL) == GROUP
        and (p["metadata"].get("labels") or {}).get(JOB_INDEX_LABEL) == str(group)
        and (p.get("status") or {}).get("phase") == "Running"
        and not p["metadata"].get("deletionTimestamp")
    ]  # fmt: skip


@dataclass(frozen=True)
class Commit:
    """One committed step as one group logged it."""

    step: int
    time: float
    participants: int
    group: int
    run: int  # which of the logs (one per pod the group ran in, in time order)


def commits(runs: Sequence[tuple[int, Sequence[str]]]) -> list[Commit]:
    """Every committed step of every `(group, lines)` log, in time order."""
    out = []
    for i, (group, lines) in enumerate(runs):
        for r in acc.parse_records(list(lines)):
            if "loss" in r and "step" in r and "event" not in r:
                out.append(Commit(int(r["step"]), float(r["time"]), int(r["participants"]),
                                  group, i))  # fmt: skip
    return sorted(out, key=lambda c: c.time)


PEER_WINDOW = 5.0
"""Seconds within which two groups' logs of one step are the same commit (the quorum's
participants learn `should_commit` together); a later commit of a step trains it again (a
start over from a file takes far longer: the interpreter, torch, the lighthouse's join)."""


def final_steps(all_commits: Sequence[Commit]) -> tuple[dict[int, tuple[float, int]], set[int]]:
    """step -> (when it was committed in its final training, its participants), and the
    steps trained again (every group started over from an older file)."""
    out: dict[int, tuple[float, int]] = {}
    again: set[int] = set()
    for c in all_commits:
        if c.step not in out or c.time > out[c.step][0] + PEER_WINDOW:
            if c.step in out:
                again.add(c.step)
            out[c.step] = (c.time, c.participants)
    return out, again


def judge(
    created: float,
    stopped: float,
    completed: str | None,
    runs: Sequence[tuple[int, Sequence[str]]],
    injected: Sequence[Mapping[str, Any]],
    stall: str | None,
    steps: int,
    groups: int,
) -> dict[str, Any]:
    """`runs`: each pod's `(group, log lines)`; `completed`: the JobSet's terminal
    condition (None: still running at `stopped`, the cap)."""
    every = commits(runs)
    final, again = final_steps(every)
    problems = [] if final else ["no training step was logged"]
    full = _durations(final, groups)
    typical = statistics.median(full) if full else 0.0
    productive = sum(typical * p / groups for _, p in final.values())
    reached = max(final, default=0)
    last = max((t for t, _ in final.values()), default=created)
    first = min((t for t, _ in final.values()), default=created)
    trained_out = reached >= steps
    end = last if trained_out else max(stopped, last)
    short = {s: p for s, (_, p) in final.items() if p < groups}
    findings = _findings(runs, short, groups, reached)
    if not trained_out:
        findings.append(f"did not finish: step {reached} of {steps} at the cap"
                        f" ({stall or completed or 'no reason recorded'})")  # fmt: skip
    elif completed != "Completed":
        findings.append("the model was trained, but the JobSet did not complete "
                        f"({stall or 'no reason recorded'})")  # fmt: skip
    return {
        "created": created,
        "goodput": productive / (end - created) if end > created else 0.0,
        "goodput_by_steps": typical * len(final) / (end - created) if end > created else 0.0,
        "wall_seconds": end - created,
        "productive_seconds": productive,
        "typical_step_seconds": typical,
        "mean_step_seconds": (last - first) / (len(final) - 1) if len(final) > 1 else None,
        "first_step_seconds": first - created if final else None,
        "attempts": len(runs),
        "injected": list(injected),
        "recoveries": [recovery(f, every, run_starts(runs), groups) for f in injected],
        "steps_trained_again": len(again),
        "steps_short_of_groups": len(short),
        "samples_never_trained": sum(groups - p for p in short.values()),
        "completed": completed,
        "reached_step": reached,
        "stall": stall,
        "findings": findings,
        "problems": problems,
    }


def _durations(final: Mapping[int, tuple[float, int]], groups: int) -> list[float]:
    """The time of each step every group trained, from the step before it."""
    return [final[s][0] - final[s - 1][0] for s in final
            if s - 1 in final and final[s][1] == groups]  # fmt: skip


def _findings(
    runs: Sequence[tuple[int, Sequence[str]]], short: Mapping[int, int], groups: int, reached: int
) -> list[str]:
    out = []
    if short:
        out.append(f"{len(short)} of {reached} steps trained without every replica group "
                   f"(their batches never trained on): the model differs from the no-fault "
                   f"run by design")  # fmt: skip
    prints = {}
    for group, lines in runs:
        for r in acc.parse_records(list(lines)):
            if r.get("event") == "done":
                prints[group] = str(r["fingerprint"])
    if len(set(prints.values())) > 1:
        out.append(f"the replica groups ended with different models: {prints}")
    missing = sorted(set(range(groups)) - set(prints))
    if missing and prints:
        out.append(f"replica groups {missing} did not reach the end")
    return out


def run_starts(runs: Sequence[tuple[int, Sequence[str]]]) -> list[float]:
    """When each log's process started (its first record: the restore)."""
    return [
        min((float(r["time"]) for r in acc.parse_records(list(lines)) if "time" in r),
            default=float("inf"))
        for _, lines in runs
    ]  # fmt: skip


def recovery(
    fault: Mapping[str, Any], every: Sequence[Commit], starts: Sequence[float], groups: int
) -> dict[str, Any]:
    """What one fault cost: the job's longest pause in commits after it (the survivors'
    stall), and when the group it hit committed a step again from a process started after
    the fault (its rejoin: a pod the fault did not stop at once may commit a while first)."""
    at = float(fault["at"])
    group = int(fault["rank"])
    after = [c for c in every if c.time > at]
    back = next((c for c in after if c.group == group and starts[c.run] > at), None)
    until = back.time if back is not None else (after[-1].time if after else at)
    rejoined = [c for c in after if back is not None and c.time >= back.time]
    times = [at, *sorted({c.time for c in after if c.time <= until})]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return {
        "kind": fault["kind"],
        "injected_at": at,
        "group": group,
        "stall_seconds": max(gaps, default=None),
        "seconds_to_rejoin": back.time - at if back is not None else None,
        "rejoined_at_step": back.step if back is not None else None,
        "full_quorum_again": next((c.time - at for c in rejoined if c.participants == groups),
                                  None),
    }  # fmt: skip
