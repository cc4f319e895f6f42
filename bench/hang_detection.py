"""Hang detection at scale (issue 12, "Benchmarks"), as figures (never assertions):

1. The poller at scale: one asyncio process stands in for the progress sidecars of `--pods`
   pods of 8 ranks (1,250 = a 10k-GPU job) on 127.3.x.y:9478, serving bodies made by the
   product's `rank_json` from simulated records of a synchronous job. `RankPolls.poll_once`
   (real HTTP) reads them every `--interval` s and the operator's per-round decisions run on
   what it read; then a rank freezes mid-`forward`: freeze -> first `hang_verdict`, fixed 30 s
   allowance and automatic; last, `--silent` pods that accept and never answer. Not
   simulated: kubelets, pod networking, the network between nodes, the trainers.
2. API-server writes in steady state: the operator as a process against KWOK, one job of N
   pods Running (`--api-sizes`): its `rtj_api_requests_total` by verb over `--window` s.
3. Today's defaults: torch's collective timeouts (read from its source in this virtualenv)
   and the trainer's per-step cost (bench.progress_overhead's `per_step_cost`).

    python -m bench.hang_detection [--quick] [--markdown F] [--json F]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import importlib.util
import json
import multiprocessing as mp
import os
import platform
import re
import resource
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bench.scale_probes import cpu_seconds, delta, percentile, rss_mib
from rtj_operator.pod_http import PollFailed, fetch_progress
from rtj_operator.policy import progress as policy
from rtj_operator.policy.stragglers import stragglers
from rtj_operator.rank_polls import JobTargets, RankPolls
from rtj_operator.reconcile.ranks import progress_facts
from rtj_operator.reconcile.world import PollTarget
from rtj_shim.progress_record import Record
from rtj_shim.progress_report import rank_json

PORT = 9478
KEY = ("bench", "hang")
PHASES = (("data", 0.05), ("forward", 0.30), ("backward", 0.40), ("allreduce", 0.15),
          ("optimizer", 0.10))  # fmt: skip
"""One synchronous step: its sections and their shares of the step time."""
WAIT = 3  # the PHASES index of the collective every rank waits in
FIXED_ALLOWANCE = 30.0
AUTO = (5.0, 30.0, 600.0)  # factor, floor, start-up grace: the spec's defaults
HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
        b"Cache-Control: no-store\r\nConnection: close\r\n\r\n")  # fmt: skip
WRITES = frozenset({"create", "update", "patch", "delete", "deletecollection"})


# --- the simulated ranks (pure) -----------------------------------------------------------


@dataclass(frozen=True)
class Sim:
    t0_ns: int  # CLOCK_MONOTONIC when step `base_step` began
    step_ns: int
    wall_offset_ns: int = 0  # time.time_ns() - time.monotonic_ns()
    ranks_per_pod: int = 8
    base_step: int = 100


@dataclass(frozen=True)
class Freeze:
    rank: int
    at_ns: int


def address(pod: int) -> str:
    """The loopback address standing in for pod `pod`'s IP."""
    return f"127.3.{pod // 250}.{pod % 250 + 1}"


def pod_name(pod: int) -> str:
    return f"hang-a1-worker-0-{pod}-sim"


def _edge_ns(sim: Sim, index: int) -> int:
    return sum(int(frac * sim.step_ns) for _, frac in PHASES[:index])


def _offset_ns(rank: int) -> int:
    return (rank * 7919) % 1000 * 10_000  # ranks start their steps 0-10 ms apart


def phase_at(sim: Sim, rank: int, t_ns: int) -> tuple[int, int, int]:
    """(steps since base_step, PHASES index, when that section began) of `rank` at `t_ns`."""
    k, within = divmod(t_ns - sim.t0_ns - _offset_ns(rank), sim.step_ns)
    index = max(i for i in range(len(PHASES)) if _edge_ns(sim, i) <= within)
    return k, index, t_ns - within + _edge_ns(sim, index)


def stop_ns(sim: Sim, rank: int, freeze: Freeze | None) -> int | None:
    """When `rank` stops making progress: the frozen rank at the freeze, every other one
    when it enters the next collective (where it waits for the frozen one)."""
    if freeze is None or rank == freeze.rank:
        return None if freeze is None else freeze.at_ns
    k, index, _ = phase_at(sim, freeze.rank, freeze.at_ns)
    k += 1 if index >= WAIT else 0
    return sim.t0_ns + _offset_ns(rank) + k * sim.step_ns + _edge_ns(sim, WAIT)


def rank_record(sim: Sim, rank: int, now_ns: int, freeze: Freeze | None = None) -> Record:
    """The record `rank`'s trainer would hold at `now_ns`: a full ring of step times
    (+-1%), the allreduce as its waiting time, no checkpoint yet."""
    stop = stop_ns(sim, rank, freeze)
    k, index, since = phase_at(sim, rank, now_ns if stop is None else min(now_ns, stop))
    ring = tuple(int(sim.step_ns * (1 + ((rank * 31 + j * 17) % 21 - 10) / 1000))
                 for j in range(16))  # fmt: skip
    waits = tuple(int(s * PHASES[WAIT][1]) for s in ring)
    local, step = rank % sim.ranks_per_pod, sim.base_step + k
    return Record(
        seq=2 * (k * len(PHASES) + index) + 2, rank=rank, local_rank=local, pid=100 + local,
        restart=0, state=1, step=step, steps_completed=step,
        started_ns=max(1, sim.t0_ns - sim.base_step * sim.step_ns), section_started_ns=since,
        updated_ns=since, updated_wall_ns=since + sim.wall_offset_ns,
        step_done_ns=since - _edge_ns(sim, index), last_step_ns=ring[-1], last_wait_ns=waits[-1],
        last_checkpoint_ns=0, max_checkpoint_ns=0, checkpoints=0, section=PHASES[index][0],
        step_ns=ring, wait_ns=waits,
    )  # fmt: skip


def pod_body(sim: Sim, pod: int, now_ns: int, freeze: Freeze | None = None) -> dict[str, Any]:
    """Pod `pod`'s `GET /progress`, in the shape of the product server's `report()`."""
    ranks = range(pod * sim.ranks_per_pod, (pod + 1) * sim.ranks_per_pod)
    return {"schema": 1, "pod_wall_time": round((now_ns + sim.wall_offset_ns) / 1e9, 6),
            "hostname": pod_name(pod), "errors": [],
            "ranks": [rank_json(rank_record(sim, r, now_ns, freeze), now_ns)
                      for r in ranks]}  # fmt: skip


def freeze_point(sim: Sim, rank: int, after_ns: int) -> int:
    """The middle of `rank`'s `forward` in the first step it starts after `after_ns`."""
    k = phase_at(sim, rank, after_ns)[0] + 1
    start = sim.t0_ns + _offset_ns(rank) + k * sim.step_ns
    return start + _edge_ns(sim, 1) + int(PHASES[1][1] * sim.step_ns) // 2


def cpp_timeout(text: str, name: str) -> tuple[float, int] | None:
    """(seconds, line) of `constexpr auto <name> = std::chrono::milliseconds(a * b ...);`."""
    pattern = rf"constexpr auto {re.escape(name)} =\s*std::chrono::milliseconds\(([\d\s*]+)\);"
    found = re.search(pattern, text)
    if found is None:
        return None
    ms = 1
    for factor in found.group(1).split("*"):
        ms *= int(factor)
    return ms / 1000, text.count("\n", 0, found.start()) + 1


# --- the load generator (a process) -------------------------------------------------------


def serve(sim: Sim, pods: int, port: int, control: Any, conn: Any) -> None:
    """Every pod's `GET /progress` on its own address. `control`: [frozen rank or -1, its
    freeze time (monotonic ns), the first n pods accept and never answer]."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4 * pods + 256)), hard))

    async def handle(pod: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
            if pod < control[2]:
                await reader.read()  # silent: the poller's timeout ends it
                return
            freeze = Freeze(control[0], control[1]) if control[0] >= 0 else None
            body = pod_body(sim, pod, time.monotonic_ns(), freeze)
            raw = json.dumps(body, separators=(",", ":")).encode() + b"\n"
            writer.write(HEAD % len(raw) + raw)
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        servers = []  # kept: a server that is collected stops listening
        for pod in range(pods):
            serving = lambda r, w, pod=pod: handle(pod, r, w)  # noqa: E731
            servers.append(await asyncio.start_server(serving, address(pod), port, backlog=64))
        conn.send(("ok", port))
        await asyncio.Event().wait()

    try:
        asyncio.run(main())
    except OSError as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))


def start_generator(sim: Sim, pods: int) -> tuple[Any, Any, int]:
    """The generator process, its control array, its port (9478, else a free one)."""
    from e2e.operator_proc import free_port

    ctx = mp.get_context("spawn")
    for port in (PORT, free_port()):
        control = ctx.Array("q", [-1, 0, 0], lock=False)
        here, there = ctx.Pipe()
        proc = ctx.Process(target=serve, args=(sim, pods, port, control, there), daemon=True)
        proc.start()
        state, detail = here.recv() if here.poll(120) else ("error", "no answer in 120 s")
        if state == "ok":
            return proc, control, port
        proc.terminate()
        print(f"   load generator on port {port}: {detail}")
    raise RuntimeError("the load generator could not bind its addresses")


# --- 1. the poller at scale ---------------------------------------------------------------


def decide(reading: Any, now: float) -> tuple[dict[str, float], dict[str, Any]]:
    """What the operator computes for the job after a round (gauges, reconcile), timed; the
    verdicts with both allowances. (`stragglers` runs inside poll_once.)"""
    reports, cost = list(reading.reports), {}

    def timed(name: str, fn: Any) -> Any:
        started = time.thread_time()
        value = fn()
        cost[name] = time.thread_time() - started
        return value

    moment = datetime.fromtimestamp(now, tz=timezone.utc)
    timed("progress_facts", lambda: progress_facts(reading, moment))
    auto = timed("auto_timeout", lambda: policy.auto_timeout(reports, *AUTO, now=now))
    fixed = policy.Timeouts.fixed(FIXED_ALLOWANCE, startup=AUTO[2])
    out = {"fixed": timed("hang_verdict", lambda: policy.hang_verdict(reports, fixed, now))}
    out["auto"] = policy.hang_verdict(reports, auto, now)
    timed("job_progress", lambda: policy.job_progress(reports, now))
    return cost, out  # fmt: skip


def straggler_cost(reading: Any, sizes: tuple[int, ...] = (125, 250, 625)) -> dict[int, float]:
    """CPU seconds of one `stragglers` window (what poll_once runs per job, on the event
    loop) over the first n pods' reports, per n."""
    out: dict[int, float] = {}
    for n in [s for s in (*sizes, len(reading.reports)) if s <= len(reading.reports)]:
        started = time.thread_time()
        stragglers(reading.reports[:n], None, now=reading.polled_at)
        out[n] = time.thread_time() - started
    return out


async def poller_bench(a: argparse.Namespace) -> dict[str, Any]:
    now, step = time.monotonic_ns(), int(a.step_seconds * 1e9)
    sim = Sim(now - step, step, time.time_ns() - now)
    proc, control, port = start_generator(sim, a.pods)
    answered_at = [0.0]  # when the round's last answer (or failure) came back

    def fetch(ip: str, port: int, timeout: float, key: str | None) -> Any:  # the product's, timed
        try:
            return fetch_progress(ip, port, timeout, key)
        finally:
            answered_at[0] = max(answered_at[0], time.perf_counter())

    polls = RankPolls(lambda: datetime.now(timezone.utc), lambda key: None, interval=a.interval,
                      fetch=fetch)  # fmt: skip
    job = JobTargets(KEY, tuple(PollTarget(pod_name(i), address(i), port, 1)
                                for i in range(a.pods)))  # fmt: skip
    rounds: list[dict[str, Any]] = []  # seconds: poll_once (wall); cpu: this process in it
    res: dict[str, Any] = {"port": port, "trials": [], "false_verdicts": 0,
                           "rss_start_mib": rss_mib(os.getpid())}  # fmt: skip

    async def one(scenario: str) -> dict[str, Any]:
        c0, g0, t0 = time.process_time(), cpu_seconds(proc.pid), time.perf_counter()
        await polls.poll_once([job])
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        reading = polls.reading(KEY)
        assert reading is not None
        cost, out = decide(reading, time.time())
        out["at"] = time.time()
        rounds.append({"scenario": scenario, "seconds": seconds, "cpu": cpu, "decide": cost,
                       "fetch_s": answered_at[0] - t0,
                       "generator_cpu": cpu_seconds(proc.pid) - g0, "rss_mib": rss_mib(os.getpid()),
                       "answered": sum(r.received_at == reading.polled_at for r in reading.reports),
                       "load1": os.getloadavg()[0]})  # fmt: skip
        # RankPolls.run sleeps `interval` after a round; the product reconciles the job
        # meanwhile, so the decisions above do not lengthen the period
        await asyncio.sleep(max(0.0, a.interval - (time.perf_counter() - t0 - seconds)))
        return out  # fmt: skip

    try:
        print(f"1. poller: {a.pods} pods x 8 ranks on 127.3.x.y:{port}", flush=True)
        for _ in range(a.warm_rounds):
            res["false_verdicts"] += bool((await one("steady"))["fixed"])
        res["straggler_cost"] = straggler_cost(polls.reading(KEY))
        for n in range(a.trials):
            rank = (n * 4999 + 1234) % (a.pods * sim.ranks_per_pod)
            at = freeze_point(sim, rank, time.monotonic_ns() + int(a.interval * 1e9 * n / 3))
            trial: dict[str, Any] = {"rank": rank, "in": PHASES[phase_at(sim, rank, at)[1]][0]}
            control[1], control[0] = at, rank
            deadline = time.time() + 120 + a.step_seconds * AUTO[0]
            while len(trial) < 4 and time.time() < deadline:
                out = await one("frozen")
                for mode, hang in out.items():
                    if isinstance(hang, policy.Hang) and mode not in trial:
                        trial[mode] = {
                            "freeze_to_verdict": out["at"] - (at + sim.wall_offset_ns) / 1e9,
                            "since_last_progress": hang.seconds, "allowance": hang.timeout,
                            "culprit": hang.rank, "message": hang.message[:150],
                        }  # fmt: skip
            res["trials"].append(trial)
            print(f"   trial {n + 1}: {trial}", flush=True)
            control[0] = -1
            for _ in range(2):
                res["false_verdicts"] += bool((await one("steady"))["fixed"])
        control[2] = a.silent
        for _ in range(a.silent_rounds if a.silent else 0):
            await one("silent")
    finally:
        polls.close()
        proc.terminate()
        proc.join(10)
    return {**res, "rounds": rounds}


# --- 2. API-server writes in steady state (KWOK, the operator as a process) ----------------


def api_bench(a: argparse.Namespace) -> dict[str, Any]:
    from bench.operator_scale import COMPONENTS, Bench, rtj_generation, worker_body
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


# --- 3. today's defaults and the trainer's cost -------------------------------------------


def torch_defaults() -> dict[str, Any]:
    """The collective timeouts of the torch installed here, read from its source."""
    spec = importlib.util.find_spec("torch")
    root = Path(spec.origin).parent if spec and spec.origin else Path("/nonexistent")
    inc = "include/torch/csrc/distributed/c10d"
    rows = []
    for what, file, name in (
        ("NCCL: the watchdog aborts a collective after", "ProcessGroupNCCL.hpp",
         "kProcessGroupNCCLDefaultTimeout"),
        ("gloo (any other backend): the collective times out after", "Backend.hpp",
         "kBackendDefaultTimeout"),
    ):  # fmt: skip
        path = root / inc / file
        found = cpp_timeout(path.read_text(), name) if path.exists() else None
        if found:
            rows.append({"what": what, "name": name, "seconds": found[0],
                         "where": f"torch/{inc}/{file}:{found[1]}"})  # fmt: skip
    c10d = root / "distributed" / "distributed_c10d.py"
    text = c10d.read_text() if c10d.exists() else ""
    doc = text.find("Default value is 10 minutes for NCCL")
    return {"version": importlib.metadata.version("torch") if spec else None, "rows": rows,
            "docstring": f"torch/distributed/distributed_c10d.py:{text.count(chr(10), 0, doc) + 1}",
            "env": [p.name for p in (root / inc).glob("*.hpp")
                    if "TORCH_NCCL_TIMEOUT" in p.read_text()]}  # fmt: skip


def trainer_cost() -> float:
    """Seconds the reporting of one step costs the trainer (bench.progress_overhead)."""
    from bench.progress_overhead import per_step_cost
    from rtj_shim.progress import Progress

    with tempfile.TemporaryDirectory(prefix="rtj-hang-") as tmp:
        progress = Progress(Path(tmp), 0)
        cost: float = per_step_cost(progress, 200)
        progress.close()
    return cost


# --- figures and the report ---------------------------------------------------------------


def summarize(rounds: list[dict[str, Any]], pods: int, interval: float) -> dict[str, float]:
    """Round figures of the poller (the rounds with silent pods apart)."""
    steady = [r for r in rounds if r["scenario"] != "silent"] or rounds
    seconds, cpu = [r["seconds"] for r in steady], [r["cpu"] for r in steady]
    p50_cpu, p50_s = percentile(cpu, 0.5), percentile(seconds, 0.5)
    return {"rounds": len(steady), "round_p50_s": p50_s, "round_p99_s": percentile(seconds, 0.99),
            "fetch_p50_s": percentile([r["fetch_s"] for r in steady], 0.5),
            "cpu_p50_s": p50_cpu, "cpu_p99_s": percentile(cpu, 0.99),
            "cpu_per_pod_us": 1e6 * p50_cpu / pods,
            "core_percent": 100 * p50_cpu / (p50_s + interval),
            "decisions_p50_s": percentile([sum(r["decide"].values()) for r in steady], 0.5),
            "generator_cpu_p50_s": percentile([r["generator_cpu"] for r in steady], 0.5),
            "answered_min": min(r["answered"] for r in steady),
            "load_min": min(r["load1"] for r in rounds),
            "load_max": max(r["load1"] for r in rounds)}  # fmt: skip


def _table(head: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return out + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows] + [""]


def poller_section(a: dict[str, Any], p: dict[str, Any]) -> list[str]:
    s, rounds = p["summary"], p["rounds"]
    rss = [r["rss_mib"] for r in rounds]
    decide = ", ".join(f"`{k}` {1e3 * percentile([r['decide'][k] for r in rounds], 0.5):.0f} ms"
                       for k in rounds[0]["decide"])  # fmt: skip
    lines = [f"## 1. The poller at scale: {a['pods']} pods x 8 ranks, one job", "",
             f"`RankPolls.poll_once` (real HTTP, 16 threads, 2 s timeout), {a['interval']:g} s "
             "between rounds (`RankPolls.run` sleeps after each), against one asyncio process "
             f"serving {a['pods']} loopback addresses (127.3.x.y:{p['port']}) with the product's "
             f"`rank_json` of simulated ranks ({a['step_seconds']:g} s steps in 5 sections). "
             "Not simulated: kubelets, pod networking, the network between nodes, the trainers; "
             "the stand-in sidecars share this machine's cores with the poller.", ""]  # fmt: skip
    lines += _table(["figure", "value"], [
        ["rounds (without silent pods)", s["rounds"]],
        ["round duration p50 / p99", f"{s['round_p50_s']:.2f} s / {s['round_p99_s']:.2f} s"],
        ["of it, until the last answer (HTTP, JSON in 16 threads), p50",
         f"{s['fetch_p50_s']:.2f} s (the rest: `stragglers`, on the event loop)"],
        ["real period p50 (round + sleep)", f"{s['round_p50_s'] + a['interval']:.2f} s"],
        ["poller CPU per round p50 / p99 (fetch threads, JSON, stragglers)",
         f"{s['cpu_p50_s']:.2f} / {s['cpu_p99_s']:.2f} cpu-s"],
        ["poller CPU per pod per round; share of one core",
         f"{s['cpu_per_pod_us']:.0f} µs; {s['core_percent']:.0f}%"],
        [f"decisions after each round, p50 ({decide})", f"{1e3 * s['decisions_p50_s']:.0f} ms"],
        ["`stragglers` CPU per round (in poll_once, on the event loop) by pods", ", ".join(
            f"{n}: {v:.3f} s" for n, v in p["straggler_cost"].items())],
        ["the load generator's CPU per round (not the operator's)",
         f"{s['generator_cpu_p50_s']:.2f} cpu-s"],
        ["pods answered per round (min)", f"{s['answered_min']} of {a['pods']}"],
        ["RSS before round 1 / after it / max / at the end", f"{p['rss_start_mib']:.0f} / "
         f"{rss[0]:.0f} / {max(rss):.0f} / {rss[-1]:.0f} MiB ({len(rss)} rounds)"],
        ["verdicts while no rank was frozen", p["false_verdicts"]],
        ["load average (1 min) during the rounds", f"{s['load_min']:.1f} to {s['load_max']:.1f}"],
    ])  # fmt: skip
    lines += ["Freeze to the first `hang_verdict` (a rank stops mid-`forward`, the others block "
              "in the next `allreduce`); expected: the allowance, less the time the rank was "
              "already in `forward`, plus up to one period and one round:", ""]  # fmt: skip
    rows = [[i, f"{t['rank']} ({t['in']})", f"{m} {v['allowance']:.0f} s",
             f"**{v['freeze_to_verdict']:.1f} s**", f"{v['since_last_progress']:.1f} s",
             f"{v['culprit']} ({'right' if v['culprit'] == t['rank'] else 'WRONG'})", v["message"]]
            for i, t in enumerate(p["trials"], 1)
            for m, v in t.items() if m in ("fixed", "auto")]  # fmt: skip
    lines += _table(["trial", "frozen rank", "allowance", "freeze -> verdict",
                     "last progress -> verdict", "culprit", "message"], rows)  # fmt: skip
    silent = [f"{r['seconds']:.1f} s" for r in rounds if r["scenario"] == "silent"]
    return lines + [f"With {a['silent']} pods that accept and never answer (a stalled sidecar, "
                    "or packets dropped: the 2 s timeout, then per-pod backoff), the rounds "
                    f"took, in order: {', '.join(silent)}.", ""] * bool(silent)  # fmt: skip


def api_section(a: dict[str, Any], api: dict[str, Any]) -> list[str]:
    lines = [f"## 2. API-server writes in steady state (KWOK, {api.get('nodes')} nodes)", "",
             "The operator as a process (bench.operator_scale's machinery), one job of N pods "
             "(8 GPUs each, one per node) Running; its `rtj_api_requests_total` over "
             f"{a['window']:g} s after {a['settle']:g} s of settling.", ""]  # fmt: skip
    rows = [[n, v.get("skipped", "failed")] + [""] * 7 if "writes" not in v else
            [n, f"**{v['writes']:.3f}**", f"{v['lease_writes']:.2f}", f"{v['reads']:.2f}",
             f"{v['cluster']:.1f}", f"{v['cpu'].get('operator', 0):.1f}%",
             f"{v['cpu'].get('kube-apiserver', 0):.1f}%", f"{v['rss_mib']:.0f} MiB",
             f"{v['load1']:.1f}"] for n, v in api["sizes"].items()]  # fmt: skip
    lines += _table(["N pods", "operator writes/s (create, update, patch, delete)",
                     "its lease writes/s", "its reads/s", "all clients' requests/s",
                     "operator CPU", "API server CPU", "operator RSS", "load"], rows)  # fmt: skip
    lines += [f"- N={n}: Running {v['startup_s']:.0f} s after creation; a poll of a pod IP got "
              f"{v['probe']}; the operator's requests: {v['requests']}"
              for n, v in api["sizes"].items() if "probe" in v]  # fmt: skip
    if any("404" in v.get("probe", "") for v in api["sizes"].values()):
        lines.append("- This sandbox answers TCP to any outside address (HTTP 404 at once), so "
                     "each unanswered poll is cheap here; where a pod IP drops packets, each "
                     "costs the 2 s timeout (the silent-pods rounds of section 1).")  # fmt: skip
    lines += [f"- N={n} skipped, its operator logged: {v.get('log')}"
              for n, v in api["sizes"].items() if "skipped" in v]  # fmt: skip
    return lines + [f"- {note}" for note in api.get("notes", [])] + [
        "- N is small because each pod needs a KWOK node of its own (required anti-affinity): "
        "on the 2-core development machine 250, 500 and 1,250 did not reach a steady state "
        "(KWOK's node Lease renewals lapsed in the start-up burst; the operator judged those "
        "nodes lost, or at 1,250 a partition, and Kueue's PodsReadyTimeout restarted the "
        "group). Try `--api-sizes 125,1250` on a larger machine.", ""]  # fmt: skip


def markdown(r: dict[str, Any]) -> str:
    a, p, d = r["args"], r.get("poller"), r["defaults"]
    lines = ["# Hang detection at scale (issue 12)", "",
             f"Generated by `python -m bench.hang_detection` on {r['machine']}, {r['started']}; "
             f"load average (1 min) {r['load_start']:.1f} at the start, {r['load_end']:.1f} at "
             "the end. The machine is shared: durations and CPU are noisy and pessimistic.",
             ""]  # fmt: skip
    lines += poller_section(a, p) if p else []
    lines += api_section(a, r["api"]) if r.get("api") else []
    rows = [[f"{x['what']} (`{x['name']}`)", f"{x['seconds']:.0f}", f"`{x['where']}`"]
            for x in d["rows"]]  # fmt: skip
    nccl = d["rows"][0]["seconds"] if d["rows"] else float("nan")
    for mode in ("fixed", "auto"):
        got = [t[mode]["freeze_to_verdict"] for t in (p or {}).get("trials", []) if mode in t]
        if got:
            ours = f"ours, {mode} allowance: freeze -> Hang verdict (max measured)"
            rows.append([ours, f"{max(got):.1f}", f"section 1: {nccl / max(got):.0f}x sooner"])
    lines += [f"## 3. Side by side with today's defaults (torch {d['version']} in .venv)", ""]
    lines += _table(["what the job waits before a hang ends", "seconds", "source"], rows)
    cost = r["trainer_cost_s"]
    return "\n".join([*lines,
        f"`init_process_group(timeout=None)` documents 10 min for NCCL and 30 min otherwise "
        f"(`{d['docstring']}`); no c10d header of this torch names `TORCH_NCCL_TIMEOUT` "
        f"({d['env'] or 'none'}): the timeout is that argument. After either, the job is torn "
        "down and restarted; many large jobs raise NCCL's to 30 min or more.", "",
        f"Trainer cost of reporting: {1e6 * cost:.1f} µs per step (9 record updates) = "
        f"{100 * cost / 0.05:.3f}% of a 50 ms step (bench.progress_overhead's `per_step_cost`, "
        "re-run here for 0.1 s; docs/progress.md: 22-51 µs = 0.04-0.10% at load 3.4-4.3).",
        ""])  # fmt: skip


OPTIONS: tuple[tuple[str, Any, Any, str], ...] = (
    ("--pods", int, 1250, "simulated pods (8 ranks each)"),
    ("--step-seconds", float, 10.0, "the simulated job's step time"),
    ("--interval", float, 5.0, "the poll period (the product's default)"),
    ("--warm-rounds", int, 6, "rounds before the first freeze"),
    ("--trials", int, 2, "freezes (each gives both allowances)"),
    ("--silent", int, 125, "pods that accept and never answer (0: none)"),
    ("--silent-rounds", int, 4, "rounds with them"),
    ("--api-sizes", lambda v: [int(x) for x in v.split(",")], [32, 125], "N pods, a,b,..."),
    ("--window", float, 60.0, "steady-state window (s)"),
    ("--settle", float, 15.0, "seconds after Running before the window"),
    ("--startup-budget", float, 300.0, "seconds for N pods to be Running, else N is skipped"),
)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.hang_detection", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    for flag, kind, default, text in OPTIONS:
        ap.add_argument(flag, type=kind, default=default, help=f"{text} ({default})")
    for flag in ("--skip-poller", "--skip-api", "--quick"):
        ap.add_argument(flag, action="store_true")
    ap.add_argument("--markdown", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    if a.quick:
        a.warm_rounds, a.trials, a.silent_rounds, a.api_sizes, a.window = 3, 1, 2, [125], 30.0
    r: dict[str, Any] = {
        "args": {k: v for k, v in vars(a).items() if not isinstance(v, Path)},
        "machine": f"{platform.node()} ({os.cpu_count()} CPUs, {platform.python_version()})",
        "started": time.strftime("%Y-%m-%d %H:%M %Z"), "load_start": os.getloadavg()[0],
        "defaults": torch_defaults(), "trainer_cost_s": trainer_cost(),
    }  # fmt: skip
    print(f"hang detection bench: {r['machine']}, load {r['load_start']:.2f}", flush=True)
    if not a.skip_poller:
        r["poller"] = asyncio.run(poller_bench(a))
        r["poller"]["summary"] = summarize(r["poller"]["rounds"], a.pods, a.interval)
    if not a.skip_api:
        try:
            r["api"] = api_bench(a)
        except Exception as exc:  # the other figures still count
            r["api"] = {"sizes": {}, "notes": [f"failed: {type(exc).__name__}: {exc}"]}
    r["load_end"] = os.getloadavg()[0]
    text = markdown(r)
    print(text)
    if a.markdown:
        a.markdown.write_text(text)
    if a.json:
        a.json.write_text(json.dumps(r, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
