"""The hang-detection bench's load generator: one asyncio process standing in for every
pod's progress sidecar, each on its own loopback address, serving the simulated ranks."""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import resource
import time
from typing import Any

from bench.hang_ranks import Freeze, Sim, address, pod_body

PORT = 9478
HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
        b"Cache-Control: no-store\r\nConnection: close\r\n\r\n")  # fmt: skip


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
