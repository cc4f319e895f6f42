"""A real kubelet with containerd and runc (e2e/cluster/real_node.py) runs what only a real
node can prove: our resolver image as the resume init container and the progress sidecar of
a worker pod the operator renders, termination messages as the kubelet writes them, and an
OOM kill by the container's memory cgroup, each read back from the API server and handed to
the operator's classifier.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster.real_node import RealNode, record
from e2e.operator_proc import rtj_body
from rtj_operator.api import FailureClass, ResilientTrainingJob, keys
from rtj_operator.policy.classify import classify_failure
from rtj_operator.policy.render import jobset_name, pod_template
from rtj_shim.checkpoint.protocol import CommitProtocol
from rtj_shim.checkpoint.storage import open_store

pytestmark = [pytest.mark.cluster, pytest.mark.local_only]
Obj = dict[str, Any]
WAIT = 120.0


def _run_pod(node: RealNode, kube: Any, ns: str, name: str, spec: Obj) -> Obj:
    """Create a pod on the real node; wait until it has finished; its body as the API has it."""
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": ns}, "spec": node.place(spec)}  # fmt: skip
    kube.core.create_namespaced_pod(ns, pod)
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        body: Obj = kube.api.sanitize_for_serialization(kube.core.read_namespaced_pod(name, ns))
        if (body.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return body
        time.sleep(0.3)
    raise TimeoutError(f"pod {ns}/{name} did not finish within {WAIT:.0f}s: {body.get('status')}")


def _terminated(pod: Obj, container: str, field: str = "containerStatuses") -> Obj:
    status = next(s for s in pod["status"].get(field) or [] if s["name"] == container)
    terminated: Obj = status["state"]["terminated"] or status.get("lastState", {})["terminated"]
    return terminated


def _python(code: str) -> list[str]:
    return ["/usr/bin/python3", "-c", code]


def test_a_rendered_worker_resumes_in_our_resolver_image_on_a_real_kubelet(
    rtj_real_node: RealNode, rtj_cluster: Any, rtj_ns: Any, tmp_path: Path
) -> None:
    """The worker pod the operator renders for attempt 2, pinned to a verified step of a
    file:// store on the node: the resume init container (our resolver image, non-root,
    restricted) verifies it and writes resume.json and its termination message; the native
    progress sidecar starts; the trainer reads what the resolver wrote."""
    node, kube, ns = rtj_real_node, rtj_cluster.kube, rtj_ns.name
    store = tmp_path / "ckpt"
    shard = tmp_path / "shard"
    shard.mkdir()
    (shard / "model.bin").write_bytes(os.urandom(1 << 20))
    CommitProtocol(open_store(str(store)), attempt="1").publish_directory(300, shard)
    for d, _, files in os.walk(store):  # the resolver runs as UID 65532
        os.chmod(d, 0o755)
        for f in files:
            os.chmod(os.path.join(d, f), 0o644)
    body = rtj_body("llm", ns, "file:///ckpt", replicas=1)
    trainer = body["spec"]["template"]["spec"]["containers"][0]
    trainer.update(
        image=node.refs["rtj-resolver"],
        imagePullPolicy="Never",
        command=_python(
            "import json, pathlib; r = json.loads(pathlib.Path("
            f"'{keys.DEFAULT_RESUME_FILE}').read_text()); print('resuming', r['step'])"
        ),
        resources={"limits": {"cpu": "1", "memory": "256Mi"}},
        volumeMounts=[{"name": "ckpt", "mountPath": "/ckpt", "readOnly": True}],
    )
    body["spec"]["template"]["spec"]["volumes"] = [
        {"name": "ckpt", "hostPath": {"path": str(store), "type": "Directory"}}
    ]
    body["spec"]["checkpoint"]["resolverImage"] = node.refs["rtj-resolver"]
    body["metadata"]["uid"] = "0f0f-uid"
    rtj = ResilientTrainingJob.from_object(body)
    spec = pod_template(rtj, 2, 300, jobset_name("llm", 2))["spec"]
    for c in [*spec["initContainers"], *spec["containers"]]:
        c["imagePullPolicy"] = "Never"
    spec.pop("affinity", None)  # one worker per node is the JobSet's, not this bare pod's

    pod = _run_pod(node, kube, ns, "llm-worker-0", spec)

    assert pod["status"]["phase"] == "Succeeded", pod["status"]
    resolved = _terminated(pod, keys.RESUME_INIT_CONTAINER, "initContainerStatuses")
    assert resolved["exitCode"] == 0 and resolved["reason"] == "Completed"
    report = json.loads(resolved["message"])  # written by rtj-shim resolve --termination-log
    assert report["step"] == 300, report
    sidecar = next(
        s for s in pod["status"]["initContainerStatuses"] if s["name"] == keys.PROGRESS_SIDECAR
    )
    assert sidecar["started"] is not None and sidecar["restartCount"] == 0, sidecar
    assert _terminated(pod, "trainer")["exitCode"] == 0


def test_termination_messages_as_the_kubelet_writes_them_reach_the_classifier(
    rtj_real_node: RealNode, rtj_cluster: Any, rtj_ns: Any
) -> None:
    """A container that writes /dev/termination-log and exits 1, and one that only prints a
    line and a traceback under FallbackToLogsOnError: the kubelet's message in each case is
    the file, or the tail of the log. stdout and stderr reach the log through separate
    streams of the runtime, so a line flushed to stdout before the traceback may land
    anywhere among its lines in the message (seen before it, after it, and between its
    `File` line and the exception's, in CI on 2026-12-03): classifiers must not rely on the
    order of lines from the two streams, only on each stream's own."""
    node, kube, ns = rtj_real_node, rtj_cluster.kube, rtj_ns.name
    image = node.refs["rtj-resolver"]
    written = _run_pod(node, kube, ns, "writes", {
        "restartPolicy": "Never",
        "containers": [{
            "name": "trainer", "image": image, "imagePullPolicy": "Never",
            "command": _python("import pathlib, sys; pathlib.Path('/dev/termination-log')"
                               ".write_text('NCCL error: unhandled system error'); sys.exit(1)"),
        }],
    })  # fmt: skip
    fallback = _run_pod(node, kube, ns, "logs", {
        "restartPolicy": "Never",
        "containers": [{
            "name": "trainer", "image": image, "imagePullPolicy": "Never",
            "terminationMessagePolicy": "FallbackToLogsOnError",
            "command": _python("print('step 7 loss 2.1', flush=True)\n"
                               "raise ValueError('bad batch shape')"),
        }],
    })  # fmt: skip
    record(written, "termination_log_file")
    record(fallback, "fallback_to_logs_traceback")
    one, three = _terminated(written, "trainer"), _terminated(fallback, "trainer")
    assert (one["exitCode"], one["reason"]) == (1, "Error")
    assert one["message"] == "NCCL error: unhandled system error"
    assert (three["exitCode"], three["reason"]) == (1, "Error")
    traceback = (
        'Traceback (most recent call last):\n  File "<string>", line 2, in <module>\n'
        "ValueError: bad batch shape\n"
    )
    lines = three["message"].splitlines(keepends=True)
    assert "step 7 loss 2.1\n" in lines, three["message"]
    lines.remove("step 7 loss 2.1\n")  # stderr's lines keep their own order
    assert "".join(lines) == traceback, three["message"]
    for pod in (written, fallback):
        found = classify_failure([pod], None, [], datetime.now(timezone.utc))
        assert found is not None and found.first_failed is not None
        assert found.first_failed.pod == pod["metadata"]["name"]


def test_a_worker_over_its_memory_limit_is_oomkilled_and_classified_out_of_memory(
    rtj_real_node: RealNode, rtj_cluster: Any, rtj_ns: Any
) -> None:
    node, kube, ns = rtj_real_node, rtj_cluster.kube, rtj_ns.name
    pod = _run_pod(node, kube, ns, "hog", {
        "restartPolicy": "Never",
        "containers": [{
            "name": "trainer", "image": node.refs["rtj-resolver"], "imagePullPolicy": "Never",
            "command": _python("chunks = []\nwhile True: chunks.append(bytearray(16 << 20))"),
            "resources": {"limits": {"memory": "64Mi", "cpu": "1"}},
        }],
    })  # fmt: skip
    record(pod, "cgroup_oom_killed")
    killed = _terminated(pod, "trainer")
    assert (killed["reason"], killed["exitCode"]) == ("OOMKilled", 137), killed
    found = classify_failure([pod], None, [], datetime.now(timezone.utc))
    assert found is not None and found.failure_class is FailureClass.OUT_OF_MEMORY, found
