"""Helpers the fault drills share: what a user can see, recorded precisely, and the few
things the harness's fault helpers do not say yet. Beside it: the kubelet's report of an
init container's exit (``scenario_kubelet``), Kueue's Workloads and priorities
(``scenario_kueue``); an endpoint that goes down is ``e2e.tcp_proxy``.

Imported by the scenario tests as ``scenario_support`` (pytest puts this folder on
``sys.path``; like the unit tests' support modules, it has a name no other module uses).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import watch
from kubernetes.client.rest import ApiException

from e2e.cluster import faults
from e2e.cluster.kube import JOBSET_GROUP, JOBSET_VERSION
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
