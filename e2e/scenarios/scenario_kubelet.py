"""What the kubelet would report that the harness's fault helpers do not say yet: the
resume init container failing (its exit and termination message, the pod Failed).

Imported by the scenario tests by this name (pytest puts this folder on ``sys.path``; like the
unit tests' support modules, it has a name no other module uses).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from e2e.cluster import faults
from e2e.cluster.kube import Kube as HarnessKube
from rtj_operator.api import keys

Obj = dict[str, Any]


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def kubelet_reports_init_failure(
    kube: HarnessKube, namespace: str, pod: str, *, exit_code: int, message: str
) -> None:
    """The kubelet's report of the resume init container failing (``restartPolicy: Never``):
    the init container terminated with its termination-log message, the trainer never
    started (waiting PodInitializing), the pod Failed, Initialized=False."""
    faults.ignore_in_kwok(kube, pod=(namespace, pod))
    p = kube.api.sanitize_for_serialization(kube.core.read_namespaced_pod(pod, namespace))
    now = _now()
    init = next(c for c in p["spec"]["initContainers"] if c["name"] == keys.RESUME_INIT_CONTAINER)
    trainer = p["spec"]["containers"][0]
    not_init = f"containers with incomplete status: [{keys.RESUME_INIT_CONTAINER}]"
    pending = f"containers with unready status: [{trainer['name']}]"
    status = {
        "phase": "Failed",
        "initContainerStatuses": [
            {
                "name": init["name"],
                "image": init["image"],
                "ready": False,
                "restartCount": 0,
                "started": False,
                "state": {
                    "terminated": {
                        "exitCode": exit_code,
                        "reason": "Error",
                        "message": message,
                        "startedAt": now,
                        "finishedAt": now,
                        "containerID": f"containerd://kwok-{pod}-{init['name']}",
                    },
                    "running": None,
                    "waiting": None,
                },
            }
        ],
        "containerStatuses": [
            {
                "name": trainer["name"],
                "image": trainer["image"],
                "ready": False,
                "restartCount": 0,
                "started": False,
                "state": {
                    "waiting": {"reason": "PodInitializing"},
                    "running": None,
                    "terminated": None,
                },
            }
        ],
        "conditions": [
            {
                "type": "Initialized",
                "status": "False",
                "reason": "ContainersNotInitialized",
                "message": not_init,
                "lastTransitionTime": now,
            },
            {
                "type": "Ready",
                "status": "False",
                "reason": "PodFailed",
                "message": pending,
                "lastTransitionTime": now,
            },
            {
                "type": "ContainersReady",
                "status": "False",
                "reason": "PodFailed",
                "message": pending,
                "lastTransitionTime": now,
            },
        ],
    }
    kube.core.patch_namespaced_pod_status(pod, namespace, {"status": status})
