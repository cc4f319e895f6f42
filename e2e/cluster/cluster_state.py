"""A local cluster's state on disk: ``<cache>/cluster/<name>/state.json`` with its processes'
PIDs and ports, its kubeconfig and start-up timings, so that ``down``/``status`` work from
another process."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from . import build
from .processes import Proc

DEFAULT_NAME = "rtj-e2e"


def state_root() -> Path:
    return build.cache_dir() / "cluster"


@dataclass
class ClusterState:
    name: str
    dir: Path
    kubeconfig: Path
    api_port: int = 0
    procs: list[Proc] = field(default_factory=list)
    nodes: int = 0
    started_at: float = 0.0
    startup_seconds: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def state_file(self) -> Path:
        return self.dir / "state.json"

    def save(self) -> None:
        self.state_file.write_text(
            json.dumps(
                {
                    "name": self.name,
                    "kubeconfig": str(self.kubeconfig),
                    "api_port": self.api_port,
                    "procs": [p.to_dict() for p in self.procs],
                    "nodes": self.nodes,
                    "started_at": self.started_at,
                    "startup_seconds": self.startup_seconds,
                    "timings": self.timings,
                },
                indent=2,
            )
            + "\n"
        )

    @classmethod
    def load(cls, name: str = DEFAULT_NAME) -> ClusterState | None:
        d = state_root() / name
        try:
            raw = json.loads((d / "state.json").read_text())
        except (OSError, ValueError):
            return None
        return cls(
            name=raw["name"],
            dir=d,
            kubeconfig=Path(raw["kubeconfig"]),
            api_port=int(raw.get("api_port", 0)),
            procs=[Proc.from_dict(p) for p in raw.get("procs", [])],
            nodes=int(raw.get("nodes", 0)),
            started_at=float(raw.get("started_at", 0)),
            startup_seconds=float(raw.get("startup_seconds", 0)),
            timings=dict(raw.get("timings", {})),
        )
