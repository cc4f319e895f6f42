"""Section 3 of the hang-detection bench: today's defaults (torch's collective timeouts, read
from its source in this virtualenv) and the trainer's per-step cost of reporting progress."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import tempfile
from pathlib import Path
from typing import Any


def cpp_timeout(text: str, name: str) -> tuple[float, int] | None:
    """(seconds, line) of `constexpr auto <name> = std::chrono::milliseconds(a * b ...);`."""
    pattern = rf"constexpr auto {re.escape(name)} =\s*std::chrono::milliseconds\(([\d\s*]+)\);"
    found = re.search(pattern, text)
    if found is None:
        return None
    ms = 1
    for factor in found.group(1).split("*"):
        ms *= int(factor)
    return ms / 1000, text.count("\n", 0, found.start()) + 1


def torch_defaults() -> dict[str, Any]:
    """The collective timeouts of the torch installed here, read from its source."""
    spec = importlib.util.find_spec("torch")
    root = Path(spec.origin).parent if spec and spec.origin else Path("/nonexistent")
    inc = "include/torch/csrc/distributed/c10d"
    rows = []
    for what, file, name in (
        ("NCCL: the watchdog aborts a collective after", "ProcessGroupNCCL.hpp",
         "kProcessGroupNCCLDefaultTimeout"),
        ("gloo (any other backend): the collective times out after", "Backend.hpp",
         "kBackendDefaultTimeout"),
    ):  # fmt: skip
        path = root / inc / file
        found = cpp_timeout(path.read_text(), name) if path.exists() else None
        if found:
            rows.append({"what": what, "name": name, "seconds": found[0],
                         "where": f"torch/{inc}/{file}:{found[1]}"})  # fmt: skip
    c10d = root / "distributed" / "distributed_c10d.py"
    text = c10d.read_text() if c10d.exists() else ""
    doc = text.find("Default value is 10 minutes for NCCL")
    return {"version": importlib.metadata.version("torch") if spec else None, "rows": rows,
            "docstring": f"torch/distributed/distributed_c10d.py:{text.count(chr(10), 0, doc) + 1}",
            "env": [p.name for p in (root / inc).glob("*.hpp")
                    if "TORCH_NCCL_TIMEOUT" in p.read_text()]}  # fmt: skip


def trainer_cost() -> float:
    """Seconds the reporting of one step costs the trainer (bench.progress_overhead)."""
    from bench.progress_overhead import per_step_cost
    from rtj_shim.progress import Progress

    with tempfile.TemporaryDirectory(prefix="rtj-hang-") as tmp:
        progress = Progress(Path(tmp), 0)
        cost: float = per_step_cost(progress, 200)
        progress.close()
    return cost
