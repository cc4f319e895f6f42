"""The workloads of `bench.operator_scale`: a group as a ResilientTrainingJob, the same group
as the plain JobSet a user would run without the operator (JobSet's own `RestartJobSet`),
the fault each victim gets, how a pod names its group's generation, and the clean-up."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from typing import Any

from bench.operator_scale_report import BACKOFF_SECONDS
from e2e.cluster import testenv
from e2e.cluster.kube import JOBSET_GROUP, JOBSET_VERSION
from e2e.operator_proc import rtj_body
from rtj_operator.api import keys
from rtj_operator.api.resource import ResilientTrainingJob
from rtj_operator.kube import Kube
from rtj_operator.kube_errors import NotFound
from rtj_operator.policy.render import jobset_name, render_jobset

MAX_RESTARTS = 3
RESTARTS_LABEL = "jobset.sigs.k8s.io/restart-attempt"
FAULT_MESSAGE = (
    "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited or there "
    "was a network error, NCCL version 2.21.5\nncclRemoteError: A call failed possibly due to "
    "a network error or a remote process exiting prematurely."
)


PROGRESS_MODES = ("unanswered", "off", "answered")
"""The jobs' progress monitoring (`--progress`): on with nothing answering (the default:
KWOK starts no sidecar, so the operator's polls of every pod find nothing), off
(`spec.progress.enabled: false`: nothing polled), or answered by `bench.sidecar_sim`'s stand-in
sidecars on SIM_PORT (pods on loopback addresses)."""
SIM_PORT = 9480
"""The stand-in sidecars' port (not 9478, `bench.hang_detection`'s, nor 9479,
`bench.in_place_scale`'s)."""


def worker_body(
    name: str, ns: str, workers: int, gpus: int, progress: str = "unanswered"
) -> dict[str, Any]:
    policy = {
        "maxRestarts": MAX_RESTARTS,
        "backoff": {"initialSeconds": BACKOFF_SECONDS, "maxSeconds": BACKOFF_SECONDS},
    }
    extra: dict[str, Any] = {
        "off": {"progress": {"enabled": False}},
        "answered": {"progress": {"port": SIM_PORT}},
    }.get(progress, {})
    body = rtj_body(name, ns, f"file:///mnt/ckpt/{name}", replicas=workers, failurePolicy=policy,
                    **extra)  # fmt: skip
    container = body["spec"]["template"]["spec"]["containers"][0]
    container["resources"] = {
        "requests": {"nvidia.com/gpu": str(gpus), "cpu": "1", "memory": "1Gi"},
        "limits": {"nvidia.com/gpu": str(gpus)},
    }
    return body


def baseline_jobset(name: str, ns: str, workers: int, gpus: int, strategy: str) -> dict[str, Any]:
    """The JobSet the operator would render for attempt 1 of the same job, as a user would
    run it without the operator: renamed, no owner, JobSet's own restarts on."""
    body = worker_body(name, ns, workers, gpus)
    body["metadata"]["uid"] = str(uuid.uuid4())
    rendered = render_jobset(ResilientTrainingJob.from_object(body), 1, None)
    js: dict[str, Any] = json.loads(json.dumps(rendered).replace(jobset_name(name, 1), name))
    js["metadata"] = {
        "name": name,
        "namespace": ns,
        "labels": {keys.KUEUE_QUEUE_LABEL: testenv.LOCAL_QUEUE},
    }
    js["spec"]["failurePolicy"] = {
        "maxRestarts": MAX_RESTARTS,
        "restartStrategy": strategy,
        "rules": [{"name": "restartOnAnyFailure", "action": "RestartJobSet"}],
    }
    for meta in (
        js["spec"]["replicatedJobs"][0]["template"]["metadata"],
        js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"],
    ):
        labels = meta.get("labels") or {}
        for key in (keys.JOB_LABEL, keys.ATTEMPT_LABEL):
            labels.pop(key, None)
        meta["labels"] = labels
    return js


def rtj_generation(labels: dict[str, str]) -> tuple[str, int] | None:
    job, attempt = labels.get(keys.JOB_LABEL), labels.get(keys.ATTEMPT_LABEL)
    return (job, int(attempt)) if job and attempt and attempt.isdigit() else None


def jobset_generation(labels: dict[str, str]) -> tuple[str, int] | None:
    job, restarts = labels.get(keys.JOBSET_NAME_LABEL), labels.get(RESTARTS_LABEL)
    return (job, int(restarts) + 1) if job and restarts and restarts.isdigit() else None


def clean_up(kube: Kube, tn: testenv.TestNamespace) -> None:
    """Delete the groups and wait for their pods to go, then the namespace: the
    harness's teardown would otherwise race hundreds of pods being deleted."""
    t = time.monotonic()
    ns = tn.name
    try:
        for obj in kube.list_rtjs(ns):
            with contextlib.suppress(NotFound):
                kube.delete_rtj(ns, obj["metadata"]["name"])
        for js in kube.list_jobsets(ns):
            with contextlib.suppress(NotFound):
                kube.request(
                    "delete jobset", "DELETE",
                    f"/apis/{JOBSET_GROUP}/{JOBSET_VERSION}/namespaces/{ns}/jobsets/"
                    f"{js['metadata']['name']}",
                    {"propagationPolicy": "Background"},
                )  # fmt: skip
        deadline = time.monotonic() + 240
        while kube.list_pods(ns) and time.monotonic() < deadline:
            time.sleep(1.0)
    except Exception as exc:
        print(f"note: deleting the groups of {ns}: {type(exc).__name__}: {exc}")
    for attempt in (1, 2):
        try:
            testenv.delete_test_namespace(tn, timeout=300)
            print(f"   cleaned up {ns} in {time.monotonic() - t:.1f}s", flush=True)
            return
        except Exception as exc:  # cleanup must not hide the figures
            print(f"note: cleaning up {ns} (try {attempt}): {type(exc).__name__}: {exc}")
