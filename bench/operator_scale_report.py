"""What one run of `bench.operator_scale` found, and how it is printed: the per-fault
records (each recovery's stages as the watches saw them), each phase's figures with their
targets, and the operator and JobSet side by side."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from bench.scale_probes import percentile

BACKOFF_SECONDS = 1
"""The RTJs' restart back-off (spec.failurePolicy.backoff), taken off the operator's recovery."""
INJECTOR_REQUESTS_PER_FAULT = 3  # ignore-in-KWOK patch, pod GET, pod status PATCH
QUIET_SECONDS = 8.0


@dataclass
class Figure:
    name: str
    value: float
    unit: str
    target: str = ""
    ok: bool | None = None
    detail: str = ""

    def line(self) -> str:
        verdict = "info" if self.ok is None else ("PASS" if self.ok else "MISS")
        head = f"{self.name:<52} {self.value:>9.3f} {self.unit:<5}"
        return f"{head} target {self.target or '-':<9} {verdict:<4}  {self.detail}"


@dataclass
class FaultRecord:
    job: str
    pod: str
    rank: int
    node: str | None
    scheduled: float = 0.0  # seconds after the first fault's slot
    failed_at: float = 0.0  # time.time() when the Failed status was written
    finished_at: str = ""
    # stages, in seconds after failed_at, as the watches saw them
    detected: float | None = None  # RTJ: classified record; JobSet: status.restarts = 1
    old_pods_deleting: float | None = None  # every pod of the first world being deleted
    old_pods_gone: float | None = None  # every pod of the first world deleted
    old_jobset_gone: float | None = None  # RTJ: <job>-a1 deleted
    next_created: float | None = None  # RTJ: <job>-a2 created
    admitted: float | None = None  # RTJ: <job>-a2 unsuspended by Kueue
    new_pod_seen: float | None = None  # the first pod of the next world created
    recovered: float | None = None  # every pod of the next world Running
    failure_class: str | None = None
    operator_detection: float | None = None  # the record's detectionSeconds
    operator_recovery: float | None = None  # the record's recoverySeconds (-> JobSet created)


@dataclass
class Phase:
    label: str
    kind: str  # "rtj" | "jobset"
    startup_seconds: float = 0.0
    faults: list[FaultRecord] = field(default_factory=list)
    window_seconds: float = 0.0
    quiet_rate: float = 0.0
    cluster_requests: int = 0
    cluster_top: list[tuple[str, int]] = field(default_factory=list)
    operator_requests: int = 0
    operator_lease_requests: int = 0
    operator_top: list[tuple[str, int]] = field(default_factory=list)
    operator_quiet_requests: int = 0
    operator_reconciles: int = 0
    progress_answered: int = 0
    """Progress reads `bench.sidecar_sim` answered in the fault window (--progress answered)."""
    namespace_events: int = 0
    """Events in the jobs' namespace when the faults began (each failure's Event reads by
    name scan them all on the API server)."""
    event_lists: int = 0
    event_list_seconds: float = 0.0
    """LISTs of Events the API server answered in the fault window, every client, and the
    seconds it spent on them (`apiserver_request_duration_seconds`)."""
    cpu_window: dict[str, float] = field(default_factory=dict)
    cpu_quiet: dict[str, float] = field(default_factory=dict)
    operator_cpu_total: float = 0.0
    rss_steady: float = 0.0
    rss_peak: float = 0.0
    problems: list[str] = field(default_factory=list)
    watch_errors: int = 0

    @property
    def detection(self) -> list[float]:
        return [f.detected for f in self.faults if f.detected is not None]

    @property
    def recovery(self) -> list[float]:
        return [f.recovered for f in self.faults if f.recovered is not None]

    @property
    def backoff(self) -> float:
        return BACKOFF_SECONDS if self.kind == "rtj" else 0.0

    def requests_per_recovery(self, corrected: bool = True) -> float:
        n = max(len(self.faults), 1)
        total = float(self.cluster_requests) - INJECTOR_REQUESTS_PER_FAULT * len(self.faults)
        if corrected:
            total -= self.quiet_rate * self.window_seconds
        return total / n


STAGES = {
    "rtj": (
        ("detected", "detect"), ("old_pods_deleting", "old del"), ("old_pods_gone", "old pods"),
        ("old_jobset_gone", "old JS"),
        ("next_created", "next JS"), ("admitted", "admitted"), ("new_pod_seen", "1st pod"),
        ("recovered", "all run"),
    ),
    "jobset": (
        ("detected", "restart"), ("old_pods_deleting", "old del"), ("old_pods_gone", "old pods"),
        ("new_pod_seen", "1st pod"),
        ("recovered", "all run"),
    ),
}  # fmt: skip
"""Per fault, seconds after the Failed status, in the order a recovery passes them."""


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def fault_table(phase: Phase) -> list[str]:
    """One line per fault: its stages (seconds after Failed), then the operator's own."""
    rtj = phase.kind == "rtj"
    stages = STAGES[phase.kind]
    head = f"   {'job':<5} {'rank':>4} {'node':<12}" + "".join(f" {t:>8}" for _, t in stages)
    if rtj:
        head += f" {'op det':>7} {'op rec':>7} class"
    lines = [head]
    for f in sorted(phase.faults, key=lambda f: f.scheduled):
        line = f"   {f.job:<5} {f.rank:>4} {f.node or '?':<12}"
        line += "".join(f" {_s(getattr(f, key)):>8}" for key, _ in stages)
        if rtj:
            line += f" {_s(f.operator_detection):>7} {_s(f.operator_recovery):>7}"
            line += f" {f.failure_class}"
        lines.append(line)
    for q, name in ((0.5, "p50"), (0.95, "p95")):
        line = f"   {name:<23}"
        for key, _ in stages:
            values = [getattr(f, key) for f in phase.faults if getattr(f, key) is not None]
            line += f" {_s(percentile(values, q) if values else None):>8}"
        lines.append(line)
    return lines


def phase_figures(p: Phase, args: argparse.Namespace) -> list[Figure]:
    rtj = p.kind == "rtj"
    n = len(p.faults)
    tag = "RTJ" if rtj else "JobSet"
    det, rec = p.detection, p.recovery
    net = [r - p.backoff for r in rec]
    figures = [
        Figure(f"{tag}: startup, {args.jobs} groups created -> all pods Running",
               p.startup_seconds, "s", detail=f"{args.jobs * args.workers} pods"),
        Figure(f"{tag}: detection p50", percentile(det, 0.5), "s", "< 2 s" if rtj else "",
               percentile(det, 0.5) < 2 if rtj else None,
               "Failed -> classified record" if rtj else "Failed -> JobSet status.restarts=1"),
        Figure(f"{tag}: detection p95", percentile(det, 0.95), "s", "< 2 s" if rtj else "",
               percentile(det, 0.95) < 2 if rtj else None, f"max {max(det, default=0):.3f}s, "
               f"{len(det)}/{n} detected"),
        Figure(f"{tag}: recovery p50 (Failed -> all new pods Running)", percentile(rec, 0.5),
               "s", detail=f"includes backoff {p.backoff:.0f}s"),
        Figure(f"{tag}: recovery p95", percentile(rec, 0.95), "s",
               f"< {10 + p.backoff:.0f} s" if rtj else "",
               percentile(rec, 0.95) < 10 + p.backoff if rtj else None,
               f"max {max(rec, default=0):.3f}s, {len(rec)}/{n} recovered"),
    ]  # fmt: skip
    if rtj:
        figures += [
            Figure("RTJ: recovery - backoff p50", percentile(net, 0.5), "s"),
            Figure("RTJ: recovery - backoff p95", percentile(net, 0.95), "s", "< 10 s",
                   percentile(net, 0.95) < 10),
        ]  # fmt: skip
        nxt = [f.next_created for f in p.faults if f.next_created is not None]
        opd = [f.operator_detection for f in p.faults if f.operator_detection is not None]
        opr = [f.operator_recovery for f in p.faults if f.operator_recovery is not None]
        figures += [
            Figure("RTJ: Failed -> next JobSet created p50 / p95",
                   percentile(nxt, 0.5), "s", detail=f"p95 {percentile(nxt, 0.95):.3f}s "
                   f"(backoff {BACKOFF_SECONDS}s + converge included)"),
            Figure("RTJ: operator's own detectionSeconds p50 / p95", percentile(opd, 0.5), "s",
                   detail=f"p95 {percentile(opd, 0.95):.3f}s (from finishedAt, whole seconds: "
                   "up to 1 s more)"),
            Figure("RTJ: operator's own recoverySeconds p50 / p95", percentile(opr, 0.5), "s",
                   detail=f"p95 {percentile(opr, 0.95):.3f}s (finishedAt -> next JobSet)"),
        ]  # fmt: skip
    figures += [
        Figure(f"{tag}: API requests per recovery, all clients", p.requests_per_recovery(), "req",
               detail=f"{p.cluster_requests} in {p.window_seconds:.1f}s less background "
               f"{p.quiet_rate:.1f}/s and injector {INJECTOR_REQUESTS_PER_FAULT}/fault; raw "
               f"{p.requests_per_recovery(corrected=False):.0f}/recovery"),
    ]  # fmt: skip
    op_cpu = p.cpu_window.get("operator", 0.0)
    if rtj:
        figures += [
            Figure("RTJ: operator's own API requests per recovery",
                   p.operator_requests / max(n, 1), "req",
                   detail=f"{p.operator_requests} in the window, + {p.operator_lease_requests} "
                   f"lease renewals; {p.operator_quiet_requests} in {QUIET_SECONDS:.0f}s quiet"),
            Figure("RTJ: operator CPU in the fault window", op_cpu, "cpu-s",
                   detail=f"{100 * op_cpu / max(p.window_seconds, 1e-9):.0f}% of a core over "
                   f"{p.window_seconds:.1f}s; quiet "
                   f"{100 * p.cpu_quiet.get('operator', 0.0) / QUIET_SECONDS:.1f}%"),
            Figure("RTJ: operator CPU per recovery, less its quiet rate",
                   max(op_cpu - p.cpu_quiet.get("operator", 0.0) / QUIET_SECONDS
                       * p.window_seconds, 0.0) / max(n, 1), "cpu-s",
                   detail="the fault window's CPU less the quiet window's rate over it "
                   "(node leases, polls, lease renewals)"),
            Figure("RTJ: operator CPU total (start -> end of window)", p.operator_cpu_total,
                   "cpu-s", detail=f"includes starting {args.jobs} jobs"),
            Figure("RTJ: operator RSS steady", p.rss_steady, "MiB",
                   detail=f"{args.jobs} RTJs, {args.jobs * args.workers} pods"),
            Figure("RTJ: operator RSS peak", p.rss_peak, "MiB"),
            Figure("RTJ: lost or duplicate attempts (problems found)", len(p.problems), "",
                   "= 0", not p.problems, "; ".join(p.problems[:3])),
        ]  # fmt: skip
    else:
        figures.append(
            Figure(
                "JobSet: wrong restart counts or pods (problems found)",
                len(p.problems),
                "",
                detail="; ".join(p.problems[:3]),
            )
        )
    if p.cpu_window:
        by_cpu = sorted(p.cpu_window.items(), key=lambda x: -x[1])
        parts = ", ".join(f"{k} {v:.2f}" for k, v in by_cpu)
        figures.append(Figure(f"{tag}: CPU seconds in the window by process",
                              sum(p.cpu_window.values()), "cpu-s", detail=parts))  # fmt: skip
    return figures


def comparison(rtj: Phase, js: Phase) -> list[tuple[str, float, float]]:
    def q(values: list[float], x: float) -> float:
        return percentile(values, x)

    rows = [
        ("detection p50 (s)", q(rtj.detection, 0.5), q(js.detection, 0.5)),
        ("detection p95 (s)", q(rtj.detection, 0.95), q(js.detection, 0.95)),
        ("recovery p50 (s)", q(rtj.recovery, 0.5), q(js.recovery, 0.5)),
        ("recovery p95 (s)", q(rtj.recovery, 0.95), q(js.recovery, 0.95)),
        ("recovery - backoff p50 (s)", q([r - rtj.backoff for r in rtj.recovery], 0.5),
         q(js.recovery, 0.5)),
        ("recovery - backoff p95 (s)", q([r - rtj.backoff for r in rtj.recovery], 0.95),
         q(js.recovery, 0.95)),
        ("API requests / recovery, all clients", rtj.requests_per_recovery(),
         js.requests_per_recovery()),
        ("  same, without background correction", rtj.requests_per_recovery(False),
         js.requests_per_recovery(False)),
        ("controller CPU-s in window (operator | jobset)", rtj.cpu_window.get("operator", 0.0)
         + rtj.cpu_window.get("jobset", 0.0), js.cpu_window.get("jobset", 0.0)),
        ("all-process CPU-s in window", sum(rtj.cpu_window.values()),
         sum(js.cpu_window.values())),
        ("window seconds", rtj.window_seconds, js.window_seconds),
    ]  # fmt: skip
    return rows


def comparison_lines(rows: list[tuple[str, float, float]], js_label: str) -> list[str]:
    out = [f"{'':<48} {'RTJ operator':>13} {js_label[:24]:>24} {'RTJ/JobSet':>10}"]
    for name, a, b in rows:
        ratio = f"{a / b:.2f}x" if b else "-"
        out.append(f"{name:<48} {a:>13.3f} {b:>24.3f} {ratio:>10}")
    return out
