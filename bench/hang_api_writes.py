"""Section 2 of the hang-detection bench: the operator's API-server requests in steady state,
the operator as a process against KWOK with one job of N pods Running."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench.hang_sidecars import PORT
from bench.scale_probes import delta
from rtj_operator.pod_http import PollFailed, fetch_progress

WRITES = frozenset({"create", "update", "patch", "delete", "deletecollection"})


def api_bench(a: argparse.Namespace) -> dict[str, Any]:
    from bench.operator_scale import COMPONENTS, Bench
    from bench.operator_scale_workload import rtj_generation, worker_body
    from bench.scale_probes import Observed, RawWatch, RssSampler
    from e2e.cluster import kwok, testenv
    from e2e.cluster.cluster import LocalCluster
    from e2e.operator_proc import OperatorProcess, install_crd
    from rtj_operator.api import keys

    sizes = sorted(a.api_sizes)
    cluster = LocalCluster(f"rtj-bench-hang-{os.getpid()}", nodes=sizes[0])
    out: dict[str, Any] = {"sizes": {}, "nodes": sizes[-1]}
    try:
        t = time.monotonic()
        bench = Bench(argparse.Namespace(), str(cluster.up()), {})
        bench.pids = {p.name: p.pid for p in cluster.state.procs if p.name in COMPONENTS}
        install_crd(bench.kube)
        with ThreadPoolExecutor(4) as pool:  # one node per worker (required anti-affinity)
            nodes = range(sizes[0], sizes[-1])
            list(pool.map(lambda i: bench.harness.apply(kwok.node_manifest(i, sizes[-1])), nodes))
        print(f"2. KWOK: {sizes[-1]} nodes in {time.monotonic() - t:.0f}s", flush=True)
        for n in sizes:
            tn = testenv.create_test_namespace(bench.harness, f"bench-hang-{n}", 8 * n)
            obs, api = Observed(rtj_generation), bench.harness.api
            rtjs = f"/apis/{keys.GROUP}/{keys.VERSION}/namespaces/{tn.name}/{keys.PLURAL}"
            watches = [RawWatch(api, f"/api/v1/namespaces/{tn.name}/pods", obs.on_pod,
                                keys.JOB_LABEL), RawWatch(api, rtjs, obs.on_rtj)]  # fmt: skip
            for w in watches:
                w.start()
            op = OperatorProcess(bench.kubeconfig, tn.name, bench.logs, lease_name=f"hang-{n}")
            sampler = RssSampler(op.start().proc.pid)  # type: ignore[union-attr]
            sampler.start()
            size: dict[str, Any] = out["sizes"].setdefault(str(n), {})
            try:
                t0 = time.monotonic()
                bench.kube.create_rtj(tn.name, worker_body("hang", tn.name, n, 8))
                while time.monotonic() < t0 + a.startup_budget:
                    with obs.lock:
                        phase = ((obs.rtjs.get("hang") or {}).get("status") or {}).get("phase")
                    if obs.running_count() >= n and phase == "Running":
                        break
                    time.sleep(0.5)
                size.update(startup_s=time.monotonic() - t0, running=obs.running_count())
                if size["running"] < n:
                    size["skipped"] = f"{size['running']} Running after {a.startup_budget:.0f} s"
                    size["log"] = [ln[:300] for ln in op.log().splitlines() if re.search(
                        "NodeLost|PodsReadyTimeout|cannot be scheduled", ln)][:3]  # fmt: skip
                    continue
                size["probe"] = probe(bench.kube.list_pods(tn.name))
                time.sleep(a.settle)
                c0, o0, cpu0, w0 = bench._snapshot(op)
                time.sleep(a.window)
                c1, o1, cpu1, w1 = bench._snapshot(op)
                s, mine = w1 - w0, delta(o1, o0)
                lease = sum(c for (v, r), c in mine.items() if v in WRITES and r == "leases")
                size.update(
                    window_s=s, rss_mib=sampler.peak, load1=os.getloadavg()[0],
                    requests={f"{v} {r}": c for (v, r), c in mine.most_common()},
                    writes=(sum(c for (v, _), c in mine.items() if v in WRITES) - lease) / s,
                    lease_writes=lease / s,
                    reads=sum(c for (v, _), c in mine.items() if v not in WRITES) / s,
                    cluster=sum(delta(c1, c0).values()) / s,
                    cpu={k: 100 * (cpu1[k] - cpu0[k]) / s for k in cpu1 if k in cpu0},
                )  # fmt: skip
            finally:
                print(f"   N={n}: {size}", flush=True)
                sampler.stop()
                for w in watches:
                    w.stop()
                op.stop()
                bench._clean_up(tn)
        bench.harness.close()
    finally:
        cluster.down(check=False)
        shutil.rmtree(cluster.dir, ignore_errors=True)
    return out


def probe(pods: list[dict[str, Any]]) -> str:
    """What one `GET /progress` to a KWOK pod's IP gets on this machine, and how fast."""
    ip = next((p["status"].get("podIP") for p in pods if p["status"].get("podIP")), None)
    started = time.perf_counter()
    try:
        fetch_progress(str(ip), PORT, 2.0)
        got = "an answer"
    except PollFailed as exc:
        got = str(exc)
    return f"{ip}: {got} after {1e3 * (time.perf_counter() - started):.0f} ms"
