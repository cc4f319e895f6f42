"""The trainers' logs, read from the pod runner's per-pod directories: each rank's JSON lines
per attempt, their losses, and the step each attempt restored."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import report
from .options import NAMESPACE, Options


def pod_dir(opts: Options, pod: dict[str, Any]) -> Path:
    meta = pod["metadata"]
    return opts.state / "runner" / "pods" / meta["namespace"] / f"{meta['name']}-{meta['uid'][:8]}"


def rank_logs(opts: Options, pods: list[dict[str, Any]], attempt: int) -> dict[int, Path]:
    out: dict[int, Path] = {}
    for p in pods:
        if p["metadata"]["labels"].get("training.resilient.dev/attempt") != str(attempt):
            continue
        for f in (pod_dir(opts, p) / "volumes" / "train-logs").glob("rank-*.jsonl"):
            out[int(f.stem.split("-")[1])] = f
    return out


def _attempt_lines(opts: Options, attempt: int) -> dict[int, list[str]]:
    """Each rank's JSON lines for one attempt, from the runner's per-pod directories (the
    pods of every attempt, gone or not)."""
    root = opts.state / "runner" / "pods" / NAMESPACE
    return {
        int(f.stem.split("-")[1]): f.read_text().splitlines()
        for f in sorted(root.glob(f"*-a{attempt}-*/volumes/train-logs/rank-*.jsonl"))
    }


def all_rank_losses(opts: Options, attempt: int) -> dict[int, list[tuple[int, float]]]:
    return {r: report.parse_losses(lines) for r, lines in _attempt_lines(opts, attempt).items()}


def collect_losses(opts: Options, attempts: int) -> tuple[report.Losses, dict[int, int | None]]:
    """Rank 0's losses per attempt, and the step each attempt restored."""
    losses: report.Losses = {}
    restored: dict[int, int | None] = {}
    for attempt in range(1, attempts + 1):
        lines = _attempt_lines(opts, attempt).get(0)
        if lines is not None:
            losses[attempt] = report.parse_losses(lines)
            restored[attempt] = report.restore_step(lines)
    return losses, restored
