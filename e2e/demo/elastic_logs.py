"""What the elastic drill and the scarce-capacity benchmark read of ``examples/elastic_train.py``:
its ranks' step records in the pods' log volumes, and the same training without faults."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from e2e.demo import story
from e2e.operator_proc import REPO

EXAMPLE = "examples/elastic_train.py"


ATTEMPT = re.compile(r"-a(\d+)-")
"""A pod's attempt in its name (`rtj_operator.policy.render`: ``<job>-a<attempt>-...``)."""


def pod_dirs(opts: story.Options, pods: list[dict[str, Any]]) -> list[Path]:
    """The pod runner's directory of each pod of `pods` (each pod once)."""
    return [story._pod_dir(opts, p) for p in {p["metadata"]["uid"]: p for p in pods}.values()]


def step_records(dirs: Iterable[Path]) -> Iterator[dict[str, Any]]:
    """Every step record of every rank log in the pod directories `dirs`, with the pod's
    ``attempt`` added (the line a frozen or killed rank was writing is skipped)."""
    for pod in dirs:
        found = ATTEMPT.search(pod.name)
        attempt = int(found[1]) if found else 1
        for log in (pod / "volumes" / "train-logs").glob("rank-*.jsonl"):
            for line in log.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if "loss" in rec:
                    yield {**rec, "attempt": attempt}


def newest_records(dirs: Iterable[Path]) -> dict[int, list[dict[str, Any]]]:
    """Step -> the records of the world that trained it last (a step trained again after a
    restart: the newest attempt's and generation's, one record per rank of that world)."""
    by_step: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for rec in step_records(dirs):
        by_step[int(rec["step"])].append(rec)
    newest = {}
    for step, recs in by_step.items():
        top = max((r["attempt"], r["generation"]) for r in recs)
        newest[step] = [r for r in recs if (r["attempt"], r["generation"]) == top]
    return newest


def steps_by_generation(dirs: Iterable[Path]) -> dict[int, set[int]]:
    """The steps each trainer generation trained (any rank)."""
    out: dict[int, set[int]] = defaultdict(set)
    for rec in step_records(dirs):
        out[int(rec["generation"])].add(int(rec["step"]))
    return out


def epochs_exactly_once(
    records: dict[int, list[dict[str, Any]]], samples: int, global_batch: int
) -> list[str]:
    """The whole epochs of `records` (`newest_records`) that did not consume each of the
    `samples` dataset indices exactly once (empty: every one did)."""
    epochs: dict[int, Counter[int]] = defaultdict(Counter)
    for recs in records.values():
        for r in recs:
            epochs[r["epoch"]].update(r["samples"])
    whole = len(records) * global_batch // samples
    return [f"epoch {e}" for e in range(whole) if epochs[e] != Counter(range(samples))]


def no_fault_losses(work: Path, ranks: int, args: list[str]) -> dict[int, float]:
    """Step -> loss of the same training on `ranks` processes without a fault (torchrun
    --standalone; the trainer arguments `args`, one save at the end: the losses do not
    depend on saving)."""
    logs = work / f"clean-{ranks}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RTJ_", "AWS_"))}
    steps = next(a.split("=", 1)[1] for a in args if a.startswith("--steps="))
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         f"--nproc-per-node={ranks}", EXAMPLE,
         f"--root=file://{work / f'clean-ckpt-{ranks}'}", f"--log-dir={logs}",
         *(a for a in args if not a.startswith(("--step-sleep", "--sample-sleep"))),
         f"--save-every={steps}"],
        cwd=REPO, env=env, check=True, timeout=900, capture_output=True,
    )  # fmt: skip
    lines = (logs / "rank-0.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines) if "loss" in r}
