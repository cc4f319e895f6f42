"""Stand-ins for the progress sidecar and `rtj-shim supervise` of every pod KWOK "runs" (it
starts no container): one process answers every pod's address on one port, as each pod's
sidecar would, so the operator's in-place restart runs at KWOK scale against the product's
own order checks and supervisor decisions.

- Pods get loopback addresses (`LocalCluster(loopback_pods=True)`: each node's podCIDR is a
  127.x.y.0/24), so one server bound to 0.0.0.0 receives every pod's connections; the
  address a connection arrived on says which pod it is for.
- The pods come from a watch of the namespace (`scale_probes.RawWatch`): the address, the
  job's control key and uid from the sidecar's environment (as the real sidecar reads them),
  a spare (``RTJ_SPARE=1``) or a replacement (`job-index-failure-count` > 0) held.
- ``POST /control``: `rtj_shim.wire.control.accept` (signature, job, not older than the last),
  403 with the reason, like the sidecar; else at once (the sidecar rings the supervisor's
  doorbell, `rtj_shim.agent.doorbell`) `rtj_shim.agent.supervisor.next_action` on the pod's state:
  stop, start (with the rank an order gives), finish, with nothing to wait for (a trainer
  that stops and starts in no time: what is measured is the control plane), and 202 with
  the pod's report after it, as the sidecar answers once its supervisor took the order. A
  real stop answers ``stopping`` (the trainer's processes take their time to end) and is
  read back in a later round; here it answers ``stopped``.
- ``GET /progress``: the sidecar's body and the supervisor's report, the fields
  `rtj_shim.agent.supervisor` writes; while the pod's command runs, one rank (its
  completion index, or the rank its last order gave) training a step every
  `STEP_SECONDS`, its entry written by the sidecar's own `progress_report.rank_json`. For
  a pod rendered with ``RTJ_SIGNED_READS=1`` only when signed with its job's key
  (`rtj_shim.fast.peer_replica.check_request`, as the sidecar checks it), else 403. A pod
  rendered with ``RTJ_SEALED_ANSWERS=1`` seals its answers to a read or an order carrying
  a nonce with its name and attempt (`rtj_shim.wire.answer_seal`), as the sidecar does.
- Commands from the bench over a pipe: ``("exit", pod, code)`` (the pod's command exits),
  ``("stats",)`` (requests served, orders taken, and when the last pod started each
  generation).

Not simulated: a trainer's own stop and start (the pod runner's `bench.in_place` measures
those with real training), the kubelet, and the network between nodes.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import multiprocessing
import resource
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from bench.scale_probes import RawWatch
from e2e.cluster.kube import Kube as HarnessKube
from rtj_operator.api import keys
from rtj_shim.agent.progress_report import rank_json
from rtj_shim.agent.progress_server import KEEP_ALIVE_IDLE_S
from rtj_shim.agent.supervisor import Supervised, next_action
from rtj_shim.fast import peer_replica
from rtj_shim.wire import answer_seal, control
from rtj_shim.wire.progress_record import STATE_RUNNING, Record
from rtj_shim.wire.supervisor_report import SupervisorReport, SupervisorState

HEAD = (
    b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
    b"Connection: %s\r\n%s\r\n"
)
REASONS = {200: b"OK", 202: b"Accepted", 403: b"Forbidden", 404: b"Not Found", 413: b"Too Large"}
MAX_ORDER = 4096
STEP_SECONDS = 2.0
"""A simulated trainer's step time (a large model's is seconds): what its rank reports."""
RING = 8
NS = 1_000_000_000


@dataclass
class SimPod:
    """One pod's sidecar and supervisor."""

    name: str
    uid: str
    key: str
    job_uid: str
    current: Supervised
    spare: bool = False
    signed_reads: bool = False
    rank: int | None = None
    last: control.Order | None = None
    answerer: answer_seal.Answerer | None = None
    updated: float = field(default_factory=time.time)
    index: int | None = None
    """The pod's completion index: its rank until an order gives it another."""

    def rank_entry(self, now: float) -> dict[str, Any] | None:
        """Its rank's entry while its command runs: started when it last went running,
        a step done every STEP_SECONDS, in ``forward`` since the last."""
        rank = self.rank if self.rank is not None else self.index
        if self.current.state != SupervisorState.RUNNING or rank is None:
            return None
        steps = int(max(0.0, now - self.updated) / STEP_SECONDS)
        step_ns, started = int(STEP_SECONDS * NS), int(self.updated * NS)
        done = started + steps * step_ns
        record = Record(
            seq=2 * steps + 1, rank=rank, local_rank=0, pid=1, restart=0, state=STATE_RUNNING,
            step=steps - 1 if steps else None, steps_completed=steps, started_ns=started,
            section_started_ns=done, updated_ns=done, updated_wall_ns=done,
            step_done_ns=done if steps else 0, last_step_ns=step_ns if steps else 0,
            last_wait_ns=0, last_checkpoint_ns=0, max_checkpoint_ns=0, checkpoints=0,
            section="forward" if steps else "start", step_ns=(step_ns,) * min(steps, RING),
            wait_ns=(0,) * min(steps, RING),
        )  # fmt: skip
        return rank_json(record, int(now * NS))

    def report(self) -> dict[str, Any]:
        self.settle()
        s = self.current
        state = SupervisorState(s.state)
        return SupervisorReport(
            s.generation, state, s.attempt, s.exit_code, fast_steps=(), spare=self.spare,
            rank=self.rank, pid=1 if state is SupervisorState.RUNNING else None,
            updated_wall_time=round(self.updated, 6),
        ).encode()  # fmt: skip

    def progress(self) -> dict[str, Any]:
        now = time.time()
        entry = self.rank_entry(now)
        return {"schema": 1, "pod_wall_time": now, "hostname": self.name,
                "ranks": [entry] if entry is not None else [], "errors": [],
                "supervisor": self.report()}  # fmt: skip

    def take(self, raw: bytes, signature: str | None) -> control.Order:
        """The sidecar's check (raises control.OrderError), then the supervisor's step on
        it (`settle`): the doorbell wakes it at once."""
        order = control.accept(raw, signature, key=self.key, job_uid=self.job_uid, last=self.last)
        if order != self.last:
            self.last = order
        self.settle()
        return order

    def settle(self) -> str:
        """The supervisor's step on the last accepted order (again until it has none to
        take: a stop, then the start a run order asks for)."""
        if self.last is None:
            return "wait"
        order = self.last
        action = next_action(self.current, order)
        if action == "stop":
            self._set(
                replace(self.current, generation=order.generation, state=SupervisorState.STOPPED)
            )
        elif action == "start":
            if order.rank is not None:
                self.rank = order.rank
            self._set(replace(self.current, state=SupervisorState.RUNNING, attempt=order.attempt,
                              exit_code=None))  # fmt: skip
        elif action == "finish":
            self._set(replace(self.current, state=SupervisorState.FINISHED, exit_code=0))
        if action in ("stop", "start") and next_action(self.current, order) != "wait":
            return self.settle()  # a run order to a pod not yet stopped for it: stop, start
        return action

    def exit(self, code: int) -> None:
        self._set(replace(self.current, state=SupervisorState.EXITED, exit_code=code))

    def _set(self, state: Supervised) -> None:
        self.current, self.updated = state, time.time()


SecretValue = Callable[[str, str, str], str]
"""(namespace, Secret name, key) -> the value, as the kubelet resolves a `secretKeyRef`."""


def _env(container: dict[str, Any], namespace: str, secret: SecretValue | None
         ) -> dict[str, str]:  # fmt: skip
    out = {}
    for e in container.get("env") or []:
        if "name" not in e:
            continue
        ref = (e.get("valueFrom") or {}).get("secretKeyRef")
        if ref and secret is not None:  # the job's key, from its key Secret
            out[e["name"]] = secret(namespace, ref["name"], ref["key"])
        else:
            out[e["name"]] = e.get("value", "")
    return out


def sim_pod(body: dict[str, Any], secret: SecretValue | None = None
            ) -> tuple[str, SimPod] | None:  # fmt: skip
    """(pod IP, its stand-in) for a running pod rendered with the supervisor; None before it
    has an address, or for a pod without one. `secret` resolves the env's Secret refs."""
    meta, spec, status = body.get("metadata") or {}, body.get("spec") or {}, body.get("status")
    ip = (status or {}).get("podIP")
    if not ip or meta.get("deletionTimestamp"):
        return None
    sidecar = next((c for c in spec.get("initContainers") or []
                    if c.get("name") == keys.PROGRESS_SIDECAR), None)  # fmt: skip
    trainer = (spec.get("containers") or [{}])[0]
    if sidecar is None:
        return None
    namespace = meta.get("namespace", "")
    env, trainer_env = _env(sidecar, namespace, secret), _env(trainer, namespace, None)
    spare = trainer_env.get(keys.ENV_SPARE) == "1"
    failures = (meta.get("annotations") or {}).get(keys.JOB_INDEX_FAILURE_COUNT, "0")
    held = spare or (failures.isdigit() and int(failures) > 0)
    attempt = (meta.get("labels") or {}).get(keys.ATTEMPT_LABEL, "")
    state = Supervised(0, SupervisorState.STOPPED if held else SupervisorState.RUNNING,
                       int(attempt) if attempt.isdigit() else None)  # fmt: skip
    sealed = env.get(keys.ENV_SEALED_ANSWERS) == "1"
    answerer = answer_seal.Answerer(meta["name"], attempt) if sealed else None
    index = (meta.get("annotations") or {}).get(keys.JOB_COMPLETION_INDEX, "")
    return ip, SimPod(meta["name"], meta["uid"], env.get(keys.ENV_CONTROL_KEY, ""),
                      env.get(keys.ENV_JOB_UID, ""), state, spare,
                      env.get(keys.ENV_SIGNED_READS) == "1", answerer=answerer,
                      index=None if spare or not index.isdigit() else int(index))  # fmt: skip


class Sidecars:
    """Every pod's stand-in, by address (kept by the watch thread, read by the server)."""

    def __init__(self, secret: SecretValue | None = None) -> None:
        self.secret = secret
        self.by_ip: dict[str, SimPod] = {}
        self.lock = threading.Lock()
        self.served: Counter[str] = Counter()
        self.started: dict[int, float] = {}  # generation -> when the last pod started it

    def on_pod(self, kind: str, body: dict[str, Any], _at: float) -> None:
        found = sim_pod(body, self.secret)
        uid = (body.get("metadata") or {}).get("uid")
        with self.lock:
            if kind == "DELETED" or found is None:
                for ip in [ip for ip, p in self.by_ip.items() if p.uid == uid]:
                    del self.by_ip[ip]
                return
            ip, pod = found
            held = self.by_ip.get(ip)
            if held is None or held.uid != pod.uid:  # a new pod (an address can be reused)
                self.by_ip[ip] = pod

    def answer(self, ip: str, method: str, path: str, raw: bytes, signature: str | None,
               when: str | None = None) -> tuple[int, dict[str, Any]]:  # fmt: skip
        """`when`: the request's ``X-RTJ-Time`` (a signed read's)."""
        with self.lock:
            pod = self.by_ip.get(ip)
            if pod is None:
                return 404, {"error": f"no pod at {ip}"}
            if method == "GET" and path == "/progress":
                refused = pod.signed_reads and peer_replica.check_request(
                    pod.key, method, path, when, signature, time.time()
                )
                if refused:
                    self.served["refused read"] += 1
                    return 403, {"error": refused}
                self.served["progress"] += 1
                return 200, self._progress(pod)
            if method == "POST" and path == "/control":
                try:
                    order = pod.take(raw, signature)
                except control.OrderError as exc:
                    self.served["refused"] += 1
                    return 403, {"error": str(exc)}
                self.served[f"order {order.action}"] += 1
                return 202, {"accepted": order.to_json(), "report": self._progress(pod)}
            return 404, {"error": f"{method} {path}"}

    def seal(self, ip: str, code: int, nonce: str | None, data: bytes) -> bytes:
        """The seal header line of an answer (b"": none), as the pod's sidecar seals it."""
        with self.lock:
            pod = self.by_ip.get(ip)
        if pod is None or pod.answerer is None or code not in (200, 202):
            return b""
        if not answer_seal.valid_nonce(nonce):
            return b""
        assert nonce is not None
        sealed = answer_seal.seal(pod.key, nonce, pod.answerer, data)
        return f"{answer_seal.SEAL_HEADER}: {sealed}\r\n".encode()

    def _progress(self, pod: SimPod) -> dict[str, Any]:
        body = pod.progress()
        s = pod.current
        if s.state == "running" and s.generation > 0:
            self.started[s.generation] = max(self.started.get(s.generation, 0.0), pod.updated)
        return body

    def exit(self, name: str, code: int) -> float | None:
        with self.lock:
            pod = next((p for p in self.by_ip.values() if p.name == name), None)
            if pod is None:
                return None
            pod.exit(code)
            return pod.updated

    def stats(self) -> dict[str, Any]:
        with self.lock:
            states = Counter(f"{p.current.generation} {p.current.state}"
                             for p in self.by_ip.values())  # fmt: skip
            return {"served": dict(self.served), "started": dict(self.started),
                    "pods": len(self.by_ip), "states": dict(states)}  # fmt: skip


async def _handle(sidecars: Sidecars, reader: asyncio.StreamReader,
                  writer: asyncio.StreamWriter) -> None:  # fmt: skip
    """One connection: requests until the client closes it or is idle KEEP_ALIVE_IDLE_S
    (HTTP/1.1 keep-alive, as the sidecar serves it); a body too large to read ends it."""
    try:
        while True:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), KEEP_ALIVE_IDLE_S)
            except asyncio.IncompleteReadError:
                return  # the client closed it
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            fields = (line.partition(":") for line in lines[1:] if line)
            headers = {k.strip().lower(): v.strip() for k, _, v in fields}
            length = int(headers.get("content-length") or 0)
            if not 0 <= length <= MAX_ORDER:
                data = json.dumps({"error": f"Content-Length {length}"}).encode()
                writer.write(HEAD % (413, REASONS[413], len(data), b"close", b"") + data)
                await writer.drain()
                return
            raw = await asyncio.wait_for(reader.readexactly(length), 5.0) if length else b""
            ip = writer.get_extra_info("sockname")[0]
            signature = headers.get(control.SIGNATURE_HEADER.lower())
            when = headers.get(peer_replica.TIME_HEADER.lower())
            code, body = sidecars.answer(ip, method, path, raw, signature, when)
            data = json.dumps(body, separators=(",", ":")).encode()
            sealed = sidecars.seal(ip, code, headers.get(answer_seal.NONCE_HEADER.lower()), data)
            writer.write(HEAD % (code, REASONS.get(code, b"?"), len(data), b"keep-alive", sealed)
                         + data)  # fmt: skip
            await writer.drain()
    except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.TimeoutError,
            asyncio.LimitOverrunError):  # fmt: skip
        pass
    finally:
        writer.close()


def serve(kubeconfig: str, namespace: str, port: int, conn: Any) -> None:
    """The simulator's process: the pod watch, the server on 0.0.0.0:`port`, and the
    bench's commands on `conn` (a multiprocessing pipe end)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))
    harness = HarnessKube(kubeconfig)

    def secret(namespace: str, name: str, key: str) -> str:
        data = harness.core.read_namespaced_secret(name, namespace).data or {}
        return base64.b64decode(data.get(key, "")).decode()

    sidecars = Sidecars(secret)
    watch = RawWatch(harness.api, f"/api/v1/namespaces/{namespace}/pods", sidecars.on_pod,
                     keys.JOB_LABEL)  # fmt: skip
    watch.start()
    watch.synced.wait(60)

    async def main() -> None:
        server = await asyncio.start_server(
            lambda r, w: _handle(sidecars, r, w), "0.0.0.0", port, backlog=4096
        )
        conn.send(("ok", port))
        loop = asyncio.get_running_loop()
        async with server:
            while True:
                command = await loop.run_in_executor(None, conn.recv)
                if command[0] == "exit":
                    conn.send(("exited", sidecars.exit(command[1], command[2])))
                elif command[0] == "stats":
                    conn.send(("stats", sidecars.stats()))
                elif command[0] == "stop":
                    conn.send(("stopped", None))
                    return

    try:
        asyncio.run(main())
    except OSError as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        watch.stop()
        harness.close()


class SimProcess:
    """The stand-in sidecars of namespace `ns` on `port` (`serve`, in a process of their own)
    and its command pipe."""

    def __init__(self, kubeconfig: str, ns: str, port: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=serve, args=(kubeconfig, ns, port, child),
                                daemon=True)  # fmt: skip
        self.proc.start()
        if not self.conn.poll(90):
            raise RuntimeError("the stand-in sidecars did not start")
        answer = self.conn.recv()
        if answer[0] != "ok":
            raise RuntimeError(f"the stand-in sidecars: {answer}")

    @property
    def pid(self) -> int:
        """The process's id (its CPU is the bench's to count)."""
        assert self.proc.pid is not None, "started in __init__"
        return self.proc.pid

    def ask(self, *command: Any) -> Any:
        self.conn.send(command)
        if not self.conn.poll(30):
            raise RuntimeError(f"the stand-in sidecars did not answer {command}")
        return self.conn.recv()[1]

    def progress_answered(self) -> int:
        """Progress reads answered so far."""
        return int(self.ask("stats")["served"].get("progress", 0))

    def close(self) -> None:
        if self.proc.is_alive():
            with contextlib.suppress(OSError, RuntimeError, EOFError):
                self.ask("stop")
            self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
