"""What one progress-poll round costs the operator at scale, side by side (issue 15): the
product's poller (`RankPolls`, a connection kept per pod across rounds, one watchdog for
every request's deadline) against the same poller asking each pod on a connection of its
own (`fetch_progress`: connect, ask, close; what every round did before), alternated round
by round (ABAB) on the same stand-ins so drift hits both.

One asyncio process stands in for `--pods` progress sidecars on 127.4.x.y:`port`, HTTP/1.1
keep-alive as the sidecar serves it (idle connections dropped after
`rtj_shim.agent.progress_server.KEEP_ALIVE_IDLE_S`), each answering
`bench.hang_ranks.pod_body` (8 ranks of the product's `rank_json`). Measured per round:
the operator process's CPU seconds (every thread: the event loop, the poller's workers,
the watchdog), the round's wall seconds, the pods answered. Figures, never assertions.

    python -m bench.poll_round [--pods 1250] [--rounds 10] [--markdown F] [--json F]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import resource
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bench.hang_ranks import Sim, pod_body
from rtj_operator.pod_http import fetch_progress
from rtj_operator.rank_polls import JobTargets, RankPolls
from rtj_operator.reconcile.world import PollTarget
from rtj_shim.agent.progress_server import KEEP_ALIVE_IDLE_S

PORT = 9477
KEY = ("bench", "poll-round")
HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
        b"Connection: keep-alive\r\n\r\n")  # fmt: skip


def address(pod: int) -> str:
    return f"127.4.{pod // 250}.{pod % 250 + 1}"


def serve(sim: Sim, port: int, conn: Any) -> None:
    """Every pod's sidecar on one port of 0.0.0.0: the address a connection arrived on says
    which pod it is for; requests on a connection until the client closes it or it is idle
    KEEP_ALIVE_IDLE_S (as `rtj_shim.agent.progress_server` serves them)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ip = writer.get_extra_info("sockname")[0]
        _, third, fourth = ip.rsplit(".", 2)
        pod = int(third) * 250 + int(fourth) - 1
        try:
            while True:
                await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), KEEP_ALIVE_IDLE_S)
                body = pod_body(sim, pod, time.monotonic_ns())
                raw = json.dumps(body, separators=(",", ":")).encode()
                writer.write(HEAD % len(raw) + raw)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "0.0.0.0", port, backlog=4096)
        conn.send(("ok", port))
        async with server:
            await server.serve_forever()

    try:
        asyncio.run(main())
    except OSError as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))


async def measure(a: argparse.Namespace, port: int) -> dict[str, Any]:
    def clock() -> datetime:
        return datetime.now(timezone.utc)

    pollers = {
        "kept": RankPolls(clock, lambda key: None, interval=1.0),
        "per exchange": RankPolls(clock, lambda key: None, interval=1.0, fetch=fetch_progress),
    }
    job = JobTargets(KEY, tuple(PollTarget(f"pod-{i}", address(i), port, 1, i)
                                for i in range(a.pods)))  # fmt: skip
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in pollers}
    for polls in pollers.values():  # a first round each: connections made, threads started
        await polls.poll_once([job])
    for n in range(2 * a.rounds):
        name = ("kept", "per exchange")[n % 2]
        polls = pollers[name]
        opened = polls.connections.opened if polls.connections is not None else None
        cpu, wall = time.process_time(), time.perf_counter()
        await polls.poll_once([job])
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        reading = polls.reading(KEY)
        answered = 0 if reading is None else len(reading.reports) - len(reading.unanswered)
        rounds[name].append({"cpu": cpu, "wall": wall, "answered": answered,
                             "opened": (polls.connections.opened - opened
                                        if polls.connections is not None and opened is not None
                                        else a.pods)})  # fmt: skip
        await asyncio.sleep(0.3)
    for polls in pollers.values():
        polls.close()
    out: dict[str, Any] = {"rounds": rounds}
    for name, rs in rounds.items():
        out[name] = {"cpu": statistics.median(r["cpu"] for r in rs),
                     "wall": statistics.median(r["wall"] for r in rs),
                     "answered_min": min(r["answered"] for r in rs),
                     "opened": statistics.median(r["opened"] for r in rs)}  # fmt: skip
    out["cpu_ratio"] = out["kept"]["cpu"] / out["per exchange"]["cpu"]
    return out


def markdown(a: argparse.Namespace, res: dict[str, Any]) -> str:
    rows = "\n".join(
        f"| {name} | {res[name]['cpu'] * 1000:.0f} | {res[name]['wall'] * 1000:.0f} | "
        f"{res[name]['answered_min']} / {a.pods} | {res[name]['opened']:.0f} |"
        for name in ("per exchange", "kept")
    )
    return (
        f"# A progress-poll round at {a.pods} pods\n\n"
        f"`python -m bench.poll_round --pods {a.pods} --rounds {a.rounds}` on "
        f"{platform.node()} ({os.cpu_count()} CPUs), "
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC. Medians of {a.rounds} rounds "
        "each, alternated; the stand-ins answer 8 ranks per pod (`pod_body`).\n\n"
        "| how each pod is asked | operator CPU ms per round | wall ms per round | "
        "pods answered (worst round) | connections opened |\n|---|---|---|---|---|\n"
        f"{rows}\n\n"
        f"Kept connections cost **{res['cpu_ratio']:.2f}x** the CPU of a connection per "
        "exchange per round. Both arms share the rest of the round: the one watchdog thread "
        "for every request's deadline (a timer thread per request before), the 16 workers "
        "that each take the next pod (a future per pod before), reading the bodies and the "
        "stragglers' window over every rank; what differs is the connection alone.\n"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pods", type=int, default=1250)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--markdown", type=Path)
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    now = time.monotonic_ns()
    sim = Sim(now - 10**9, 10**9, time.time_ns() - now)
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=serve, args=(sim, PORT, there), daemon=True)
    proc.start()
    try:
        state, detail = here.recv() if here.poll(60) else ("error", "no answer in 60 s")
        if state != "ok":
            raise SystemExit(f"the stand-in sidecars did not start: {detail}")
        res = asyncio.run(measure(a, PORT))
    finally:
        proc.terminate()
        proc.join(10)
    text = markdown(a, res)
    print(text)
    if a.markdown:
        a.markdown.write_text(text)
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
