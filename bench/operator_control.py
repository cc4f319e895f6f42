"""The operator's control loop against the real API server of the local cluster harness.

1. detection: a pod's Failed status (written as the kubelet would) -> the RTJ's classified
   attempt record in status; target median < 1 s.
2. restart: the same Failed status -> the next attempt's JobSet created, minus the
   configured backoff (1 s here); target median < 2 s. This includes converging: the old
   JobSet and every old pod are deleted at once, and all must be gone first.
3. throughput: 200 RTJs created at once; reconciles per second while the operator starts
   all 200 attempts (from its own `rtj_reconciles_total`); target >= 20/s. Also the time
   until every one of the 200 has its JobSet.
4. memory: the operator's resident set with 200 RTJs and 1,600 pods (8 per job) running;
   target < 250 MiB.

The operator runs as its own process (`python -m rtj_operator run`). The cluster is the
harness's (`e2e.cluster`): started here (24 KWOK nodes) unless RTJ_E2E_KUBECONFIG points at
a running one. Each line prints the figure, the target and PASS/MISS; a miss never fails.

    python -m bench.operator_control [--restarts 10] [--jobs 200] [--pods-per-job 8] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from e2e.cluster import faults, testenv
from e2e.cluster.cluster import LocalCluster
from e2e.cluster.kube import Kube as HarnessKube
from e2e.operator_proc import (
    OperatorProcess,
    client,
    install_crd,
    jobsets_of,
    rtj_body,
    rtj_status,
    running_pods,
    wait_for,
)
from rtj_operator.api import keys

REPO = Path(__file__).resolve().parent.parent
BACKOFF_SECONDS = 1


@dataclass
class Figure:
    name: str
    value: float
    unit: str
    target: str
    ok: bool
    detail: str = ""

    def line(self) -> str:
        verdict = "PASS" if self.ok else "MISS"
        head = f"{self.name:<46} {self.value:>10.3f} {self.unit:<6}"
        return f"{head} target {self.target:<10} {verdict}  {self.detail}"


def _poll(fn: Callable[[], Any], timeout: float, every: float = 0.01) -> float:
    """Seconds (monotonic) at which fn() first returned truthy."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if fn():
            return time.monotonic()
        time.sleep(every)
    raise TimeoutError("condition not reached")


def bench_restarts(
    kube: Any, harness: HarnessKube, ns: str, op: OperatorProcess, n: int
) -> list[Figure]:
    backoff = {"initialSeconds": BACKOFF_SECONDS, "maxSeconds": BACKOFF_SECONDS}
    policy = {"maxRestarts": n + 1, "backoff": backoff}
    body = rtj_body("lat", ns, "file:///mnt/ckpt/lat", replicas=2, failurePolicy=policy)
    kube.create_rtj(ns, body)
    detection, restart = [], []
    for attempt in range(1, n + 1):
        pods = wait_for("pods running", lambda a=attempt: running_pods(kube, ns, "lat", a, 2), 120)
        wait_for("phase Running", lambda: rtj_status(kube, ns, "lat").get("phase") == "Running", 30)
        victim = pods[0]["metadata"]["name"]
        t0 = time.monotonic()
        faults.terminate_container(
            harness, ns, victim, exit_code=1, message="NCCL error: remote process exited"
        )

        def classified(a: int = attempt) -> bool:
            attempts = rtj_status(kube, ns, "lat").get("attempts") or []
            return len(attempts) >= a and bool(attempts[a - 1].get("failureClass"))

        t1 = _poll(classified, 30)
        nxt = f"lat-a{attempt + 1}"
        t2 = _poll(
            lambda nxt=nxt: any(j["metadata"]["name"] == nxt for j in jobsets_of(kube, ns, "lat")),
            60,
        )
        detection.append(t1 - t0)
        restart.append(t2 - t0 - BACKOFF_SECONDS)
    d, r = statistics.median(detection), statistics.median(restart)
    return [
        Figure("detection: Failed pod -> classified record", d, "s", "< 1 s", d < 1.0,
               f"p max {max(detection):.3f}s over {n}"),
        Figure("restart: Failed pod -> next JobSet - backoff", r, "s", "< 2 s", r < 2.0,
               f"max {max(restart):.3f}s over {n}; backoff {BACKOFF_SECONDS:.0f}s excluded"),
    ]  # fmt: skip


def bench_scale(
    kube: Any, ns: str, start: Callable[[], OperatorProcess], jobs: int, pods_per_job: int
) -> list[Figure]:
    """200 jobs created while no operator runs; then one starts and works the backlog."""
    container = {
        "name": "trainer", "image": "registry.example/trainer:dev", "command": ["train"],
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
    }  # fmt: skip

    def create(i: int) -> None:
        body = rtj_body(f"j{i:03d}", ns, f"file:///mnt/ckpt/j{i:03d}", replicas=pods_per_job)
        body["spec"]["template"] = {"spec": {"containers": [container]}}
        kube.create_rtj(ns, body)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(create, range(jobs)))

    def started() -> int:
        return sum(1 for o in kube.list_rtjs(ns) if (o.get("status") or {}).get("attempt") == 1)

    op = start()
    t0 = time.monotonic()
    _poll(lambda: started() == jobs, 300, every=0.1)
    elapsed = time.monotonic() - t0
    done = op.metric("rtj_reconciles_total", result="ok")
    conflicts = op.metric("rtj_reconciles_total", result="conflict")
    figures = [
        Figure(f"reconciles/s, backlog of {jobs} new jobs", done / elapsed, "1/s", ">= 20/s",
               done / elapsed >= 20,
               f"{done:.0f} reconciles ({conflicts:.0f} conflicts) in {elapsed:.1f}s"),
        Figure("attempts started/s (JobSet + status + Event)", jobs / elapsed, "1/s", ">= 20/s",
               jobs / elapsed >= 20, f"{jobs} jobs from operator start to all recorded"),
    ]  # fmt: skip

    def pods_running() -> bool:
        pods = kube.list_pods(ns, keys.JOB_LABEL)
        running = sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Running")
        return running >= jobs * pods_per_job

    _poll(pods_running, 900, every=2.0)
    phase = lambda: op.metric("rtj_jobs", phase="Running") == jobs  # noqa: E731
    _poll(phase, 120, every=0.5)
    time.sleep(5)  # let every watch event land
    rss = _rss_mib(op)
    figures.append(Figure(f"operator RSS, {jobs} RTJs + {jobs * pods_per_job} pods", rss, "MiB",
                          "< 250 MiB", rss < 250))  # fmt: skip
    # steady state: a fresh operator lists everything (200 jobs, 1,600 pods) and re-checks all
    op.stop()
    op = start()
    t1 = time.monotonic()
    _poll(lambda: op.metric("rtj_reconciles_total", result="ok") >= jobs, 120, every=0.05)
    relist = time.monotonic() - t1
    figures.append(Figure(f"re-list + reconcile all {jobs} running jobs", jobs / relist, "1/s",
                          ">= 20/s", jobs / relist >= 20,
                          f"{relist:.2f}s from a fresh start (lease, listing, indexes) to "
                          f"{jobs} reconciles"))  # fmt: skip
    rss2 = _rss_mib(op)
    figures.append(Figure("operator RSS after a fresh re-list", rss2, "MiB", "< 250 MiB",
                          rss2 < 250))  # fmt: skip
    op.stop()
    return figures


def _rss_mib(op: OperatorProcess) -> float:
    assert op.proc is not None
    for line in Path(f"/proc/{op.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.operator_control", description=__doc__)
    ap.add_argument("--restarts", type=int, default=10)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--pods-per-job", type=int, default=8)
    ap.add_argument("--nodes", type=int, default=24)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)

    attach = os.environ.get("RTJ_E2E_KUBECONFIG")
    cluster = None
    if attach:
        kubeconfig = attach
    else:
        cluster = LocalCluster("rtj-bench", nodes=args.nodes)
        if cluster.status().get("running"):
            cluster.down(check=False)
        t = time.monotonic()
        kubeconfig = str(cluster.up())
        print(f"cluster up in {time.monotonic() - t:.1f}s ({args.nodes} KWOK nodes)")
    harness = HarnessKube(kubeconfig)
    kube = client(kubeconfig)
    install_crd(kube)
    figures: list[Figure] = []
    logs = Path(tempfile.mkdtemp(prefix="rtj-bench-"))
    try:
        for label, run in (
            ("restarts", lambda ns, op: bench_restarts(kube, harness, ns, op, args.restarts)),
            ("scale", lambda ns, op: bench_scale(kube, ns, op.start, args.jobs, args.pods_per_job)),
        ):
            tn = testenv.create_test_namespace(harness, f"bench-{label}", 100000)
            op = OperatorProcess(
                kubeconfig, tn.name, logs, lease_name=f"bench-{uuid.uuid4().hex[:6]}"
            )
            if label == "restarts":  # the scale run starts its operator after creating jobs
                op.start()
            try:
                found = run(tn.name, op)
                for f in found:
                    print(f.line(), flush=True)
                figures += found
            finally:
                op.stop()
                try:
                    testenv.delete_test_namespace(tn, timeout=300)
                except Exception as exc:  # cleanup must not hide the figures
                    print(f"note: cleaning up {tn.name} failed: {type(exc).__name__}: {exc}")
    finally:
        harness.close()
        if cluster is not None:
            cluster.down(check=False)
    print("\nsummary:")
    for f in figures:
        print(f.line())
    print(f"(operator logs in {logs})")
    if args.json:
        args.json.write_text(json.dumps([asdict(f) for f in figures], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
