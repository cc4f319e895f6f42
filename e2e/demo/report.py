"""What the demo shows at the end: the summary and the loss plot. Pure.

Losses come from the trainer's own JSON lines (``rank-<r>.jsonl``: ``{step, loss, ...}``),
one file per rank per attempt; the numbers about the fault come from the job's status, so
what the demo prints is what ``kubectl get rtj -o yaml`` says.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from html import escape
from typing import Any

Losses = dict[int, list[tuple[int, float]]]  # attempt -> [(step, loss)] of rank 0


def parse_losses(lines: Iterable[str]) -> list[tuple[int, float]]:
    """(step, loss) of every training step in one rank's JSON lines, in file order."""
    out = []
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line the trainer was writing when it died
        if "loss" in record and "event" not in record:
            out.append((int(record["step"]), float(record["loss"])))
    return out


def restore_step(lines: Iterable[str]) -> int | None:
    """The step a run restored (its ``{"event": "restore"}`` line)."""
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if record.get("event") == "restore":
            return int(record["step"])
    return None


@dataclass(frozen=True)
class Summary:
    job: str
    phase: str
    failure_class: str | None
    first_failed_pod: str | None
    first_failed_node: str | None
    first_failed_rank: int | None
    evidence: list[str]
    tainted_nodes: list[str]
    last_step_before_fault: int | None
    resumed_from_step: int | None
    restored_step: int | None
    steps_recomputed: int | None
    checkpoints_passed_over: int | None
    detection_seconds: float | None
    recovery_seconds: float | None
    new_pods_running_seconds: float | None
    final_step: int | None
    losses_continue: bool

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def summarize(
    name: str,
    status: Mapping[str, Any],
    losses: Losses,
    *,
    restored_step: int | None,
    new_pods_running_seconds: float | None,
) -> Summary:
    attempts = list(status.get("attempts") or [])
    failed = attempts[0] if attempts else {}
    resumed = attempts[1] if len(attempts) > 1 else {}
    first = failed.get("firstFailed") or {}
    before = losses.get(1) or []
    after = losses.get(2) or []
    last_before = before[-1][0] if before else None
    resume = resumed.get("resumedFromStep")
    recomputed = last_before - resume if last_before is not None and resume is not None else None
    final = (after or before)[-1][0] if (after or before) else None
    return Summary(
        job=name,
        phase=str(status.get("phase")),
        failure_class=failed.get("failureClass"),
        first_failed_pod=first.get("pod"),
        first_failed_node=first.get("node"),
        first_failed_rank=first.get("nodeRank"),
        evidence=list(failed.get("evidence") or []),
        tainted_nodes=[q["node"] for q in status.get("quarantinedNodes") or []],
        last_step_before_fault=last_before,
        resumed_from_step=resume,
        restored_step=restored_step,
        steps_recomputed=recomputed,
        checkpoints_passed_over=failed.get("lostSteps"),
        detection_seconds=failed.get("detectionSeconds"),
        recovery_seconds=failed.get("recoverySeconds"),
        new_pods_running_seconds=new_pods_running_seconds,
        final_step=final,
        losses_continue=bool(after) and resume is not None and after[0][0] == resume + 1,
    )


def _num(value: float | None, unit: str = "s") -> str:
    return "-" if value is None else f"{value:.2f} {unit}"


def format_summary(s: Summary, losses: Losses, kubectl_get: str) -> str:
    before = dict(losses.get(1) or [])
    after = dict(losses.get(2) or [])
    lines = [
        f"Summary of {s.job}: {s.phase}",
        f"  fault            {s.failure_class} on rank {s.first_failed_rank} "
        f"(pod {s.first_failed_pod}, node {s.first_failed_node})",
        *(f"  evidence         {e}" for e in s.evidence[:3]),
        f"  tainted          {', '.join(s.tainted_nodes) or '-'}",
        f"  detection        {_num(s.detection_seconds)}  (first failure -> classified record)",
        f"  recovery         {_num(s.recovery_seconds)}  (first failure -> next JobSet, "
        "incl. backoff)",
        f"  new pods running {_num(s.new_pods_running_seconds)}  (first failure -> every new "
        "pod Running, seen by the demo)",
        f"  resumed from     step {s.resumed_from_step} (pinned and verified by the init "
        f"container; the trainer restored step {s.restored_step})",
        f"  lost work        {s.steps_recomputed} steps recomputed (step "
        f"{s.last_step_before_fault} reached before the fault); "
        f"{s.checkpoints_passed_over or 0} checkpoints passed over",
        f"  finished at      step {s.final_step}",
    ]
    if s.resumed_from_step is not None:
        lines.append("  loss around the resume (rank 0):")
        lines.append("      step   attempt 1              attempt 2")
        r = s.resumed_from_step
        for step in range(max(1, r - 2), r + 4):
            a = f"{before[step]:.10f}" if step in before else "-"
            b = f"{after[step]:.10f}" if step in after else "-"
            lines.append(f"    {step:6d}   {a:<22} {b}")
    lines += ["", "$ kubectl get rtj", kubectl_get.rstrip()]
    return "\n".join(lines)


def loss_svg(
    losses: Losses,
    *,
    fault_step: int | None,
    resume_step: int | None,
    title: str,
    width: int = 760,
    height: int = 360,
) -> str:
    """Loss vs step, one polyline per attempt, with the fault and the resume marked."""
    points = [(s, v) for series in losses.values() for s, v in series]
    if not points:
        raise ValueError("no losses to plot")
    left, right, top, bottom = 60, 20, 40, 40
    s_max = max(s for s, _ in points)
    v_min, v_max = min(v for _, v in points), max(v for _, v in points)
    span = (v_max - v_min) or 1.0

    def x(step: float) -> float:
        return left + (width - left - right) * step / max(1, s_max)

    def y(value: float) -> float:
        return top + (height - top - bottom) * (1 - (value - v_min) / span)

    colors = {1: "#1f77b4", 2: "#2ca02c"}
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="14">{escape(title)}</text>',
        f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" '
        'stroke="black"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="black"/>',
        f'<text x="{width / 2}" y="{height - 8}" text-anchor="middle">step</text>',
        f'<text x="14" y="{height / 2}" transform="rotate(-90 14 {height / 2})" '
        'text-anchor="middle">loss</text>',
        f'<text x="{left - 4}" y="{top + 4}" text-anchor="end">{v_max:.3g}</text>',
        f'<text x="{left - 4}" y="{height - bottom}" text-anchor="end">{v_min:.3g}</text>',
        f'<text x="{width - right}" y="{height - bottom + 14}" text-anchor="end">{s_max}</text>',
    ]
    for attempt, series in sorted(losses.items()):
        pts = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in series)
        color = colors.get(attempt, "#9467bd")
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{pts}"/>')
        out.append(
            f'<text x="{width - right - 4}" y="{top + 14 * attempt}" text-anchor="end" '
            f'fill="{color}">attempt {attempt}</text>'
        )
    for step, label, color in ((fault_step, "fault", "#d62728"), (resume_step, "resume", "#555")):
        if step is None:
            continue
        out.append(
            f'<line x1="{x(step):.1f}" y1="{top}" x2="{x(step):.1f}" y2="{height - bottom}" '
            f'stroke="{color}" stroke-dasharray="4,3"/>'
        )
        anchor = "start" if label == "fault" else "end"
        dx = 4 if label == "fault" else -4
        out.append(
            f'<text x="{x(step) + dx:.1f}" y="{top + 12}" text-anchor="{anchor}" '
            f'fill="{color}">{label} (step {step})</text>'
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"
