"""Section 1 of the hang-detection bench: the product's poller at scale against the stand-in
sidecars, the operator's per-round decisions timed, then a rank frozen mid-`forward` until
the first hang verdict (fixed allowance and automatic), last pods that never answer."""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from datetime import datetime, timezone
from typing import Any

from bench.hang_ranks import PHASES, Sim, address, freeze_point, phase_at, pod_name
from bench.hang_sidecars import start_generator
from bench.scale_probes import cpu_seconds, rss_mib
from rtj_operator.pod_http import fetch_progress
from rtj_operator.policy import progress as policy
from rtj_operator.policy.stragglers import stragglers
from rtj_operator.rank_polls import JobTargets, RankPolls
from rtj_operator.reconcile.ranks import progress_facts
from rtj_operator.reconcile.world import PollTarget

KEY = ("bench", "hang")
FIXED_ALLOWANCE = 30.0
AUTO = (5.0, 30.0, 600.0)  # factor, floor, start-up grace: the spec's defaults


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
