"""The operator as a real process against the harness's API server, and helpers the
operator tests, end-to-end scenarios and benchmarks share."""

from __future__ import annotations

import itertools
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

from e2e.cluster.manifests import load_yaml
from rtj_operator.api import keys
from rtj_operator.kube import Kube
from rtj_operator.kube_errors import NotFound

REPO = Path(__file__).resolve().parents[1]
CRD = REPO / "crds" / "resilienttrainingjobs.yaml"
T = TypeVar("T")
Obj = dict[str, Any]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class UnknownLabels(LookupError):
    """Asked for a sample by label names none of the metric's series carries."""


_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_ESCAPE = re.compile(r"\\(.)")


def _unescape(m: re.Match[str]) -> str:
    return "\n" if m[1] == "n" else m[1]


def metric_value(text: str, metric_name: str, labels: Mapping[str, str]) -> float:
    """The sample of `metric_name` with exactly `labels` in a /metrics page; 0.0 when absent.

    Raises UnknownLabels when the metric has series but none with exactly the label names
    asked (a label added or renamed since the caller was written) instead of reading 0, which
    would make an assertion of "no restart" pass and one of "one more" fail far from its cause."""
    want = dict(labels)
    shapes: set[tuple[str, ...]] = set()
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        metric, _, rest = head.partition("{")
        if metric != metric_name:
            continue
        got = {k: _ESCAPE.sub(_unescape, v) for k, v in _LABEL.findall(rest)}
        if got == want:
            return float(value)
        shapes.add(tuple(sorted(got)))
    if shapes and tuple(sorted(want)) not in shapes:
        raise UnknownLabels(
            f"{metric_name} has series labelled {sorted(shapes)}, none {sorted(want)}"
        )
    return 0.0


def wait_for(
    what: str,
    fn: Callable[[], T | None],
    timeout: float = 60.0,
    every: float = 0.1,
    *,
    impossible: Callable[[], str | None] | None = None,
    impossible_for: float = 20.0,
) -> T:
    """Poll ``fn`` until it returns something truthy. ``impossible`` (asked every 5 s) names
    why the wait cannot succeed; once it has said so for ``impossible_for`` seconds in a row
    the wait fails at once, naming it, instead of waiting out its timeout."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    next_check, hopeless_since = time.monotonic() + 5.0, None
    while time.monotonic() < deadline:
        try:
            value = fn()
            if value:
                return value
        except NotFound as exc:
            last = exc
        if impossible is not None and time.monotonic() >= next_check:
            next_check = time.monotonic() + 5.0
            why = impossible()
            hopeless_since = (hopeless_since or time.monotonic()) if why else None
            if why and time.monotonic() - hopeless_since >= impossible_for:
                raise TimeoutError(f"gave up waiting for {what}: {why}")
        time.sleep(every)
    raise TimeoutError(
        f"timed out after {timeout:.0f}s waiting for {what}" + (f" ({last})" if last else "")
    )


def harness_broken(kube: Kube) -> str | None:
    """What in the harness keeps pods from running (KWOK no longer renewing the Leases of
    nodes it manages), or None. Faults a test injects never show here (node_health)."""
    from e2e.cluster.cluster import NODE_LEASE_SECONDS
    from e2e.cluster.node_health import kwok_lease_troubles

    nodes = kube.request("list nodes", "GET", "/api/v1/nodes").get("items") or []
    leases = (
        kube.request(
            "list node leases",
            "GET",
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
        ).get("items")
        or []
    )
    troubles = kwok_lease_troubles(
        nodes, leases, now=datetime.now(timezone.utc), lease_seconds=NODE_LEASE_SECONDS
    )
    return "KWOK's node Leases: " + "; ".join(map(str, troubles)) if troubles else None


def client(kubeconfig: str) -> Kube:
    from kubernetes import config

    return Kube(config.new_client_from_config(config_file=kubeconfig))


def install_crd(kube: Kube) -> None:
    """Create or replace the generated CRD and wait until it is Established."""
    body = load_yaml(CRD.read_text(encoding="utf-8"))  # in C: 0.1 s, not 1.4 s
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    try:
        kube.request("create crd", "POST", path, body)
    except Exception:
        current = kube.request("get crd", "GET", f"{path}/{keys.CRD_NAME}")
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        kube.request("replace crd", "PUT", f"{path}/{keys.CRD_NAME}", body)

    def established() -> bool:
        crd = kube.request("get crd", "GET", f"{path}/{keys.CRD_NAME}")
        conds = (crd.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conds)

    wait_for("the CRD to be Established", established, 30)
    time.sleep(0.5)  # discovery picks the new resource up


def rtj_body(name: str, namespace: str, uri: str, *, replicas: int = 2, **spec: Any) -> Obj:
    body: Obj = {
        "apiVersion": keys.API_VERSION,
        "kind": keys.KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "queueName": "team-a",
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "trainer",
                            "image": "registry.example/trainer:dev",
                            "command": ["torchrun", "train.py"],
                            "resources": {
                                "requests": {"nvidia.com/gpu": "8", "cpu": "1", "memory": "1Gi"},
                                "limits": {"nvidia.com/gpu": "8"},
                            },
                        }
                    ]
                }
            },
            "checkpoint": {"uri": uri, "emergencySaveSeconds": 0},
            "failurePolicy": {"backoff": {"initialSeconds": 1, "maxSeconds": 5}},
        },
    }
    body["spec"].update(spec)
    return body


FAIL_OVER_LEASE = ("--lease-duration", "4", "--renew-deadline", "3", "--retry-period", "1")
"""The harness's leader lease: short, so the fail-over tests see a second replica take over
in seconds. A replica whose event loop misses a renewal for 3 s steps down."""
SINGLE_REPLICA_LEASE = ("--lease-duration", "15", "--renew-deadline", "10", "--retry-period", "2")
"""The operator's own defaults, for a platform of one replica under load (trainers, or a
hundred KWOK pods starting, on a small machine): with no one to take over, the fail-over
lease buys nothing, and in CI a renewal that took over 3 s made the only replica step down
mid-drill (the GPU-fault drill hung). Passed after the harness's, it wins."""


_SERIALS = itertools.count(1)
"""Each OperatorProcess's number: its identity and log file differ from every other's (a
replica started beside another of the same lease shared its log file and, with
`id(self) % 100000`, once its identity, and led at once)."""


class OperatorProcess:
    """`python -m rtj_operator run` on the harness's kubeconfig, logging to a file."""

    def __init__(
        self,
        kubeconfig: str,
        namespace: str,
        log_dir: Path,
        *,
        lease_name: str,
        extra: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.log_dir = log_dir
        self.lease_name = lease_name
        self.extra = extra
        self.env = env
        self.port = 0
        self.health_port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.serial = next(_SERIALS)  # one per process object: two replicas of a lease differ
        self.log_path = log_dir / "operator-0.log"

    def start(self, wait_leading: bool = True) -> OperatorProcess:
        self.port, self.health_port = free_port(), free_port()
        self.starts += 1
        name = f"{self.lease_name}-{self.serial}-{self.starts}"
        self.log_path = self.log_dir / f"operator-{name}.log"
        args = [
            sys.executable, "-m", "rtj_operator", "run",
            "--kubeconfig", self.kubeconfig,
            "--namespace", self.namespace,
            "--metrics-port", str(self.port), "--metrics-addr", "127.0.0.1",
            "--health-port", str(self.health_port), "--health-addr", "127.0.0.1",
            "--log-format", "text",  # the tests read and print these logs
            "--lease-namespace", self.namespace, "--lease-name", self.lease_name,
            *FAIL_OVER_LEASE,
            "--identity", name,
            "--checkpoint-refresh-seconds", "2",
            # the harness's loopback S3 buckets are the platform's: jobs without a
            # credentialsSecret are read with the operator's own (test) identity
            "--operator-identity-store", "s3://",
            *self.extra,
        ]  # fmt: skip
        env = {**os.environ, **(self.env or {}), "PYTHONUNBUFFERED": "1"}
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO
            )
        wait_for("the operator's /metrics", self._metrics_up, 30)
        if wait_leading:
            wait_for("the operator to lead", lambda: "leading as" in self.log(), 30)
        return self

    def _metrics_up(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"operator exited {self.proc.returncode}:\n{self.log()[-3000:]}")
        try:
            self.metrics()
            return True
        except OSError:
            return False

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            return str(r.read().decode())

    def metric(self, metric_name: str, /, **labels: str) -> float:
        """One sample of /metrics (see `metric_value`)."""
        return metric_value(self.metrics(), metric_name, labels)

    def log(self) -> str:
        return (
            self.log_path.read_text(encoding="utf-8", errors="replace")
            if self.log_path.exists()
            else ""
        )

    def kill(self) -> None:
        """SIGKILL: no cleanup, no lease release (a crash)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode


# --- reading the cluster ---------------------------------------------------------------------


def rtj_status(kube: Kube, namespace: str, name: str) -> Obj:
    return kube.get_rtj(namespace, name).get("status") or {}


def jobsets_of(kube: Kube, namespace: str, name: str) -> list[Obj]:
    return kube.list_jobsets(namespace, f"{keys.JOB_LABEL}={name}")


def pods_of(kube: Kube, namespace: str, name: str) -> list[Obj]:
    return kube.list_pods(namespace, f"{keys.JOB_LABEL}={name}")


def events_of(kube: Kube, namespace: str, name: str) -> list[Obj]:
    selector = f"involvedObject.kind={keys.KIND},involvedObject.name={name}"
    return kube.list_events(namespace, selector)


def running_pods(
    kube: Kube, namespace: str, name: str, attempt: int, replicas: int
) -> list[Obj] | None:
    pods = [
        p for p in pods_of(kube, namespace, name)
        if p["metadata"]["labels"].get(keys.ATTEMPT_LABEL) == str(attempt)
        and (p.get("status") or {}).get("phase") == "Running"
        and not p["metadata"].get("deletionTimestamp")
    ]  # fmt: skip
    return pods if len(pods) == replicas else None


def publish_steps(uri: str, steps: list[int], tmp: Path, run_id: str) -> None:
    """Publish real checkpoint steps through the shim's protocol (the trainer's side)."""
    from rtj_shim.checkpoint.protocol import CommitProtocol
    from rtj_shim.checkpoint.storage import open_store

    for step in steps:
        src = tmp / f"ckpt-src-{step}"
        src.mkdir(parents=True, exist_ok=True)
        (src / "model.pt").write_bytes(os.urandom(1024) + step.to_bytes(8, "big"))
        CommitProtocol(open_store(uri), run_id=run_id, attempt="1").publish_directory(step, src)
