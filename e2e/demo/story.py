"""The demo's story, phase by phase: control plane, store, runner, operator, job, fault,
recovery, summary. Each phase says what it does; ``down`` undoes all of it.

The platform (phases 1-4): `demo_platform`; the trainers' logs: `rank_logs`; what the demo
watches while the job runs: `watcher`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from typing import Any

import yaml

from e2e.cluster import faults
from e2e.cluster.kube import Kube as HarnessKube
from e2e.operator_proc import REPO
from e2e.podrunner.runner import descendants

from . import report
from .demo_platform import down as down
from .demo_platform import kubectl as kubectl
from .demo_platform import kubectl_path, load_state
from .demo_platform import start_platform as start_platform
from .options import BUCKET as BUCKET
from .options import EXAMPLE as EXAMPLE
from .options import FAULT_RANK as FAULT_RANK
from .options import NAMESPACE as NAMESPACE
from .options import QUEUE as QUEUE
from .options import SECRET as SECRET
from .options import XID as XID
from .options import DemoError as DemoError
from .options import Display as Display
from .options import Options as Options
from .rank_logs import all_rank_losses as all_rank_losses
from .rank_logs import collect_losses, pod_dir
from .watcher import Run, Watcher

_pod_dir = pod_dir  # the name the drills and benches use


def up(opts: Options, display: Display | None = None) -> report.Summary:
    """The whole story. Leaves the cluster, operator and runner running for a look around
    (``make demo-down`` stops them)."""
    d = display or Display()
    if load_state(opts):
        d.phase("Stopping what an earlier demo left running")
        down(opts, d)
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.state / "logs").mkdir(parents=True, exist_ok=True)
    state: dict[str, Any] = {"pids": {}}

    kubeconfig, kube, api = start_platform(opts, d, state)

    d.phase(f"5/7 kubectl apply -f {opts.example.relative_to(REPO)}")
    body = yaml.safe_load(opts.example.read_text())
    name = body["metadata"]["name"]
    d.detail(kubectl(kubeconfig, "apply", "-f", str(opts.example)))
    run = Run(name)
    watch = Watcher(opts, kube, api, d, run)
    watch.until("attempt 1 is training", lambda: run.progress.get(1, 0) >= 1, opts.timeout)

    d.phase(f"6/7 Fault: GPU XID {XID} on rank {FAULT_RANK}'s node once it passes step "
            f"{opts.fault_step}")  # fmt: skip
    watch.until(
        f"step {opts.fault_step}", lambda: run.progress.get(1, 0) >= opts.fault_step, opts.timeout
    )
    _inject_fault(opts, kube, d, run)
    watch.until("the job to finish", lambda: watch.phase in ("Succeeded", "Failed"), opts.timeout)

    d.phase("7/7 Summary")
    status = api.get_rtj(NAMESPACE, name).get("status") or {}
    losses, restored = collect_losses(opts, int(status.get("attempt") or 1))
    new_pods = (
        run.new_pods_running_at - run.fault_at
        if run.new_pods_running_at is not None and run.fault_at is not None
        else None
    )
    summary = report.summarize(
        name, status, losses, restored_step=restored.get(2), new_pods_running_seconds=new_pods
    )
    text = report.format_summary(
        summary, losses, kubectl(kubeconfig, "get", "rtj", "-n", NAMESPACE)
    )
    d.detail(text)
    svg = report.loss_svg(
        losses,
        fault_step=summary.last_step_before_fault,
        resume_step=summary.resumed_from_step,
        title=f"{name}: loss vs step (GPU fault, resumed from a verified checkpoint)",
    )
    (opts.out / "loss.svg").write_text(svg)
    (opts.out / "summary.txt").write_text(text + "\n")
    (opts.out / "summary.json").write_text(json.dumps(summary.as_json(), indent=2) + "\n")
    (opts.out / "status.json").write_text(json.dumps(status, indent=2) + "\n")
    d.line(f"wrote {opts.out / 'loss.svg'}, summary.txt, summary.json")
    d.line(f"look around: export KUBECONFIG={kubeconfig}; {kubectl_path()} get rtj,jobsets,pods,"
           f"nodes -n {NAMESPACE}; stop everything with `make demo-down`")  # fmt: skip
    if summary.phase != "Succeeded":
        raise DemoError(f"the job ended {summary.phase}; see {opts.out / 'status.json'}")
    return summary


def _inject_fault(opts: Options, kube: HarnessKube, d: Display, run: Run) -> None:
    """The node's GPU agent reports XID 79 and the rank's CUDA process dies with it."""
    pods = kube.core.list_namespaced_pod(
        NAMESPACE, label_selector=f"training.resilient.dev/job={run.name}"
    ).items
    raw = [kube.api.sanitize_for_serialization(p) for p in pods]
    victim = next(
        p for p in raw
        if p["metadata"]["labels"].get("training.resilient.dev/attempt") == "1"
        and p["metadata"]["labels"].get("batch.kubernetes.io/job-completion-index")
        == str(FAULT_RANK)
    )  # fmt: skip
    node = victim["spec"]["nodeName"]
    pid_file = pod_dir(opts, victim) / "containers" / "trainer" / "pid"
    pid = int(pid_file.read_text())
    workers = descendants(pid)
    faults.gpu_xid(kube, node, XID)
    run.fault_at = time.monotonic()
    for w in workers:  # the training process dies; torchrun (the entrypoint) reports it
        with contextlib.suppress(ProcessLookupError):
            os.kill(w, signal.SIGKILL)
    run.fault_node, run.fault_pod = node, victim["metadata"]["name"]
    d.line(f"node {node}: the GPU health agent reports XID {XID} (condition "
           f"{faults.XID_CONDITION_TYPE}: GPU has fallen off the bus)")  # fmt: skip
    d.line(f"pod {run.fault_pod} (rank {FAULT_RANK}): training process killed "
           f"(pids {workers}) at step {run.progress.get(1)}")  # fmt: skip
