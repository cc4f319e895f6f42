"""Real processes (torchrun, gloo, CPU): the same training on fewer workers.

``examples/elastic_train.py`` trains 4 ranks to step 4, leaves (a node lost), resumes on
3 ranks to step 8 (shrunk), and on 4 again to the end (grown back), through the verified
checkpoints of the Checkpointer. Against a no-fault run on 4 ranks: every epoch consumed
the same samples, each once; the optimizer ran the same number of steps with the same
learning rates; and the losses and final parameters differ by no more than a no-fault run
on 3 ranks differs from the one on 4 (the tolerance, measured here, of summing the same
gradients in another order).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "elastic_train.py"
STEPS = 12  # 48 samples, global batch 16: three epochs of three steps, and three more
ARGS = ["--steps", str(STEPS), "--samples", "48", "--global-batch", "16", "--micro-batch", "4"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def train(root: Path, logs: Path, world: int, *extra: str) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world),
           "--master-addr", "127.0.0.1", "--master-port", str(_port()),
           str(EXAMPLE), "--root", str(root), "--log-dir", str(logs), *ARGS, *extra]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
           "RTJ_RESUME_FILE": "/nonexistent/resume.json"}  # fmt: skip
    env.pop("TORCHELASTIC_RESTART_COUNT", None)
    out = logs.parent / f"{logs.name}-w{world}.txt"
    with out.open("a") as fh:
        done = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, timeout=240)
    assert done.returncode == 0, out.read_text()[-3000:]


def steps(logs: Path) -> dict[int, list[dict[str, Any]]]:
    """Each step's records, one per rank that trained it."""
    out: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for f in sorted(logs.glob("rank-*.jsonl")):
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            if "loss" in rec:
                out[rec["step"]].append(rec)
    return dict(out)


def per_epoch(records: dict[int, list[dict[str, Any]]]) -> dict[int, Counter[int]]:
    out: dict[int, Counter[int]] = defaultdict(Counter)
    for recs in records.values():
        for rec in recs:
            out[rec["epoch"]].update(rec["samples"])
    return dict(out)


def params(path: Path) -> list[float]:
    return [x for values in json.loads(path.read_text()).values() for x in values]


@pytest.mark.slow  # five torchrun launches
def test_shrinking_to_three_and_growing_back_trains_as_four_did(tmp_path: Path) -> None:
    runs = {name: (tmp_path / f"ckpt-{name}", tmp_path / f"logs-{name}") for name in
            ("four", "three", "resized")}  # fmt: skip
    for name, world in (("four", 4), ("three", 3)):
        train(*runs[name], world, "--dump-params", str(tmp_path / f"{name}.json"))
    train(*runs["resized"], 4, "--stop-at", "4")
    train(*runs["resized"], 3, "--stop-at", "8")
    train(*runs["resized"], 4, "--dump-params", str(tmp_path / "resized.json"))

    four, three, resized = (steps(runs[n][1]) for n in ("four", "three", "resized"))
    assert sorted(resized) == list(range(1, STEPS + 1)), "every optimizer step once"
    assert [len(resized[s]) for s in sorted(resized)] == [4] * 4 + [3] * 4 + [4] * 4
    assert per_epoch(resized) == per_epoch(four), "each epoch's samples, each once"
    assert all(n == 1 for epoch in per_epoch(resized).values() for n in epoch.values())
    assert [resized[s][0]["lr"] for s in sorted(resized)] == [
        four[s][0]["lr"] for s in sorted(four)
    ]

    tolerance = max(abs(three[s][0]["loss"] - four[s][0]["loss"]) for s in four)
    drift = max(abs(resized[s][0]["loss"] - four[s][0]["loss"]) for s in four)
    # the floor: float32's rounding of a loss near 1, should both runs sum alike
    assert drift <= max(2 * tolerance, 1e-6), (drift, tolerance)
    p4, p3, pr = (params(tmp_path / f"{n}.json") for n in ("four", "three", "resized"))
    ptol = max(abs(a - b) for a, b in zip(p4, p3, strict=True))
    assert max(abs(a - b) for a, b in zip(p4, pr, strict=True)) <= max(2 * ptol, 1e-6)
    notes = (tmp_path / "logs-resized-w3.txt").read_text()
    assert "ElasticBatchSampler: world size 4 -> 3 in epoch 1 after 16 of 48 samples" in notes
