"""The control-plane part of an in-place restart with a warm spare, at KWOK scale (issue 15):
one ResilientTrainingJob of N workers (one GPU each, one per node: the operator's required
anti-affinity) and ``spec.spares: 1``, restart in place on, the operator as its own process
with its control secret. Every pod's progress sidecar and supervisor is stood in for by
`bench.sidecar_sim` (KWOK starts no container), which checks the operator's signed orders
with the product's own code and answers at once: what is measured is the operator, the API
server and the controllers, not a trainer's start (`bench.in_place` measures that with real
training on the pod runner).

The fault: the GPU health agent's XID 79 condition on worker 1's node and that pod's command
exiting 1 (as `bench.in_place`'s GPU fault). The operator quarantines the node, gives the
spare rank 1, deletes the pod, orders every pod to stop, waits for all to report stopped
(the barrier), orders them to run, and records the restart once every pod runs the new
generation. Read from the attempt's record (`inPlaceRestarts`, microsecond timestamps),
measured from the exit the stand-in reported:

- detect: to `detectedAt` (the restart begun: the spare chosen, the pod deleted);
- stopped: to `stoppedAt` (every pod stopped, the pin chosen);
- running: to `startedAt` (every pod runs the new generation): the recovery;
- the operator's CPU and API requests from the fault to 3 s after `startedAt`, and the
  sidecar requests it made (orders and progress reads) in that window.

Each size starts its own cluster (N + 3 nodes: the spare, and the node the Job's replacement
pod lands on; pods on loopback addresses, `LocalCluster(loopback_pods=True)`; a deleted pod
turns Failed before it goes, as a kubelet writes it: the barrier counts a replaced pod gone
at its terminal phase, and KWOK's plain delete leaves it Running until the Job controller's
10 s index back-off lets it go), with KWOK's
node Lease at ``--lease`` seconds (120 by default: 1,250 nodes renewing every 5 s starve a
2-CPU machine, hang-detection.md).

    python -m bench.in_place_scale [--sizes 8,128,1250] [--lease 120] [--no-lease-signal]
        [--leader-lease 15] [--markdown F]
"""

from __future__ import annotations

import argparse
import os
import platform
import secrets
import shutil
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from bench import large_cluster, sidecar_sim
from bench.scale_probes import cpu_seconds, delta, operator_requests
from e2e.cluster import faults, testenv
from e2e.cluster.cluster import LocalCluster
from e2e.cluster.kube import Kube as HarnessKube
from e2e.operator_proc import (
    OperatorProcess,
    client,
    install_crd,
    rtj_body,
    wait_for,
)
from rtj_operator.api import keys

PORT = 9479
"""The stand-in sidecars' port (spec.progress.port; not 9478, which `bench.hang_detection`
binds on 127.3.x.y)."""
GPUS_PER_NODE = 8
VICTIM_RANK = 1
SETTLE_SECONDS = 5.0
AFTER_SECONDS = 3.0
JOB = "big"


def job_body(ns: str, workers: int, spares: int = 1) -> dict[str, Any]:
    body = rtj_body(
        JOB, ns, f"file:///mnt/ckpt/{JOB}", replicas=workers, spares=spares,
        recovery={"inPlace": True, "inPlaceMaxReplacedPods": 1, "inPlaceDeadlineSeconds": 300},
        progress={"port": PORT},
    )  # fmt: skip
    container = body["spec"]["template"]["spec"]["containers"][0]
    container["resources"] = {
        "requests": {"nvidia.com/gpu": "1", "cpu": "1", "memory": "1Gi"},
        "limits": {"nvidia.com/gpu": "1"},
    }
    return body


def _stamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def trial(
    workers: int,
    lease: int,
    logs: Path,
    spares: int = 1,
    *,
    lease_signal: bool = True,
    leader_lease: float = 15.0,
    pods_ready_timeout: str = large_cluster.LARGE_PODS_READY_TIMEOUT,
) -> dict[str, Any]:
    """One size on its own cluster: the figures, or the problem that stopped it
    (``lease_signal``: the operator watches node Leases; ``leader_lease``: its own Lease's
    duration, renewed within three quarters of it)."""
    nodes = workers + 3
    cluster = LocalCluster(f"rtj-bench-inplace-{os.getpid()}-{workers}", nodes=nodes,
                           node_lease_seconds=lease, loopback_pods=True,
                           terminal_phase_on_delete=True,
                           pods_ready_timeout=pods_ready_timeout)  # fmt: skip
    out: dict[str, Any] = {"workers": workers, "nodes": nodes, "lease": lease,
                           "spare_count": spares, "load_start": os.getloadavg()[0],
                           "lease_signal": lease_signal, "leader_lease": leader_lease}  # fmt: skip
    started = time.monotonic()
    sim: sidecar_sim.SimProcess | None = None
    op: OperatorProcess | None = None
    try:
        kubeconfig = str(cluster.up())
        out["cluster_up"] = time.monotonic() - started
        harness = HarnessKube(kubeconfig)
        kube = client(kubeconfig)
        install_crd(kube)
        tn = testenv.create_test_namespace(harness, "bench-inplace", nodes * GPUS_PER_NODE)
        ns = tn.name
        secret = logs / f"control-secret-{workers}"
        secret.write_text(secrets.token_hex(32))
        sim = sidecar_sim.SimProcess(kubeconfig, ns, PORT)
        flags = large_cluster.operator_flags(lease_signal, leader_lease)
        op = OperatorProcess(kubeconfig, ns, logs, lease_name=f"inplace-{uuid.uuid4().hex[:6]}",
                             extra=("--control-secret-file", str(secret),
                                    "--progress-poll-seconds", "1", *flags))  # fmt: skip
        op.start()
        assert op.proc is not None
        created = time.monotonic()
        harness.custom.create_namespaced_custom_object(
            keys.GROUP, keys.VERSION, ns, keys.PLURAL, job_body(ns, workers, spares)
        )

        def rtj() -> dict[str, Any]:
            got: dict[str, Any] = harness.custom.get_namespaced_custom_object(
                keys.GROUP, keys.VERSION, ns, keys.PLURAL, JOB
            )
            return got

        def all_reporting() -> bool:
            stats = sim.ask("stats") if sim is not None else {}
            states = stats.get("states") or {}
            return bool(stats.get("pods") == workers + spares
                        and states.get("0 running") == workers
                        and states.get("0 stopped", 0) == spares)  # fmt: skip

        wait_for("every pod running and reporting", all_reporting, 900, 1.0)
        wait_for("the job Running", lambda: (rtj().get("status") or {}).get("phase")
                 == "Running", 300, 0.5)  # fmt: skip
        out["startup"] = time.monotonic() - created
        time.sleep(SETTLE_SECONDS)
        pods = harness.core.list_namespaced_pod(ns, label_selector=f"{keys.JOB_LABEL}={JOB}").items
        index = "batch.kubernetes.io/job-completion-index"
        victim = next(p for p in pods
                      if (p.metadata.annotations or {}).get(index) == str(VICTIM_RANK)
                      and "-worker-" in p.metadata.name)  # fmt: skip
        quiet_cpu = cpu_seconds(op.proc.pid)
        time.sleep(SETTLE_SECONDS)
        out["quiet_cpu_rate"] = (cpu_seconds(op.proc.pid) - quiet_cpu) / SETTLE_SECONDS
        before_requests = operator_requests(op.metrics())
        before_served = sim.ask("stats")["served"]
        before_cpu = cpu_seconds(op.proc.pid)
        faults.gpu_xid(harness, victim.spec.node_name, 79)
        exited = sim.ask("exit", victim.metadata.name, 1)
        if exited is None:
            raise RuntimeError(f"the stand-in has no pod {victim.metadata.name}")

        def restarted() -> dict[str, Any] | None:
            attempts = (rtj().get("status") or {}).get("attempts") or [{}]
            entries = attempts[-1].get("inPlaceRestarts") or []
            done = [e for e in entries if e.get("outcome")]
            return done[-1] if done else None

        entry = wait_for("the restart in place", restarted, 600, 0.1)
        end = _stamp(entry["startedAt"]) if entry.get("startedAt") else time.time()
        time.sleep(max(end + AFTER_SECONDS - time.time(), 0.0))
        window = time.time() - exited
        out.update(
            outcome=entry.get("outcome"), failure_class=entry.get("failureClass"),
            spares=entry.get("spares"), replaced=entry.get("replaced"),
            detect=_stamp(entry["detectedAt"]) - exited,
            stopped=_stamp(entry["stoppedAt"]) - exited if entry.get("stoppedAt") else None,
            running=end - exited if entry.get("startedAt") else None,
            operator_cpu=cpu_seconds(op.proc.pid) - before_cpu, window=window,
            operator_requests=sum(delta(operator_requests(op.metrics()), before_requests)
                                  .values()),
            sidecar_requests={k: v - before_served.get(k, 0)
                              for k, v in sim.ask("stats")["served"].items()},
            load_end=os.getloadavg()[0],
        )  # fmt: skip
        out["operator_cpu_less_quiet"] = max(
            out["operator_cpu"] - out["quiet_cpu_rate"] * window, 0.0
        )
        harness.close()
    except Exception as exc:  # a size that cannot run here is reported, not fatal
        out["problem"] = f"{type(exc).__name__}: {exc}"
    finally:
        if op is not None:
            op.stop()
        if sim is not None:
            sim.close()
        problems = cluster.down(check=False)
        if problems:
            out["teardown"] = str(problems)
        shutil.rmtree(cluster.dir, ignore_errors=True)
    out["seconds"] = time.monotonic() - started
    return out


def _f(value: Any, fmt: str = "{:.2f}") -> str:
    return "-" if value is None else fmt.format(value)


def markdown(results: list[dict[str, Any]], command: str) -> str:
    lines = [
        "# Restart in place at KWOK scale (issue 15)",
        "",
        f"Generated by `{command}` on {platform.node()} ({os.cpu_count()} CPUs), "
        f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC. One job of N workers and its "
        "spares (none: the Job controller creates the failed pod again); the fault is an "
        "XID 79 on worker 1's node with its command exiting 1. "
        "Seconds from the exit (as the stand-in sidecar reported it) to the record's "
        "timestamps; CPU and requests from the exit to 3 s after every pod ran the new "
        "generation. The sidecars and supervisors are stand-ins (`bench.sidecar_sim`): a "
        "supervisor carries out an order as soon as its sidecar took it (the doorbell), the "
        "sidecar answers with the pod's report after it, and its trainer stops and starts "
        "in no time: the control plane alone. The operator polls "
        "every 1 s (`--progress-poll-seconds 1`; the default is 5 s, which lengthens "
        "detection, not the restart after it).",
        "",
        "| pods (N + spares) | nodes | detect s | every pod stopped s | every pod running s "
        "| operator CPU s (less quiet) | operator API requests | orders / progress reads "
        "| outcome | load start / end |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if "problem" in r:
            lines.append(f"| {r['workers']} + 1 | {r['nodes']} | did not run: {r['problem']} "
                         "| | | | | | | |")  # fmt: skip
            continue
        served = r.get("sidecar_requests") or {}
        orders = sum(v for k, v in served.items() if k.startswith("order"))
        lines.append(
            f"| {r['workers']} + {r.get('spare_count', 1)} | {r['nodes']} | {_f(r['detect'])} "
            f"| {_f(r['stopped'])} "
            f"| **{_f(r['running'])}** | {_f(r['operator_cpu'])} "
            f"({_f(r['operator_cpu_less_quiet'])}) | {r['operator_requests']:.0f} "
            f"| {orders} / {served.get('progress', 0)} | {r['outcome']} "
            f"| {r['load_start']:.1f} / {r['load_end']:.1f} |"
        )
    lines += ["", "Spares and replaced pods per size:", ""]
    lines += [f"- {r['workers']}: {r.get('spares')}; replaced {r.get('replaced')}; class "
              f"{r.get('failure_class')}; cluster up {_f(r.get('cluster_up'), '{:.0f}')} s, "
              f"job running {_f(r.get('startup'), '{:.0f}')} s after its creation; KWOK's "
              f"node Lease {r.get('lease')} s, "
              f"{'watched' if r.get('lease_signal', True) else 'not watched'} by the operator; "
              f"its own Lease {r.get('leader_lease', 15.0):g} s"
              for r in results if "problem" not in r]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.in_place_scale", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--sizes", default="8,128,1250", help="workers per trial, comma-separated")
    ap.add_argument(
        "--spares",
        type=int,
        default=1,
        help="spec.spares (0: the failed pod is replaced by the Job controller)",
    )
    large_cluster.add_arguments(
        ap, lease=120, pods_ready_timeout=large_cluster.LARGE_PODS_READY_TIMEOUT
    )
    ap.add_argument("--markdown", type=Path, default=None)
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    logs = Path(tempfile.mkdtemp(prefix="rtj-bench-inplace-"))
    results = []
    for workers in sizes:
        print(f"== {workers} workers + {args.spares} spare(s)", flush=True)
        r = trial(workers, args.lease, logs, args.spares, lease_signal=args.lease_signal,
                  leader_lease=args.leader_lease,
                  pods_ready_timeout=args.pods_ready_timeout)  # fmt: skip
        print({k: v for k, v in r.items()}, flush=True)
        results.append(r)
    command = "python -m bench.in_place_scale " + " ".join(argv or sys.argv[1:])
    text = markdown(results, command.strip())
    sys.stdout.write(text)
    if args.markdown:
        args.markdown.write_text(text)
    print(f"(operator logs in {logs})")
    return 0  # a size this machine cannot run is a row of the report, as a miss is


if __name__ == "__main__":
    sys.exit(main())
