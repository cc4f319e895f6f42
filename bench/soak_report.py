"""The soak's report: markdown with every figure, and a timeline picture (SVG) of faults,
recoveries and training progress. Pure: facts in, text out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

from bench import cpu_account
from bench.soak_schedule import DEFAULT_MIX
from rtj_operator.api.ledger import LedgerPhase

W, H, PAD = 900, 360, 50
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")


def timeline_svg(
    created: float,
    steps: Mapping[Any, Mapping[int, float]],
    faults: Sequence[Mapping[str, Any]],
    title: str,
) -> str:
    """x: seconds since the job was created; y: step. One line per world (rank 0's step
    completions; keyed by attempt, or `bench.soak_accounting.world_label`), a red mark per
    injected fault."""
    return lanes_svg([Lane(title, created, steps, faults)], title)


@dataclass(frozen=True)
class Lane:
    """One system's run: its title, creation time, attempt -> step -> time, faults."""

    title: str
    created: float
    steps: Mapping[Any, Mapping[int, float]]
    """World (an attempt number, or a label "3" / "3 g2": attempt 3, trainer generation 2)
    -> step -> time."""
    faults: Sequence[Mapping[str, Any]]
    end: float | None = None
    """Where the run's wall time ended, when it is not its last step (a cap): marked."""
    end_label: str = ""


def lanes_svg(lanes: Sequence[Lane], title: str) -> str:
    """One timeline per lane, stacked, on a shared time axis (seconds since each run's
    job was created) and a shared step axis."""
    span = max((_span(lane) for lane in lanes), default=1.0) or 1.0
    top = max((s for lane in lanes for per in lane.steps.values() for s in per), default=1) or 1
    height = PAD + len(lanes) * (H - PAD)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" '
        f'viewBox="0 0 {W} {height}" font-family="sans-serif" font-size="11">',
        f'<text x="{W / 2}" y="18" text-anchor="middle" font-size="13">{escape(title)}</text>',
    ]
    for i, lane in enumerate(lanes):
        out += _lane(lane, i * (H - PAD), span, top, len(lanes) > 1)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _span(lane: Lane) -> float:
    times = [t for per in lane.steps.values() for t in per.values()]
    times += [f["at"] for f in lane.faults] + ([lane.end] if lane.end is not None else [])
    return max((t - lane.created for t in times), default=1.0)


def _lane(lane: Lane, dy: float, span: float, top: int, titled: bool) -> list[str]:
    created = lane.created

    def x(t: float) -> float:
        return PAD + (t - created) / span * (W - 2 * PAD)

    def y(step: float) -> float:
        return dy + H - PAD - step / top * (H - 2 * PAD)

    base, mid = dy + H - PAD, dy + H / 2
    out = [
        f'<line x1="{PAD}" y1="{base}" x2="{W - PAD}" y2="{base}" stroke="#333"/>',
        f'<line x1="{PAD}" y1="{dy + PAD}" x2="{PAD}" y2="{base}" stroke="#333"/>',
        f'<text x="{W / 2}" y="{base + 38}" text-anchor="middle">seconds since the job was '
        f"created ({span:.0f} s)</text>",
        f'<text x="14" y="{mid}" transform="rotate(-90 14 {mid})" text-anchor="middle">'
        f"step (max {top})</text>",
    ]
    if titled:
        out.append(f'<text x="{PAD + 6}" y="{dy + PAD - 6}" font-size="12" '
                   f'font-weight="bold">{escape(lane.title)}</text>')  # fmt: skip
    ordered = sorted(lane.steps.items(), key=lambda kv: world_key(kv[0]))
    for i, (world, per) in enumerate(ordered):
        points = " ".join(f"{x(t):.1f},{y(s):.1f}" for s, t in sorted(per.items()))
        color = COLORS[i % len(COLORS)]
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" '
                   f'points="{points}"/>')  # fmt: skip
        if per:
            s, t = max(per.items())
            out.append(f'<text x="{x(t) + 3:.1f}" y="{y(s) - 3:.1f}" fill="{color}">'
                       f"attempt {escape(str(world))}</text>")  # fmt: skip
    if lane.end is not None:
        ex = x(lane.end)
        out.append(f'<line x1="{ex:.1f}" y1="{dy + PAD}" x2="{ex:.1f}" y2="{base}" '
                   'stroke="#555" stroke-width="2"/>')  # fmt: skip
        out.append(f'<text x="{ex - 2:.1f}" y="{dy + PAD + 24}" text-anchor="end" '
                   f'fill="#555">{escape(lane.end_label)}</text>')  # fmt: skip
    for f in lane.faults:
        fx = x(f["at"])
        out.append(f'<line x1="{fx:.1f}" y1="{dy + PAD}" x2="{fx:.1f}" y2="{base}" '
                   'stroke="#d62728" stroke-dasharray="4,3"/>')  # fmt: skip
        out.append(f'<text x="{fx + 2:.1f}" y="{dy + PAD + 10}" fill="#d62728">'
                   f"{escape(str(f['kind']))}</text>")  # fmt: skip
    return out


def world_key(world: Any) -> tuple[int, int]:
    """Sort key of a timeline's world: 3 or "3" -> (3, 0); "3 g2" -> (3, 2)."""
    attempt, _, generation = str(world).partition(" g")
    return int(attempt), int(generation or 0)


def _world(attempt: Any, generation: Any) -> str:
    return f"{attempt}" if not generation else f"{attempt} g{generation}"


def _resumed(r: Mapping[str, Any]) -> str:
    if r.get("resumed_from") is None:
        return "?"
    return f"{r['resumed_from']} ({r.get('tier') or '?'})"


def markdown(
    facts: Mapping[str, Any],
    settings: Mapping[str, Any],
    machine: str,
    svg: str = "goodput-timeline.svg",
    command: str | None = None,
) -> str:
    records = {r["attempt"]: r for r in facts["records"]}
    rows = []
    for r in facts["recoveries"]:
        rec = records.get(r["attempt"], {})
        first = r["seconds_to_first_step"]
        nxt = (_world(r["resumed_attempt"], r.get("resumed_generation"))
               if r["resumed_attempt"] is not None else "none")  # fmt: skip
        rows.append(
            f"| {r['kind']} | {_world(r['attempt'], r.get('generation'))} -> {nxt} | "
            f"{r.get('path') or '?'} | {r.get('failure_class', rec.get('failureClass')) or '?'} | "
            f"{_num(r.get('detection_seconds', rec.get('detectionSeconds')))} | "
            f"{_num(r.get('recovery_seconds', rec.get('recoverySeconds')))} | "
            f"{_num(first)} | {_resumed(r)} | "
            f"{r['lost_steps'] if r['lost_steps'] is not None else '?'} |"
        )
    problems = facts["problems"] or ["none: every invariant held"]
    injected = "; ".join(
        f"{f['kind']} at +{f['scheduled']:.0f} s: {f['what']}" for f in facts["injected"]
    )
    worlds = (f", {facts['worlds']} worlds ({facts.get('in_place_restarts', 0)} restarts in "
              "place)" if "worlds" in facts else "")  # fmt: skip
    fallbacks = list(facts.get("fallbacks") or [])
    preemptions = _preemptions(facts["recoveries"])
    return "\n".join(
        [
            "# Goodput soak (real training through the operator)",
            "",
            *([_generated(facts, command), ""] if command else []),
            f"Machine: {machine}. Settings: "
            + ", ".join(f"{k} {v}" for k, v in settings.items())
            + ".",
            "",
            f"**Goodput {facts['goodput'] * 100:.1f}%**: {facts['productive_seconds']:.1f} s "
            f"on steps that survive into the final model, of {facts['wall_seconds']:.1f} s "
            f"from the job's creation to its last step (checkpoint stalls, lost: "
            f"{facts.get('checkpoint_stall_seconds', 0.0):.1f} s); {len(facts['injected'])} faults "
            f"injected, {facts['attempts']} attempts{worlds}.",
            "",
            "Per fault: the world it hit and the next that trained (attempt, `gN`: trainer "
            "generation N of an in-place restart), the recovery path, the class the operator "
            "recorded, detection (in place: the injection to the restart's `detectedAt`; "
            "whole world: the attempt's `detectionSeconds`), the operator's recovery (in "
            "place: `detectedAt` to every pod running the new generation; whole world: to the "
            "next JobSet), the injection to the next world's first step, the step and tier "
            "it resumed from, and the steps trained again.",
            "",
            "| fault | worlds | path | recorded class | detection s | recovery s | "
            "to first step s | resumed from | recomputed steps |",
            "|---|---|---|---|---|---|---|---|---|",
            *rows,
            "",
            *([f"Fast-tier fallbacks: {'; '.join(fallbacks)}.", ""] if fallbacks else []),
            *([preemptions, ""] if preemptions else []),
            *ledger_table(facts["recoveries"]),
            "Invariants (final model bit for bit against a no-fault run, never two worlds "
            "at once, resumes only from pinned unflagged steps, nothing leaked): "
            + "; ".join(problems),
            "",
            f"Injected: {injected or 'nothing'}.",
            "",
            *cpu_section({"this run": facts.get("cpu_seconds") or {}}),
            _mix_words(facts["mix"] if "mix" in facts else dict(DEFAULT_MIX)),
            "",
            f"![timeline]({svg})",
            "",
        ]
    )


def ledger_table(recoveries: Sequence[Mapping[str, Any]]) -> list[str]:
    """The operator's recovery ledger per fault (`status.recoveries`, `bench.soak_ledger`):
    each phase's seconds, and how far its first step was from the trainers' logs."""
    rows = [r for r in recoveries if r.get("ledger")]
    if not rows:
        return []
    phases = [p.value for p in LedgerPhase]
    out = [
        "The operator's recovery ledger (`status.recoveries`) per fault: each phase's "
        "seconds from the end of the one before it (blank: not part of that recovery), "
        "their sum (onset to the last rank's first step) and the ledger's first step "
        "minus the last rank's own log line of it.",
        "",
        f"| fault | {' | '.join(phases)} | sum | vs logs |",
        f"|---|{'---|' * (len(phases) + 2)}",
    ]
    for r in rows:
        cells = [_num(r["ledger"].get(p)) if p in r["ledger"] else "" for p in phases]
        out.append(f"| {r['kind']} | {' | '.join(cells)} | {_num(r.get('ledger_seconds'))} | "
                   f"{r.get('ledger_lag', 0.0):+.2f} |")  # fmt: skip
    return [*out, ""]


def _preemptions(recoveries: Sequence[Mapping[str, Any]]) -> str:
    """The Kueue preemptions' own figures, one sentence ("" when there were none)."""
    parts = []
    for r in recoveries:
        if "quota_held_seconds" not in r:
            continue
        world = _world(r["attempt"], r.get("generation"))
        evicted, held = _num(r["evicted_seconds"]), _num(r["quota_held_seconds"])
        parts.append(f"attempt {world}: Kueue evicted it and admitted the urgent workload in "
                     f"{evicted} s, which held the quota {held} s; the job trained again "
                     f"{_num(r['after_release_seconds'])} s after it left")  # fmt: skip
    if not parts:
        return ""
    return ("Kueue preemptions (the time not admitted is lost wall time, in the recovery's "
            "seconds to the first step): " + "; ".join(parts) + ".")  # fmt: skip


def _generated(facts: Mapping[str, Any], command: str) -> str:
    out = f"Generated by `{command}`"
    if facts.get("code"):
        out += f" at commit {facts['code']}"
    if facts.get("harness_seconds"):
        out += (f"; the harness took {facts['harness_seconds']:.0f} s (platform, soak and "
                "the no-fault run)")  # fmt: skip
    return out + "."


def _num(value: Any) -> str:
    return f"{value:.1f}" if isinstance(value, int | float) else "?"


def cpu_section(runs: Mapping[str, Mapping[str, float]]) -> list[str]:
    """Where the CPU went (`bench.cpu_account`), one column per run; nothing when a run
    has no figures (a report from before they were sampled)."""
    if not runs or not all(runs.values()):
        return []
    return [
        "Where the CPU went: CPU seconds by component while the platform ran (sampled from "
        "/proc every 2 s; a process living shorter than that, or the last interval of one "
        "that exits, is missed).",
        "",
        *cpu_account.markdown_rows(runs),
        "",
    ]


def _mix_words(mix: Mapping[str, float] | None) -> str:
    """What the schedule was drawn from, in words (a fixed schedule records None; facts
    without the key are of a run that drew from the default mix)."""
    same = ("The same schedule against a plain JobSet: goodput-comparison.md "
            "(`bench.goodput_baseline`).")  # fmt: skip
    if mix is None:
        return f"A fixed schedule (no mix drawn from). {same}"
    if dict(mix) == dict(DEFAULT_MIX):
        return ("The default mix (`bench.soak_schedule.DEFAULT_MIX`): every fault class the "
                "operator handles but silent data corruption, a Kueue preemption included (an "
                "urgent workload of a higher WorkloadPriorityClass needing the ClusterQueue's "
                f"whole quota: Kueue evicts the job's Workload). {same}")  # fmt: skip
    weights = ", ".join(f"{kind} {weight:g}" for kind, weight in mix.items())
    return f"The mix drawn from (`--mix`): {weights}. {same}"
