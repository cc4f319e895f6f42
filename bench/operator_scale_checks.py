"""The operator-scale bench's correctness checks after its faults: every faulted group
restarted exactly once into the next world, every other one untouched (RTJs: their attempt
records, JobSets and pods, the operator's restart counter; the baseline's JobSets: their
`status.restarts` and pods)."""

from __future__ import annotations

import argparse
from collections import Counter

from bench.operator_scale_workload import RESTARTS_LABEL
from bench.scale_probes import parse_counter
from e2e.cluster.kube import JOBSET_GROUP, JOBSET_VERSION
from e2e.cluster.kube import Kube as HarnessKube
from e2e.operator_proc import OperatorProcess
from rtj_operator.api import keys
from rtj_operator.kube import Kube
from rtj_operator.policy.render import jobset_name


def verify_rtjs(
    kube: Kube, a: argparse.Namespace, ns: str, op: OperatorProcess | None
) -> list[str]:
    faulted = {f"s{(k * a.jobs) // a.faults:03d}" for k in range(a.faults)}
    problems: list[str] = []
    jobsets: dict[str, list[str]] = {}
    for js in kube.list_jobsets(ns):
        owner = (js["metadata"].get("labels") or {}).get(keys.JOB_LABEL, "?")
        jobsets.setdefault(owner, []).append(js["metadata"]["name"])
    pods: Counter[tuple[str, str]] = Counter()
    for p in kube.list_pods(ns, keys.JOB_LABEL):
        if p["metadata"].get("deletionTimestamp"):
            continue
        labels = p["metadata"]["labels"]
        pods[(labels[keys.JOB_LABEL], labels.get(keys.ATTEMPT_LABEL, "?"))] += 1
    rtjs = kube.list_rtjs(ns)
    if len(rtjs) != a.jobs:
        problems.append(f"{len(rtjs)} RTJs, expected {a.jobs}")
    for obj in rtjs:
        name = obj["metadata"]["name"]
        status = obj.get("status") or {}
        records = status.get("attempts") or []
        n = 2 if name in faulted else 1
        got = [r.get("attempt") for r in records]
        if status.get("attempt") != n or got != list(range(1, n + 1)):
            problems.append(f"{name}: attempt {status.get('attempt')}, records {got}")
        classified = [r.get("attempt") for r in records if r.get("failureClass")]
        if classified != list(range(1, n)):
            problems.append(f"{name}: classified records {classified}")
        if sorted(jobsets.get(name, [])) != [jobset_name(name, n)]:
            problems.append(f"{name}: JobSets {sorted(jobsets.get(name, []))}")
        if pods[(name, str(n))] != a.workers or (n == 2 and pods[(name, "1")]):
            problems.append(
                f"{name}: {pods[(name, str(n))]} pods of attempt {n}, "
                f"{pods[(name, '1')] if n == 2 else 0} of attempt 1 left"
            )
        if status.get("phase") != "Running":
            problems.append(f"{name}: phase {status.get('phase')}")
    if op is not None:
        text = op.metrics()
        restarts = sum(v for _, v in parse_counter(text, "rtj_restarts_total"))
        if restarts != a.faults:
            problems.append(f"rtj_restarts_total = {restarts:.0f}, expected {a.faults}")
    return problems


def verify_jobsets(harness: HarnessKube, a: argparse.Namespace, ns: str) -> list[str]:
    faulted = {f"b{(k * a.jobs) // a.faults:03d}" for k in range(a.faults)}
    problems: list[str] = []
    pods: Counter[tuple[str, str]] = Counter()
    for p in harness.core.list_namespaced_pod(ns).items:
        if p.metadata.deletion_timestamp:
            continue
        labels = p.metadata.labels or {}
        pods[(labels.get(keys.JOBSET_NAME_LABEL, "?"), labels.get(RESTARTS_LABEL, "?"))] += 1
    items = harness.custom.list_namespaced_custom_object(
        JOBSET_GROUP, JOBSET_VERSION, ns, "jobsets"
    )["items"]
    if len(items) != a.jobs:
        problems.append(f"{len(items)} JobSets, expected {a.jobs}")
    for js in items:
        name = js["metadata"]["name"]
        status = js.get("status") or {}
        want = 1 if name in faulted else 0
        if int(status.get("restarts") or 0) != want:
            problems.append(f"{name}: restarts {status.get('restarts')}, expected {want}")
        if pods[(name, str(want))] != a.workers or (want and pods[(name, "0")]):
            problems.append(f"{name}: {pods[(name, str(want))]} pods of restart {want}")
        terminal = [
                c["type"] for c in status.get("conditions") or []
                if c.get("type") in ("Failed", "Completed") and c.get("status") == "True"
            ]  # fmt: skip
        if terminal:
            problems.append(f"{name}: {terminal}")
    return problems
