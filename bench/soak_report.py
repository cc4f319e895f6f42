"""The soak's report: markdown with every figure, and a timeline picture (SVG) of faults,
recoveries and training progress. Pure: facts in, text out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

W, H, PAD = 900, 360, 50
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")


def timeline_svg(
    created: float,
    steps: Mapping[int, Mapping[int, float]],
    faults: Sequence[Mapping[str, Any]],
    title: str,
) -> str:
    """x: seconds since the job was created; y: step. One line per attempt (rank 0's step
    completions), a red mark per injected fault."""
    times = [t for per in steps.values() for t in per.values()] + [f["at"] for f in faults]
    span = max((t - created for t in times), default=1.0) or 1.0
    top = max((s for per in steps.values() for s in per), default=1) or 1

    def x(t: float) -> float:
        return PAD + (t - created) / span * (W - 2 * PAD)

    def y(step: float) -> float:
        return H - PAD - step / top * (H - 2 * PAD)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
        f'viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="11">',
        f'<text x="{W / 2}" y="18" text-anchor="middle" font-size="13">{escape(title)}</text>',
        f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - PAD}" y2="{H - PAD}" stroke="#333"/>',
        f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{H - PAD}" stroke="#333"/>',
        f'<text x="{W / 2}" y="{H - 12}" text-anchor="middle">seconds since the job was '
        f"created ({span:.0f} s)</text>",
        f'<text x="14" y="{H / 2}" transform="rotate(-90 14 {H / 2})" text-anchor="middle">'
        f"step (max {top})</text>",
    ]
    for i, (attempt, per) in enumerate(sorted(steps.items())):
        points = " ".join(f"{x(t):.1f},{y(s):.1f}" for s, t in sorted(per.items()))
        color = COLORS[i % len(COLORS)]
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" '
                   f'points="{points}"/>')  # fmt: skip
        if per:
            s, t = max(per.items())
            out.append(f'<text x="{x(t) + 3:.1f}" y="{y(s) - 3:.1f}" fill="{color}">'
                       f"attempt {attempt}</text>")  # fmt: skip
    for f in faults:
        fx = x(f["at"])
        out.append(f'<line x1="{fx:.1f}" y1="{PAD}" x2="{fx:.1f}" y2="{H - PAD}" '
                   'stroke="#d62728" stroke-dasharray="4,3"/>')  # fmt: skip
        out.append(f'<text x="{fx + 2:.1f}" y="{PAD + 10}" fill="#d62728">'
                   f"{escape(str(f['kind']))}</text>")  # fmt: skip
    out.append("</svg>")
    return "\n".join(out) + "\n"


def markdown(facts: Mapping[str, Any], settings: Mapping[str, Any], machine: str) -> str:
    records = {r["attempt"]: r for r in facts["records"]}
    rows = []
    for r in facts["recoveries"]:
        rec = records.get(r["attempt"], {})
        first = r["seconds_to_first_step"]
        rows.append(
            f"| {r['kind']} | {r['attempt']} | {rec.get('failureClass', '?')} | "
            f"{_num(rec.get('detectionSeconds'))} | {_num(rec.get('recoverySeconds'))} | "
            f"{_num(first)} | {r['lost_steps'] if r['lost_steps'] is not None else '?'} |"
        )
    problems = facts["problems"] or ["none: every invariant held"]
    injected = "; ".join(
        f"{f['kind']} at +{f['scheduled']:.0f} s: {f['what']}" for f in facts["injected"]
    )
    return "\n".join(
        [
            "# Goodput soak (real training through the operator)",
            "",
            f"Machine: {machine}. Settings: "
            + ", ".join(f"{k} {v}" for k, v in settings.items())
            + ".",
            "",
            f"**Goodput {facts['goodput'] * 100:.1f}%**: {facts['productive_seconds']:.1f} s "
            f"on steps that survive into the final model, of {facts['wall_seconds']:.1f} s "
            f"from the job's creation to its last step; {len(facts['injected'])} faults "
            f"injected, {facts['attempts']} attempts.",
            "",
            "| fault | hit attempt | recorded class | detection s | to next JobSet s | "
            "to first step s | recomputed steps |",
            "|---|---|---|---|---|---|---|",
            *rows,
            "",
            "Invariants (final model bit for bit against a no-fault run, never two worlds "
            "at once, resumes only from pinned unflagged steps, nothing leaked): "
            + "; ".join(problems),
            "",
            f"Injected: {injected or 'nothing'}.",
            "",
            "Not injected yet: Kueue preemption (the KWOK drills cover it); no side-by-side "
            "JobSet baseline yet.",
            "",
            "![timeline](goodput-timeline.svg)",
            "",
        ]
    )


def _num(value: Any) -> str:
    return f"{value:.1f}" if isinstance(value, int | float) else "?"
