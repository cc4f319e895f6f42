"""Helpers the fault drills share: what a user can see, recorded precisely, and the few
things the harness's fault helpers do not say yet (an init container's exit, an endpoint
that goes down).

Imported by the scenario tests as ``scenario_support`` (pytest puts this folder on
``sys.path``; like the unit tests' support modules, it has a name no other module uses).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import watch
from kubernetes.client.rest import ApiException

from e2e.cluster import faults
from e2e.cluster.kube import JOBSET_GROUP, JOBSET_VERSION, KUEUE_GROUP, KUEUE_VERSION
from e2e.cluster.kube import Kube as HarnessKube
from e2e.operator_proc import (
    events_of,
    harness_broken,
    rtj_body,
    rtj_status,
    running_pods,
    wait_for,
)
from rtj_operator.api import keys
from rtj_operator.kube import Kube

Obj = dict[str, Any]

WAIT = 90.0
"""Generous waits: the machine is shared, so a slow moment must not fail a drill."""

NCCL_TIMEOUT = (
    "[rank{rank}]:[E ProcessGroupNCCL.cpp:616] [Rank {rank}] Watchdog caught collective "
    "operation timeout: WorkNCCL(SeqNum=4242, OpType=ALLREDUCE, NumelIn=1048576, "
    "Timeout(ms)=600000) ran for 600042 milliseconds before timing out.\n"
    "torch.distributed.DistBackendError: NCCL communicator was aborted on rank {rank}."
)
"""What the healthy ranks of a broken world print before they die."""


# --- reading what a user sees ------------------------------------------------------------


def condition(status: Obj, type_: str) -> Obj | None:
    return next((c for c in status.get("conditions") or [] if c.get("type") == type_), None)


def condition_true(status: Obj, type_: str) -> Obj | None:
    found = condition(status, type_)
    return found if found is not None and found.get("status") == "True" else None


def taints(kube: Kube, node: str) -> list[Obj]:
    return list((kube.get_node(node).get("spec") or {}).get("taints") or [])


def quarantine_taint(job: str) -> Obj:
    return {"key": keys.DEFAULT_TAINT_KEY, "value": job, "effect": "NoSchedule"}


def rank_of(pod: Obj) -> int:
    return int(pod["metadata"]["labels"][keys.JOB_COMPLETION_INDEX])


def by_rank(pods: list[Obj]) -> dict[int, Obj]:
    return {rank_of(p): p for p in pods}


def resume_init(pod: Obj) -> Obj:
    """The operator's resume init container in a pod."""
    return next(c for c in pod["spec"]["initContainers"] if c["name"] == keys.RESUME_INIT_CONTAINER)


def pinned_step(pod: Obj) -> int | None:
    """The step the init container is told to verify (``--step N``), None: not pinned."""
    command = resume_init(pod)["command"]
    return int(command[command.index("--step") + 1]) if "--step" in command else None


def start_job(
    kube: Kube, ns: str, name: str, uri: str, *, replicas: int = 2, **spec: Any
) -> list[Obj]:
    """Create the job and return attempt 1's pods once they run and the job says Running."""
    kube.create_rtj(ns, rtj_body(name, ns, uri, replicas=replicas, **spec))
    pods = wait_for(
        "attempt 1's pods to run",
        lambda: running_pods(kube, ns, name, 1, replicas),
        WAIT,
        impossible=lambda: harness_broken(kube),
    )
    wait_for("phase Running", lambda: rtj_status(kube, ns, name).get("phase") == "Running", WAIT)
    return pods


def wait_running(kube: Kube, ns: str, name: str, attempt: int, replicas: int) -> list[Obj]:
    pods = wait_for(
        f"attempt {attempt}'s pods to run",
        lambda: running_pods(kube, ns, name, attempt, replicas),
        WAIT,
        impossible=lambda: harness_broken(kube),
    )
    wait_for(
        f"attempt {attempt} Running",
        lambda: (
            (s := rtj_status(kube, ns, name)).get("phase") == "Running"
            and s.get("attempt") == attempt
        ),
        WAIT,
    )
    return pods


def wait_events(kube: Kube, ns: str, name: str, *reasons: str, count: int = 1) -> list[str]:
    """The reasons of the job's Events once each of `reasons` was posted at least `count`
    times. Events go out after the status patch of the decision they tell (in the
    background), so a test that saw the status must wait for them, not read them at once."""

    def posted() -> list[str] | None:
        seen = [e["reason"] for e in events_of(kube, ns, name)]
        return seen if all(seen.count(r) >= count for r in reasons) else None

    return wait_for(f"Events {', '.join(reasons)}", posted, WAIT)


def wait_phase(kube: Kube, ns: str, name: str, phase: str, timeout: float = WAIT) -> Obj:
    return wait_for(
        f"phase {phase}",
        lambda: s if (s := rtj_status(kube, ns, name)).get("phase") == phase else None,
        timeout,
    )


def failed_record(kube: Kube, ns: str, name: str, attempt: int) -> Obj:
    """Attempt ``attempt``'s record once the operator has classified its failure."""

    def classified() -> Obj | None:
        records = rtj_status(kube, ns, name).get("attempts") or []
        found = [r for r in records if r.get("attempt") == attempt and r.get("failureClass")]
        return found[0] if found else None

    return wait_for(f"attempt {attempt}'s classified record", classified, WAIT)


# --- a timeline of the job's JobSets and pods, from watches --------------------------------


@dataclass(frozen=True)
class Seen:
    """One watch event: ``rv`` is the object's resourceVersion in the event, which for a
    single etcd is the revision of that change (comparable across resource types)."""

    rv: int
    at: float
    kind: str
    type: str
    name: str
    attempt: int | None
    obj: Obj


@dataclass
class Timeline:
    """Every change to the job's JobSets and pods while it runs, in etcd order.

    Lists first, then watches from the list's resourceVersion, so no change is missed;
    used to prove orderings a poll could miss (the old world gone before the new starts).
    """

    kube: HarnessKube
    namespace: str
    job: str
    seen: list[Seen] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _listeners: list[Callable[[Seen], None]] = field(default_factory=list)

    def __enter__(self) -> Timeline:
        selector = f"{keys.JOB_LABEL}={self.job}"
        pods = self.kube.core.list_namespaced_pod(self.namespace, label_selector=selector)
        jobsets = self.kube.custom.list_namespaced_custom_object(
            JOBSET_GROUP, JOBSET_VERSION, self.namespace, "jobsets", label_selector=selector
        )
        for kind, rv in (("Pod", pods.metadata.resource_version),
                         ("JobSet", jobsets["metadata"]["resourceVersion"])):  # fmt: skip
            t = threading.Thread(
                target=self._watch, args=(kind, selector, rv), daemon=True, name=f"tl-{kind}"
            )
            t.start()
            self._threads.append(t)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=10)

    def on_event(self, fn: Callable[[Seen], None]) -> None:
        """Call ``fn`` from the watch thread for every change seen from now on."""
        self._listeners.append(fn)

    def _list_fn(self, kind: str) -> Callable[..., Any]:
        if kind == "Pod":
            return self.kube.core.list_namespaced_pod  # type: ignore[no-any-return]
        return self.kube.custom.list_namespaced_custom_object  # type: ignore[no-any-return]

    def _watch(self, kind: str, selector: str, rv: str) -> None:
        args: tuple[Any, ...] = (
            (self.namespace,)
            if kind == "Pod"
            else (JOBSET_GROUP, JOBSET_VERSION, self.namespace, "jobsets")
        )
        while not self._stop.is_set():
            w = watch.Watch()
            try:
                for event in w.stream(
                    self._list_fn(kind), *args, label_selector=selector,
                    resource_version=rv, timeout_seconds=2, allow_watch_bookmarks=False,
                ):  # fmt: skip
                    obj = event["object"]
                    raw = (
                        obj
                        if isinstance(obj, dict)
                        else self.kube.api.sanitize_for_serialization(obj)
                    )
                    meta = raw.get("metadata") or {}
                    rv = meta.get("resourceVersion", rv)
                    labels = meta.get("labels") or {}
                    attempt = labels.get(keys.ATTEMPT_LABEL)
                    seen = Seen(
                        int(rv), time.monotonic(), kind, event["type"], meta.get("name", ""),
                        int(attempt) if attempt and attempt.isdigit() else None, raw,
                    )  # fmt: skip
                    with self._lock:
                        self.seen.append(seen)
                    for fn in list(self._listeners):
                        fn(seen)
                    if self._stop.is_set():
                        break
            except ApiException as exc:
                if exc.status == 410:  # expired: start over from a fresh list (not expected)
                    raise
                time.sleep(0.1)
            except Exception:  # a dropped connection: resume from the last revision
                if self._stop.is_set():
                    return
                time.sleep(0.1)
            finally:
                w.stop()

    def sync(self, timeout: float = WAIT) -> None:
        """Wait until the watches have delivered every change up to the current state of the
        job's pods and JobSets. A watch lags the API under load: a test that saw pods run
        (through a LIST) and then read the timeline at once missed a pod's ADDED (a flake).
        Each watch delivers its kind in etcd order, so having seen every live object at its
        current resourceVersion means every earlier change (a deletion too) was seen."""
        selector = f"{keys.JOB_LABEL}={self.job}"

        def caught_up() -> bool:
            pods = self.kube.core.list_namespaced_pod(self.namespace, label_selector=selector)
            sets = self.kube.custom.list_namespaced_custom_object(
                JOBSET_GROUP, JOBSET_VERSION, self.namespace, "jobsets", label_selector=selector
            )
            want = {("Pod", p.metadata.name): int(p.metadata.resource_version)
                    for p in pods.items}  # fmt: skip
            want |= {("JobSet", j["metadata"]["name"]): int(j["metadata"]["resourceVersion"])
                     for j in sets.get("items", [])}  # fmt: skip
            best: dict[tuple[str, str], int] = {}
            with self._lock:
                for s in self.seen:
                    best[(s.kind, s.name)] = max(best.get((s.kind, s.name), 0), s.rv)
            return all(best.get(key, 0) >= rv for key, rv in want.items())

        wait_for("the timeline to catch up with the API", caught_up, timeout, every=0.05)

    def events(self, kind: str | None = None, type_: str | None = None) -> list[Seen]:
        self.sync()
        with self._lock:
            found = list(self.seen)
        return sorted(
            (
                s
                for s in found
                if (kind is None or s.kind == kind) and (type_ is None or s.type == type_)
            ),
            key=lambda s: s.rv,
        )

    def first(self, kind: str, type_: str, name: str) -> Seen | None:
        return next((s for s in self.events(kind, type_) if s.name == name), None)

    def names(self, kind: str, attempt: int) -> set[str]:
        return {s.name for s in self.events(kind) if s.attempt == attempt}


# --- faults the harness does not report yet -------------------------------------------------


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def kubelet_reports_init_failure(
    kube: HarnessKube, namespace: str, pod: str, *, exit_code: int, message: str
) -> None:
    """The kubelet's report of the resume init container failing (``restartPolicy: Never``):
    the init container terminated with its termination-log message, the trainer never
    started (waiting PodInitializing), the pod Failed, Initialized=False."""
    faults.ignore_in_kwok(kube, pod=(namespace, pod))
    p = kube.api.sanitize_for_serialization(kube.core.read_namespaced_pod(pod, namespace))
    now = _now()
    init = next(c for c in p["spec"]["initContainers"] if c["name"] == keys.RESUME_INIT_CONTAINER)
    trainer = p["spec"]["containers"][0]
    not_init = f"containers with incomplete status: [{keys.RESUME_INIT_CONTAINER}]"
    pending = f"containers with unready status: [{trainer['name']}]"
    status = {
        "phase": "Failed",
        "initContainerStatuses": [
            {
                "name": init["name"],
                "image": init["image"],
                "ready": False,
                "restartCount": 0,
                "started": False,
                "state": {
                    "terminated": {
                        "exitCode": exit_code,
                        "reason": "Error",
                        "message": message,
                        "startedAt": now,
                        "finishedAt": now,
                        "containerID": f"containerd://kwok-{pod}-{init['name']}",
                    },
                    "running": None,
                    "waiting": None,
                },
            }
        ],
        "containerStatuses": [
            {
                "name": trainer["name"],
                "image": trainer["image"],
                "ready": False,
                "restartCount": 0,
                "started": False,
                "state": {
                    "waiting": {"reason": "PodInitializing"},
                    "running": None,
                    "terminated": None,
                },
            }
        ],
        "conditions": [
            {
                "type": "Initialized",
                "status": "False",
                "reason": "ContainersNotInitialized",
                "message": not_init,
                "lastTransitionTime": now,
            },
            {
                "type": "Ready",
                "status": "False",
                "reason": "PodFailed",
                "message": pending,
                "lastTransitionTime": now,
            },
            {
                "type": "ContainersReady",
                "status": "False",
                "reason": "PodFailed",
                "message": pending,
                "lastTransitionTime": now,
            },
        ],
    }
    kube.core.patch_namespaced_pod_status(pod, namespace, {"status": status})


def terminate_ranks(
    kube: HarnessKube, namespace: str, pods: list[Obj], message: Callable[[int], str]
) -> int:
    """The healthy ranks die of collective timeouts after the first failure; a pod the Job
    controller has already removed is skipped. Returns how many were reported."""
    reported = 0
    for p in pods:
        try:
            faults.terminate_container(
                kube, namespace, p["metadata"]["name"], exit_code=1, message=message(rank_of(p))
            )
            reported += 1
        except ApiException as exc:
            if exc.status != 404:
                raise
    return reported


# --- checkpoints: the shim as the init container runs it --------------------------------------


@dataclass(frozen=True)
class ShimRun:
    returncode: int
    stdout: str
    stderr: str
    termination_message: str


def shim_resolve(root: str, step: int, tmp: Path) -> ShimRun:
    """``rtj-shim resolve`` exactly as the rendered init container runs it, on this machine
    (the environment carries the store's endpoint and credentials)."""
    log = tmp / f"termination-log-{step}"
    shim = Path(sys.executable).with_name("rtj-shim")
    done = subprocess.run(
        [str(shim), "resolve", "--root", root, "--step", str(step), "--deep",
         "--write", str(tmp / "resume.json"), "--termination-log", str(log)],
        capture_output=True, text=True, timeout=60, env=dict(os.environ), check=False,
    )  # fmt: skip
    message = log.read_text(encoding="utf-8") if log.exists() else ""
    return ShimRun(done.returncode, done.stdout, done.stderr, message)


# --- Kueue -------------------------------------------------------------------------------


def workload_of(kube: HarnessKube, namespace: str, jobset: str) -> Obj | None:
    for wl in kube.kueue_list("workloads", namespace):
        owners = wl["metadata"].get("ownerReferences") or []
        if any(o.get("kind") == "JobSet" and o.get("name") == jobset for o in owners):
            return wl
    return None


def workload_condition(wl: Obj | None, type_: str) -> Obj | None:
    if wl is None:
        return None
    return next((c for c in (wl.get("status") or {}).get("conditions") or []
                 if c.get("type") == type_), None)  # fmt: skip


@contextlib.contextmanager
def priority_class(kube: HarnessKube, name: str, value: int) -> Iterator[str]:
    """A cluster-wide Kueue WorkloadPriorityClass, removed afterwards."""
    kube.kueue_create(
        "workloadpriorityclasses",
        {"apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}", "kind": "WorkloadPriorityClass",
         "metadata": {"name": name}, "value": value,
         "description": "a drill's urgent workload"},
    )  # fmt: skip
    try:
        yield name
    finally:
        with contextlib.suppress(ApiException):
            kube.custom.delete_cluster_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, "workloadpriorityclasses", name
            )


def enable_preemption(kube: HarnessKube, cluster_queue: str) -> None:
    """``withinClusterQueue: LowerPriority`` on the test's ClusterQueue."""
    kube.custom.patch_cluster_custom_object(
        KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", cluster_queue,
        {"spec": {"preemption": {"withinClusterQueue": "LowerPriority"}}},
    )  # fmt: skip


# --- tools -------------------------------------------------------------------------------


class TcpProxy:
    """A loopback TCP forwarder in front of a server: ``down()`` closes the listening port
    and every open connection (the endpoint is unreachable: connection refused), ``up()``
    listens on the same port again. The server behind it keeps its data."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.port = 0
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def up(self) -> TcpProxy:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        sock.listen(64)
        self.port = sock.getsockname()[1]
        self._listener = sock
        threading.Thread(target=self._accept, args=(sock,), daemon=True, name="proxy").start()
        return self

    def down(self) -> None:
        sock, self._listener = self._listener, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        with self._lock:
            conns, self._conns = self._conns, set()
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()

    def _accept(self, sock: socket.socket) -> None:
        while True:
            try:
                client, _ = sock.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not sock:  # went down meanwhile
                    client.close()
                    server.close()
                    return
                self._conns |= {client, server}
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            with self._lock:
                self._conns -= {src, dst}
