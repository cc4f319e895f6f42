"""The demo's names (namespace, queue, bucket, the fault), its options and its display."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from e2e.cluster import build
from e2e.operator_proc import REPO

NAMESPACE = "rtj-demo"
QUEUE = "demo"
BUCKET = "rtj-demo"
SECRET = "rtj-demo-s3"
CLUSTER_NAME = "rtj-demo"
EXAMPLE = REPO / "examples" / "resilient-training-job.yaml"
XID = 79  # GPU has fallen off the bus
FAULT_RANK = 1
# Cold-build minutes on a 2-core machine, for the progress display (measured, rounded up).
BUILD_MINUTES = {"kube-apiserver": 5, "kube-controller-manager": 1, "kueue": 6, "jobset": 3,
                 "kwok": 2, "etcd": 1, "kube-scheduler": 1, "kubectl": 1}  # fmt: skip


class DemoError(RuntimeError):
    pass


def state_dir() -> Path:
    return build.cache_dir() / "demo"


@dataclass
class Options:
    out: Path = REPO / "demo-output"
    state: Path = field(default_factory=state_dir)
    kubeconfig: Path | None = None
    cluster_name: str = CLUSTER_NAME
    nodes: int = 3
    fault_step: int = 100
    timeout: float = 300.0
    example: Path = EXAMPLE


class Display:
    """Phase headers and timestamped lines; the long waits say what they wait for."""

    def __init__(self, write: Callable[[str], None] | None = None) -> None:
        self.t0 = time.monotonic()
        self._write = write or (lambda s: print(s, flush=True))

    def line(self, text: str) -> None:
        self._write(f"[{time.monotonic() - self.t0:6.1f}s] {text}")

    def phase(self, text: str) -> None:
        self._write("")
        self.line(f"==> {text}")

    def detail(self, text: str) -> None:
        for part in text.rstrip().splitlines():
            self._write(f"          {part}")
