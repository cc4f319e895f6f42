"""Probes for bench.operator_scale: raw watches that timestamp every change on receipt, the
API server's request counters, the operator's own counter, and /proc CPU and memory.

Nothing here polls the API server: the watches are one long request per kind, so the
benchmark adds almost nothing to the request counts it reports.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import urllib3
from kubernetes import client
from kubernetes.watch.watch import iter_resp_lines

Obj = dict[str, Any]
Handler = Callable[[str, Obj, float], None]
"""(event type, object, time.time() on receipt)."""

_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
CLK_TCK = os.sysconf("SC_CLK_TCK")
NOT_COUNTED_VERBS = frozenset({"WATCH", "CONNECT"})
"""apiserver_request_total counts a watch when it ends and a connect (exec) once: neither
says anything about the work of a recovery window, so neither is counted."""


# --- raw watches -------------------------------------------------------------------------


class RawWatch(threading.Thread):
    """LIST then WATCH one collection; `handler` gets every object (the listed ones as
    ADDED) with its receipt time. Re-lists after an expired resourceVersion."""

    def __init__(
        self, api_client: Any, path: str, handler: Handler, label_selector: str | None = None
    ) -> None:
        super().__init__(name=f"watch {path}", daemon=True)
        self.api = api_client
        self.path = path
        self.handler = handler
        self.selector = label_selector
        self.stopped = threading.Event()
        self.synced = threading.Event()
        self.errors = 0
        self.last_error = ""
        self._resp: Any = None

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        auth = self.api.configuration.auth_settings().get("BearerToken") or {}
        if auth.get("value"):
            headers[auth["key"]] = auth["value"]
        return headers

    def _get(self, query: dict[str, Any], stream: bool) -> Any:
        query = {k: v for k, v in query.items() if v is not None}
        if self.selector:
            query["labelSelector"] = self.selector
        url = f"{self.api.configuration.host}{self.path}?{urlencode(query)}"
        return self.api.rest_client.pool_manager.request(
            "GET",
            url,
            headers=self._headers(),
            preload_content=not stream,
            timeout=urllib3.Timeout(connect=5.0, read=120.0 if stream else 60.0),
        )

    def run(self) -> None:
        rv: str | None = None
        while not self.stopped.is_set():
            try:
                if rv is None:
                    answer = self._get({"limit": 500}, stream=False)
                    body = json.loads(answer.data or b"{}")
                    now = time.time()
                    for item in body.get("items") or []:
                        self.handler("ADDED", item, now)
                    rv = (body.get("metadata") or {}).get("resourceVersion")
                    self.synced.set()
                query = {"watch": "1", "resourceVersion": rv, "timeoutSeconds": 60,
                         "allowWatchBookmarks": "true"}  # fmt: skip
                self._resp = self._get(query, stream=True)
                try:
                    for line in iter_resp_lines(self._resp):
                        if self.stopped.is_set():
                            return
                        if not line:
                            continue
                        now = time.time()
                        event = json.loads(line)
                        kind, obj = event.get("type"), event.get("object") or {}
                        if kind == "ERROR":
                            rv = None  # 410 Gone (or worse): list again
                            break
                        rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                        if kind != "BOOKMARK":
                            self.handler(str(kind), obj, now)
                finally:
                    self._resp.release_conn()
            except Exception as exc:
                if self.stopped.is_set():
                    return
                self.errors += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                rv = None
                time.sleep(0.2)

    def stop(self) -> None:
        self.stopped.set()
        resp = self._resp
        if resp is not None:
            with contextlib.suppress(Exception):
                resp.shutdown()  # urllib3 >= 2.3: unblock the blocked read
        self.join(timeout=5)


# --- what the watches saw -----------------------------------------------------------------


class Observed:
    """Receipt times of the changes a recovery is measured by."""

    def __init__(self, generation_of: Callable[[dict[str, str]], tuple[str, int] | None]) -> None:
        self.lock = threading.Lock()
        self.generation_of = generation_of
        self.pods: dict[str, Obj] = {}
        """name -> {job, gen, index, phase, deleting, gone, node}"""
        self.running_at: dict[str, float] = {}
        self.seen_at: dict[str, float] = {}
        self.gone_at: dict[str, float] = {}
        self.deleting_at: dict[str, float] = {}
        self.failed_at: dict[str, float] = {}
        self.classified_at: dict[tuple[str, int], float] = {}
        self.records: dict[str, list[Obj]] = {}
        self.rtjs: dict[str, Obj] = {}
        self.jobset_created_at: dict[str, float] = {}
        self.jobset_deleted_at: dict[str, float] = {}
        self.jobset_suspended: set[str] = set()
        self.jobset_unsuspended_at: dict[str, float] = {}
        self.restarted_at: dict[tuple[str, int], float] = {}
        self.jobsets: dict[str, Obj] = {}

    # pods: generation 1 is the first world, 2 the first restart (RTJ attempt / JobSet
    # restart-attempt + 1)
    def on_pod(self, kind: str, obj: Obj, now: float) -> None:
        meta = obj.get("metadata") or {}
        labels = meta.get("labels") or {}
        gen = self.generation_of(labels)
        if gen is None:
            return
        name = meta.get("name", "")
        status = obj.get("status") or {}
        phase = status.get("phase")
        deleting = bool(meta.get("deletionTimestamp"))
        with self.lock:
            self.pods[name] = {
                "job": gen[0],
                "gen": gen[1],
                "index": labels.get("batch.kubernetes.io/job-completion-index"),
                "phase": phase,
                "deleting": deleting,
                "gone": kind == "DELETED",
                "node": (obj.get("spec") or {}).get("nodeName"),
            }
            self.seen_at.setdefault(name, now)
            if kind == "DELETED":
                self.gone_at.setdefault(name, now)
            if deleting or kind == "DELETED":
                self.deleting_at.setdefault(name, now)
            if phase == "Running" and not deleting and kind != "DELETED":
                self.running_at.setdefault(name, now)
            if phase == "Failed":
                self.failed_at.setdefault(name, now)

    def on_rtj(self, kind: str, obj: Obj, now: float) -> None:
        name = (obj.get("metadata") or {}).get("name", "")
        records = (obj.get("status") or {}).get("attempts") or []
        with self.lock:
            self.rtjs[name] = obj
            self.records[name] = records
            for rec in records:
                if rec.get("failureClass"):
                    self.classified_at.setdefault((name, int(rec["attempt"])), now)

    def on_jobset(self, kind: str, obj: Obj, now: float) -> None:
        name = (obj.get("metadata") or {}).get("name", "")
        restarts = int((obj.get("status") or {}).get("restarts") or 0)
        suspended = bool((obj.get("spec") or {}).get("suspend"))
        with self.lock:
            self.jobsets[name] = obj
            self.jobset_created_at.setdefault(name, now)
            if suspended:
                self.jobset_suspended.add(name)
            elif name in self.jobset_suspended:  # admitted by Kueue after being seen suspended
                self.jobset_unsuspended_at.setdefault(name, now)
            if kind == "DELETED":
                self.jobset_deleted_at.setdefault(name, now)
            for n in range(1, restarts + 1):
                self.restarted_at.setdefault((name, n), now)

    # --- questions ------------------------------------------------------------------------
    def live_pods(self, job: str, gen: int) -> list[tuple[str, Obj]]:
        with self.lock:
            return [
                (n, p)
                for n, p in self.pods.items()
                if p["job"] == job and p["gen"] == gen and not p["gone"]
            ]

    def all_running_at(self, job: str, gen: int, replicas: int) -> float | None:
        """When the last of `replicas` pods of this generation was first seen Running."""
        with self.lock:
            times = sorted(
                self.running_at[n]
                for n, p in self.pods.items()
                if p["job"] == job and p["gen"] == gen and n in self.running_at
            )
        return times[replicas - 1] if len(times) >= replicas else None

    def first_seen_at(self, job: str, gen: int) -> float | None:
        """When the first pod of this generation was seen (created)."""
        with self.lock:
            times = [
                self.seen_at[n]
                for n, p in self.pods.items()
                if p["job"] == job and p["gen"] == gen and n in self.seen_at
            ]
        return min(times) if times else None

    def all_deleting_at(self, job: str, gen: int) -> float | None:
        """When the last pod of this generation was seen being deleted (a deletionTimestamp,
        or gone), None while any is not."""
        with self.lock:
            mine = [n for n, p in self.pods.items() if p["job"] == job and p["gen"] == gen]
            if not mine or any(n not in self.deleting_at for n in mine):
                return None
            return max(self.deleting_at[n] for n in mine)

    def all_gone_at(self, job: str, gen: int) -> float | None:
        """When the last pod of this generation was deleted (None while any remains)."""
        with self.lock:
            mine = [n for n, p in self.pods.items() if p["job"] == job and p["gen"] == gen]
            if not mine or any(n not in self.gone_at for n in mine):
                return None
            return max(self.gone_at[n] for n in mine)

    def running_count(self) -> int:
        with self.lock:
            return sum(
                1
                for n, p in self.pods.items()
                if p["phase"] == "Running" and not p["deleting"] and not p["gone"]
            )


# --- request counters ---------------------------------------------------------------------


def parse_counter(text: str, metric: str) -> list[tuple[dict[str, str], float]]:
    out = []
    prefix = metric + "{"
    for line in text.splitlines():
        if not line.startswith(prefix):
            continue
        head, _, value = line.rpartition(" ")
        labels = dict(_LABEL.findall(head[len(prefix) : head.rfind("}")]))
        out.append((labels, float(value)))
    return out


def apiserver_metrics(api_client: Any) -> str:
    """The API server's own /metrics (Prometheus text)."""
    cfg = api_client.configuration
    headers = {"Accept": "text/plain"}
    auth = cfg.auth_settings().get("BearerToken") or {}
    if auth.get("value"):
        headers[auth["key"]] = auth["value"]
    answer = api_client.rest_client.pool_manager.request(
        "GET", f"{cfg.host}/metrics", headers=headers, timeout=60.0
    )
    if answer.status != 200:
        raise RuntimeError(f"GET /metrics: HTTP {answer.status}")
    return str(answer.data.decode())


def apiserver_requests(api_client: Any) -> Counter[tuple[str, str]]:
    """`apiserver_request_total` by (verb, resource[/subresource]), resource requests only,
    watches and connects left out (see NOT_COUNTED_VERBS)."""
    counts: Counter[tuple[str, str]] = Counter()
    for labels, value in parse_counter(apiserver_metrics(api_client), "apiserver_request_total"):
        verb, resource = labels.get("verb", ""), labels.get("resource", "")
        if not resource or verb in NOT_COUNTED_VERBS:
            continue
        sub = labels.get("subresource")
        counts[(verb.lower(), f"{resource}/{sub}" if sub else resource)] += int(value)
    return counts


def namespace_events(api_client: Any, namespace: str) -> int:
    """How many Events the namespace holds now (a LIST of one: the rest is counted)."""
    answer = client.CoreV1Api(api_client).list_namespaced_event(namespace, limit=1)
    return len(answer.items) + int(answer.metadata.remaining_item_count or 0)


def list_seconds(metrics_text: str, resource: str) -> tuple[float, int]:
    """Seconds the API server spent answering LISTs of `resource` so far, and how many:
    `apiserver_request_duration_seconds`' sum and count, every scope and code."""
    seconds = count = 0.0
    for name in ("_sum", "_count"):
        metric = "apiserver_request_duration_seconds" + name
        for labels, value in parse_counter(metrics_text, metric):
            if labels.get("verb") == "LIST" and labels.get("resource") == resource:
                if name == "_sum":
                    seconds += value
                else:
                    count += value
    return seconds, int(count)


def operator_requests(metrics_text: str) -> Counter[tuple[str, str]]:
    counts: Counter[tuple[str, str]] = Counter()
    for labels, value in parse_counter(metrics_text, "rtj_api_requests_total"):
        counts[(labels.get("verb", ""), labels.get("resource", ""))] += int(value)
    return counts


def operator_reconciles(metrics_text: str) -> int:
    """Reconciles the operator ran so far, whatever their result (`rtj_reconciles_total`)."""
    return int(sum(v for _, v in parse_counter(metrics_text, "rtj_reconciles_total")))


def delta(after: Counter[tuple[str, str]], before: Counter[tuple[str, str]]) -> Counter[Any]:
    out: Counter[tuple[str, str]] = Counter()
    for key in set(after) | set(before):
        d = after.get(key, 0) - before.get(key, 0)
        if d:
            out[key] = d
    return out


# --- processes -----------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """user + system CPU seconds of the process (all its threads), from /proc/<pid>/stat."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class RssSampler(threading.Thread):
    """Samples a process's resident set every `every` seconds; keeps the peak."""

    def __init__(self, pid: int, every: float = 0.25) -> None:
        super().__init__(name=f"rss {pid}", daemon=True)
        self.pid = pid
        self.every = every
        self.peak = 0.0
        self.samples: list[tuple[float, float]] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.every):
            try:
                rss = rss_mib(self.pid)
            except OSError:
                return
            self.peak = max(self.peak, rss)
            self.samples.append((time.time(), rss))

    def stop(self) -> None:
        self.stopped.set()
        self.join(timeout=2)


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


# --- profiles ------------------------------------------------------------------------------

_LINENO = re.compile(r" \(([^():]+):\d+\)$")
_PLUMBING = ("<frozen runpy>", "asyncio/", "threading.py", "concurrent/futures/",
             "rtj_operator/__main__.py", "rtj_operator/main.py")  # fmt: skip
"""Frames under (nearly) every sample: left out of the inclusive and operator tables."""


class Profiler:
    """py-spy sampling one process into a raw collapsed-stack file, only the thread that
    holds the GIL (`--gil`: the samples are where its Python CPU goes, not threads blocked
    in a read or the event loop idle in select); `stop` ends it (SIGINT: py-spy writes what
    it has)."""

    def __init__(self, pid: int, path: Path, rate: int = 200) -> None:
        exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        self.path = path
        self.proc = subprocess.Popen(
            [exe, "record", "--pid", str(pid), "--format", "raw", "--rate", str(rate),
             "--gil", "--nonblocking", "-o", str(path)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def profile_summary(path: Path, top: int = 15) -> list[str]:
    """Top frames of a raw py-spy profile: by own samples, by inclusive samples, and by the
    innermost frame of the operator's own code (where its time goes, callees included)."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    ours: Counter[str] = Counter()
    total = 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit() or not stack:
            continue
        count = int(n)
        total += count
        frames = [_LINENO.sub(r" (\1)", f) for f in stack.split(";")]
        own[frames[-1]] += count
        for f in set(frames):
            if not any(frame in f for frame in _PLUMBING):
                inclusive[f] += count
        mine = [f for f in frames if "rtj_operator/" in f and not any(p in f for p in _PLUMBING)]
        ours[mine[-1] if mine else "(no operator frame: kopf, asyncio, idle loop)"] += count
    out = [f"{total} samples"]
    tables = (("own", own), ("inclusive", inclusive), ("innermost operator frame", ours))
    for title, counter in tables:
        out.append(f"top {top} by {title}:")
        out += [f"  {100 * c / max(total, 1):5.1f}%  {f}" for f, c in counter.most_common(top)]
    return out
