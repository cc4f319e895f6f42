"""bench.checkpoint_protocol's results: a row per check against its baseline and target, the
notes, and the table they make, printed and as Markdown."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from bench.common import GiB, MiB


@dataclass
class Row:
    section: str
    check: str
    candidate: str
    baseline: str
    ratio: float | None
    ratio_means: str  # "time" (candidate/baseline, lower is better), "speed-up", "RSS"
    target: str
    passed: bool | None  # None: reported only, no target
    values: dict[str, Any] = field(default_factory=dict)
    load: float = field(default_factory=lambda: os.getloadavg()[0])  # 1-min, when measured

    @property
    def verdict(self) -> str:
        return {True: "PASS", False: "MISS", None: "info"}[self.passed]


@dataclass
class Report:
    context: dict[str, Any] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)
    samples: dict[str, list[float]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    busy: set[str] = field(default_factory=set)  # sections timed while the machine was busy

    def result(self, row: Row) -> str:
        key = row.values.get("busy_key") or row.section.split()[-1]
        busy = row.passed is not None and key in self.busy
        return row.verdict + ("*" if busy else "")

    def add(self, row: Row) -> None:
        self.rows.append(row)
        ratio = f"{row.ratio:.2f}x {row.ratio_means}" if row.ratio is not None else "-"
        print(
            f"  -> {row.check}: {row.candidate} vs {row.baseline}: {ratio}; {row.verdict} "
            f"(load {row.load:.2f})"
        )

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"  note: {text}")


def fmt_s(seconds: float, nbytes: int | None = None) -> str:
    text = f"{seconds:.3f} s"
    if nbytes:
        text += f" ({nbytes / GiB / seconds:.2f} GiB/s)"
    return text


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def fmt_size(nbytes: int) -> str:
    return f"{nbytes / GiB:g} GiB" if nbytes >= GiB else f"{nbytes / MiB:g} MiB"


def cells(report: Report, r: Row) -> list[str]:
    ratio = f"{r.ratio:.2f}x {r.ratio_means}" if r.ratio is not None else "-"
    return [
        r.section,
        r.check,
        r.candidate,
        r.baseline,
        ratio,
        r.target,
        report.result(r),
        f"{r.load:.2f}",
    ]


HEADERS = ["#", "check", "candidate", "baseline", "ratio", "target", "result", "load"]


def print_table(report: Report) -> None:
    rows = [cells(report, r) for r in report.rows]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(HEADERS)]
    line = "  ".join("-" * w for w in widths)
    print("\nResults (medians; ratio 'time' = candidate/baseline, 'speed-up' = baseline/candidate;")
    print("load = 1-minute load average when the row was measured)")
    print(line)
    print("  ".join(h.ljust(w) for h, w in zip(HEADERS, widths, strict=True)).rstrip())
    print(line)
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    print(line)
    if report.busy:
        print("* timed while other work kept the machine busy (see the notes): not conclusive")
    for text in report.notes:
        print(f"note: {text}")


def markdown(report: Report) -> str:
    ctx = report.context
    fs = ctx.get("filesystem", {})
    out = [
        "# Checkpoint protocol benchmark",
        "",
        f"`python -m bench.checkpoint_protocol` on {ctx.get('cpu_count')} CPUs "
        f"({ctx.get('cpu_model')}, sha_ni={'yes' if ctx.get('sha_ni') else 'no'}), "
        f"{ctx.get('mem_total_gib')} GiB, {fs.get('fstype')} on {fs.get('device')}, "
        f"{ctx.get('python')}, Linux {ctx.get('kernel')}.",
        f"Load average at start {fmt_load(ctx.get('loadavg_start'))}, "
        f"at end {fmt_load(ctx.get('loadavg_end'))}.",
        "",
        "| " + " | ".join(HEADERS) + " |",
        "|" + "---|" * len(HEADERS),
    ]
    for r in report.rows:
        out.append("| " + " | ".join(c.replace("|", "/") for c in cells(report, r)) + " |")
    out.append("")
    out.extend(f"- {text}" for text in report.notes)
    return "\n".join(out).rstrip() + "\n"


def fmt_load(values: Any) -> str:
    return " ".join(f"{x:.2f}" for x in values) if values else "?"
