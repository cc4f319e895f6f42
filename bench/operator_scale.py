"""Scale and latency of whole-group recovery (issue 6): the operator against JobSet's own
`RestartJobSet` failure policy, on the same simulated GPU cluster.

Workload: `--jobs` groups of `--workers` pods (1 GPU each by default, one worker of a group
per node: the operator's required pod anti-affinity) on `--nodes` KWOK nodes of 8 GPUs.
`--faults` of the groups get one rank's container ended with exit code 1 and an NCCL error
in its termination message, written as the kubelet reports it (faults.terminate_container);
the operator classifies that as NetworkFault (infrastructure) and restarts the group. The
faults are staggered `--stagger` seconds apart (0: all at once, from parallel threads).

Phase 1: RTJs (backoff initialSeconds 1), the operator as its own process. Phase 2: the
same groups as plain JobSets (attempt 1's, renamed, no owner, Kueue's queue label, `failurePolicy:
{maxRestarts: 3, restartStrategy: --baseline-strategy, rules: [{action: RestartJobSet}]}`).

Measured from raw watches that timestamp every change on receipt (no polling):
- detection: the victim's Failed status written (the status PATCH returned) -> the RTJ's
  attempt record carries a failure class; for JobSet, -> `status.restarts` became 1 (its
  restart decision). The operator's own `detectionSeconds` (from the container's
  `finishedAt`, whole seconds as the kubelet writes it) is shown beside it.
- recovery: the same Failed -> every pod of the next world (RTJ attempt 2 / JobSet
  restart-attempt 1) seen Running. For RTJ also minus the 1 s backoff. The stages in between
  are printed per fault: old pods all deleted, (RTJ) old JobSet gone, next JobSet created,
  next JobSet unsuspended by Kueue (admitted), first new pod, all new pods Running.
- API requests per recovery: `apiserver_request_total` (all clients, no watches) from just
  before the first fault to 5 s after the last recovery, less the injector's 3 a fault and
  the quiet window's background rate; the operator's `rtj_api_requests_total` (leases apart).
- CPU (user+sys, /proc/<pid>/stat) of the operator and the controllers in the same window;
  operator RSS (steady: the quiet window; peak: sampled every 0.25 s).
- correctness: every faulted RTJ on attempt 2 with exactly 2 records and one JobSet
  (<job>-a2), every other one untouched; the operator's restart counter equals the faults.

Each figure prints with its target and PASS/MISS; a miss never fails the run. The cluster is
started here (rtj-bench-scale-<pid>, torn down at the end) unless RTJ_E2E_KUBECONFIG names one.

    python -m bench.operator_scale [--jobs 50] [--workers 8] [--nodes 100] [--faults 10]
        [--stagger 0.5] [--baseline-strategy BlockingRecreate] [--json F]
        [--progress unanswered|off|answered] [--profile DIR]
        [--lease 20] [--no-lease-signal] [--leader-lease 15] [--pods-ready-timeout 120s]

`--progress`: the jobs' progress monitoring, on with nothing answering (the default: KWOK
starts no sidecar, so every poll finds nothing), off, or answered by `bench.sidecar_sim`'s
stand-in sidecars (pods on loopback addresses), as a real sidecar answers a poll. The
`--lease` line's four are for 1,000+ nodes on a small machine (`bench.large_cluster`). The groups
and faults: `bench.operator_scale_workload`; records and report: `bench.operator_scale_report`;
correctness checks: `bench.operator_scale_checks`; many jobs: `bench.operator_scale_jobs`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

from bench import large_cluster
from bench.operator_scale_args import GPUS_PER_NODE, parse_args
from bench.operator_scale_checks import verify_jobsets, verify_rtjs
from bench.operator_scale_report import (
    QUIET_SECONDS,
    FaultRecord,
    Phase,
    comparison,
    comparison_lines,
    fault_table,
    phase_figures,
)
from bench.operator_scale_workload import (
    FAULT_MESSAGE,
    SIM_PORT,
    baseline_jobset,
    clean_up,
    jobset_generation,
    rtj_generation,
    worker_body,
)
from bench.scale_probes import (
    Observed,
    Profiler,
    RawWatch,
    RssSampler,
    apiserver_metrics,
    apiserver_requests,
    cpu_seconds,
    delta,
    list_seconds,
    namespace_events,
    operator_reconciles,
    operator_requests,
    profile_summary,
    rss_mib,
)
from bench.sidecar_sim import SimProcess
from e2e.cluster import faults, testenv
from e2e.cluster.cluster import LocalCluster
from e2e.cluster.kube import JOBSET_GROUP, JOBSET_VERSION
from e2e.cluster.kube import Kube as HarnessKube
from e2e.operator_proc import OperatorProcess, client, install_crd
from rtj_operator.api import keys
from rtj_operator.kube import Kube
from rtj_operator.policy.render import jobset_name

INDEX_LABEL = keys.JOB_COMPLETION_INDEX
SETTLE_SECONDS = 5.0
SIM_NAME = "stand-in sidecars"
COMPONENTS = ("jobset", "kueue", "kube-controller-manager", "kube-scheduler", "kwok",
              "kube-apiserver", "etcd")  # fmt: skip


# --- the run ------------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace, kubeconfig: str, pids: dict[str, int]) -> None:
        self.args = args
        self.kubeconfig = kubeconfig
        self.harness = HarnessKube(kubeconfig)
        self.kube: Kube = client(kubeconfig)
        self.pids = pids  # cluster components (when this run started the cluster)
        self.logs = Path(tempfile.mkdtemp(prefix="rtj-bench-scale-"))
        self.operator_exit: str | None = None  # why its metrics stopped answering (it exited)

    def _cpu(self, op: OperatorProcess | None) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, pid in self.pids.items():
            with contextlib.suppress(OSError):  # a component that exited
                out[name] = cpu_seconds(pid)
        if op is not None and op.proc is not None:
            with contextlib.suppress(OSError):  # an operator that exited (see `_snapshot`)
                out["operator"] = cpu_seconds(op.proc.pid)
        return out

    def _victims(self, obs: Observed, prefix: str) -> list[FaultRecord]:
        a = self.args
        out = []
        for k in range(a.faults):
            job = f"{prefix}{(k * a.jobs) // a.faults:03d}"
            rank = (k * 3) % a.workers
            pods = [
                (n, p)
                for n, p in obs.live_pods(job, 1)
                if p["index"] == str(rank) and p["phase"] == "Running"
            ]
            if not pods:
                raise RuntimeError(f"no running rank {rank} of {job}")
            name, pod = pods[0]
            out.append(FaultRecord(job=job, pod=name, rank=rank, node=pod["node"],
                                   scheduled=k * a.stagger))  # fmt: skip
        return out

    def _inject(self, ns: str, victims: list[FaultRecord]) -> None:
        start = time.monotonic() + 0.2

        def one(f: FaultRecord) -> None:
            faults.sleep_until(start + f.scheduled)
            status = faults.terminate_container(
                self.harness, ns, f.pod, exit_code=1, message=FAULT_MESSAGE
            )
            f.failed_at = time.time()
            for cs in status.get("containerStatuses") or []:
                term = (cs.get("state") or {}).get("terminated") or {}
                f.finished_at = term.get("finishedAt") or f.finished_at

        with ThreadPoolExecutor(max(len(victims), 1)) as pool:
            list(pool.map(one, victims))

    def run_phase(self, kind: str) -> Phase:
        a = self.args
        rtj = kind == "rtj"
        label = "RTJ operator" if rtj else f"JobSet RestartJobSet ({a.baseline_strategy})"
        phase = Phase(label=label, kind=kind)
        tn = testenv.create_test_namespace(
            self.harness, f"bench-scale-{kind}", a.nodes * GPUS_PER_NODE
        )
        ns = tn.name
        print(f"\n== {label}: namespace {ns}", flush=True)
        obs = Observed(rtj_generation if rtj else jobset_generation)
        api = self.harness.api
        watches = [
            RawWatch(api, f"/api/v1/namespaces/{ns}/pods", obs.on_pod,
                     keys.JOB_LABEL if rtj else keys.JOBSET_NAME_LABEL),
            RawWatch(api, f"/apis/{JOBSET_GROUP}/{JOBSET_VERSION}/namespaces/{ns}/jobsets",
                     obs.on_jobset),
        ]  # fmt: skip
        if rtj:
            path = f"/apis/{keys.GROUP}/{keys.VERSION}/namespaces/{ns}/{keys.PLURAL}"
            watches.append(RawWatch(api, path, obs.on_rtj))
        for w in watches:
            w.start()
        for w in watches:
            w.synced.wait(30)
        op: OperatorProcess | None = None
        sampler: RssSampler | None = None
        sim: SimProcess | None = None
        try:
            if rtj and a.progress == "answered":
                sim = SimProcess(self.kubeconfig, ns, SIM_PORT)
                self.pids[SIM_NAME] = sim.pid  # its CPU shares the machine: counted
            if rtj:
                flags = large_cluster.operator_flags(self.args.lease_signal, self.args.leader_lease)
                op = OperatorProcess(
                    self.kubeconfig,
                    ns,
                    self.logs,
                    lease_name=f"scale-{uuid.uuid4().hex[:6]}",
                    extra=flags,
                )
                op.start()
                assert op.proc is not None
                sampler = RssSampler(op.proc.pid)
                sampler.start()
            self._create_and_run(phase, ns, obs, op)
            self._fault_and_recover(phase, ns, obs, op, sampler, sim)
            phase.problems = (
                verify_rtjs(self.kube, a, ns, op) if rtj else verify_jobsets(self.harness, a, ns)
            )
        finally:
            if sampler is not None:
                sampler.stop()
            for w in watches:
                phase.watch_errors += w.errors
                if w.errors:
                    print(f"   note: {w.name} re-listed {w.errors}x ({w.last_error})")
                w.stop()
            if op is not None:
                op.stop()
            if sim is not None:
                sim.close()
                self.pids.pop(SIM_NAME, None)
            clean_up(self.kube, tn)
        return phase

    def _create_and_run(
        self, phase: Phase, ns: str, obs: Observed, op: OperatorProcess | None
    ) -> None:
        a = self.args
        rtj = phase.kind == "rtj"
        prefix = "s" if rtj else "b"

        def create(i: int) -> None:
            name = f"{prefix}{i:03d}"
            if rtj:
                body = worker_body(name, ns, a.workers, a.gpus_per_worker, a.progress)
                self.kube.create_rtj(ns, body)
            else:
                body = baseline_jobset(name, ns, a.workers, a.gpus_per_worker,
                                       a.baseline_strategy)  # fmt: skip
                self.harness.jobset_create(body, ns)

        t0 = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(create, range(a.jobs)))
        want = a.jobs * a.workers

        def all_running() -> bool:
            if obs.running_count() < want:
                return False
            if not rtj:
                return True
            with obs.lock:
                phases = [(o.get("status") or {}).get("phase") for o in obs.rtjs.values()]
            return len(phases) == a.jobs and all(p == "Running" for p in phases)

        deadline = time.monotonic() + 60 + 8 * a.jobs + a.jobs * a.workers // 4
        last = -1
        while not all_running():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{obs.running_count()}/{want} pods running")
            n = obs.running_count()
            if n // 100 != last // 100 and n:
                print(f"   {n}/{want} pods running after {time.monotonic() - t0:.0f}s", flush=True)
                last = n
            time.sleep(0.2)
        phase.startup_seconds = time.monotonic() - t0
        print(f"   all {want} pods of {a.jobs} groups running in {phase.startup_seconds:.1f}s",
              flush=True)  # fmt: skip

    def _fault_and_recover(
        self,
        phase: Phase,
        ns: str,
        obs: Observed,
        op: OperatorProcess | None,
        sampler: RssSampler | None,
        sim: SimProcess | None = None,
    ) -> None:
        a = self.args
        rtj = phase.kind == "rtj"
        answered0 = sim.progress_answered() if sim else 0
        time.sleep(3.0)  # let the last status patches and Events land
        # quiet window: the background request rate (node leases, controllers' leases)
        q0, qo0, qc0, tq0, _ = self._snapshot(op)
        time.sleep(QUIET_SECONDS)
        q1, qo1, qc1, tq1, r0 = self._snapshot(op)
        phase.quiet_rate = sum(delta(q1, q0).values()) / (tq1 - tq0)
        phase.operator_quiet_requests = sum(delta(qo1, qo0).values())
        phase.cpu_quiet = {k: qc1[k] - qc0[k] for k in qc1 if k in qc0}
        if sampler is not None:
            quiet = [r for t, r in sampler.samples if tq0 <= t <= tq1]
            phase.rss_steady = sum(quiet) / len(quiet) if quiet else 0.0
        victims = self._victims(obs, "s" if rtj else "b")
        phase.faults = victims
        phase.namespace_events = namespace_events(self.harness.api, ns)
        lists0 = list_seconds(apiserver_metrics(self.harness.api), "events")
        a0, o0, c0, t0 = q1, qo1, qc1, time.time()
        profiler: Profiler | None = None
        if a.profile is not None and op is not None and op.proc is not None:
            a.profile.mkdir(parents=True, exist_ok=True)
            out = a.profile / f"operator-{a.jobs}x{a.workers}-{os.getpid()}.txt"
            profiler = Profiler(op.proc.pid, out)
            time.sleep(0.5)  # attached before the first fault
        print(f"   injecting {len(victims)} faults ({a.stagger:g}s apart) ...", flush=True)
        self._inject(ns, victims)

        def done(f: FaultRecord) -> bool:
            def since(t: float | None) -> float | None:
                return t - f.failed_at if t is not None else None

            if rtj:
                f.detected = since(obs.classified_at.get((f.job, 1)))
                with obs.lock:
                    f.old_jobset_gone = since(obs.jobset_deleted_at.get(jobset_name(f.job, 1)))
                    f.next_created = since(obs.jobset_created_at.get(jobset_name(f.job, 2)))
                    f.admitted = since(obs.jobset_unsuspended_at.get(jobset_name(f.job, 2)))
            else:
                f.detected = since(obs.restarted_at.get((f.job, 1)))
            f.old_pods_deleting = since(obs.all_deleting_at(f.job, 1))
            f.old_pods_gone = since(obs.all_gone_at(f.job, 1))
            f.new_pod_seen = since(obs.first_seen_at(f.job, 2))
            f.recovered = since(obs.all_running_at(f.job, 2, a.workers))
            return f.detected is not None and f.recovered is not None

        deadline = time.monotonic() + 120 + 15 * a.faults + a.jobs * a.workers // 2
        while not all(done(f) for f in victims):
            if time.monotonic() > deadline:
                late = [f.job for f in victims if not done(f)]
                phase.problems.append(f"not recovered within the deadline: {late}")
                break
            time.sleep(0.05)
        time.sleep(SETTLE_SECONDS)
        a1, o1, c1, t1, r1 = self._snapshot(op)
        phase.window_seconds = t1 - t0
        if self.operator_exit is not None:  # e.g. it lost its leader Lease under the load
            phase.problems.append(self.operator_exit)
        if profiler is not None:
            profiler.stop()
            print(f"   operator profile of the fault window: {profiler.path}")
            if profiler.path.exists():
                for line in profile_summary(profiler.path):
                    print(f"   {line}")
        cluster = delta(a1, a0)
        phase.cluster_requests = sum(cluster.values())
        phase.cluster_top = [(f"{v} {r}", n) for (v, r), n in cluster.most_common(10)]
        mine = delta(o1, o0)
        phase.operator_lease_requests = sum(n for (_, r), n in mine.items() if r == "leases")
        phase.operator_requests = sum(mine.values()) - phase.operator_lease_requests
        phase.operator_top = [(f"{v} {r}", n) for (v, r), n in mine.most_common(10)]
        phase.operator_reconciles = r1 - r0
        phase.progress_answered = (sim.progress_answered() if sim else 0) - answered0
        lists1 = list_seconds(apiserver_metrics(self.harness.api), "events")
        phase.event_lists = lists1[1] - lists0[1]
        phase.event_list_seconds = lists1[0] - lists0[0]
        phase.cpu_window = {k: c1[k] - c0[k] for k in c1 if k in c0}
        if op is not None and op.proc is not None and self.operator_exit is None:
            phase.operator_cpu_total = cpu_seconds(op.proc.pid)
            phase.rss_peak = max(sampler.peak if sampler else 0.0, rss_mib(op.proc.pid))
        if rtj:
            with obs.lock:
                records = dict(obs.records)
            for f in victims:
                first = (records.get(f.job) or [{}])[0]
                f.failure_class = first.get("failureClass")
                f.operator_detection = first.get("detectionSeconds")
                f.operator_recovery = first.get("recoverySeconds")

    def _snapshot(
        self, op: OperatorProcess | None
    ) -> tuple[Counter[tuple[str, str]], Counter[tuple[str, str]], dict[str, float], float, int]:
        """Cluster request counts, the operator's own, CPU seconds by process, when, and the
        operator's reconciles so far."""
        cluster = apiserver_requests(self.harness.api)
        mine: Counter[tuple[str, str]] = Counter()
        reconciles = 0
        if op is not None:
            try:
                text = op.metrics()
            except OSError as exc:  # it exited: the run goes on to say so (`operator_exit`)
                self.operator_exit = f"the operator's metrics did not answer ({exc}): {op.log_path}"
            else:
                mine, reconciles = operator_requests(text), operator_reconciles(text)
        return cluster, mine, self._cpu(op), time.time(), reconciles


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__ or "")
    gpus = args.jobs * args.workers * args.gpus_per_worker
    print(f"operator scale bench: {args.jobs} groups x {args.workers} workers "
          f"({args.gpus_per_worker} GPU each, {gpus}/{args.nodes * GPUS_PER_NODE} GPUs), "
          f"{args.nodes} KWOK nodes, {args.faults} faults {args.stagger:g}s apart; "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f} ({platform.node()})")  # fmt: skip
    print("note: this machine is small and shared; every figure is noisy (compare ratios).")
    attach = os.environ.get("RTJ_E2E_KUBECONFIG")
    cluster: LocalCluster | None = None
    pids: dict[str, int] = {}
    phases: list[Phase] = []
    started = time.monotonic()
    try:
        if attach:
            kubeconfig = attach
        else:
            cluster = LocalCluster(f"rtj-bench-scale-{os.getpid()}", nodes=args.nodes,
                                   node_lease_seconds=args.lease,
                                   pods_ready_timeout=args.pods_ready_timeout,
                                   loopback_pods=args.progress == "answered")  # fmt: skip
            t = time.monotonic()
            kubeconfig = str(cluster.up())
            pids = {p.name: p.pid for p in cluster.state.procs if p.name in COMPONENTS}
            print(f"cluster {cluster.name} up in {time.monotonic() - t:.1f}s", flush=True)
        bench = Bench(args, kubeconfig, pids)
        install_crd(bench.kube)
        try:
            for kind in ("rtj", "jobset")[: 1 if args.skip_baseline else 2]:
                p = bench.run_phase(kind)
                phases.append(p)
                for line in fault_table(p):
                    print(line)
                for fig in phase_figures(p, args):
                    print(fig.line(), flush=True)
        finally:
            bench.harness.close()
            print(f"(operator logs in {bench.logs})")
    finally:
        if cluster is not None:
            problems = cluster.down(check=False)
            if problems:
                print(f"note: teardown left: {problems} (state in {cluster.dir})")
            else:
                shutil.rmtree(cluster.dir, ignore_errors=True)  # a per-run name: no reuse
    figures = [f for p in phases for f in phase_figures(p, args)]
    print(f"\nsummary ({time.monotonic() - started:.0f}s in all):")
    for f in figures:
        print(f.line())
    for p in phases:
        print(f"\n{p.label}: stages per fault, seconds after the Failed status")
        for line in fault_table(p):
            print(line)
    rows: list[tuple[str, float, float]] = []
    if len(phases) == 2:
        rows = comparison(phases[0], phases[1])
        print("\nside by side (same cluster, same groups, same faults):")
        for line in comparison_lines(rows, phases[1].label):
            print(line)
        print(f"\nrequests in the RTJ window by verb/resource: {phases[0].cluster_top}")
        print(f"requests in the JobSet window by verb/resource: {phases[1].cluster_top}")
    if phases:
        print(f"operator's own requests in the window: {phases[0].operator_top}")
    if args.json:
        out = {
            "config": vars(args) | {"json": str(args.json)},
            "figures": [asdict(f) for f in figures],
            "comparison": [{"name": n, "rtj": a, "jobset": b} for n, a, b in rows],
            "phases": [asdict(p) for p in phases],
        }
        args.json.write_text(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
