"""Hangs and timeouts from the ranks' progress reports. Pure.

Input: what each pod's ``rtj-shim progress-server`` answered to ``GET /progress`` (schema
1, rtj_shim.agent.progress_server), wrapped in a :class:`PodReport` with the time the operator
received it, on one clock the caller chooses (``time.monotonic()``), and ``now`` on that
clock. Each rank's "in its section since" is placed on that clock
(``received_at - seconds_in_section``), so ranks of different pods, polled at different
moments, compare correctly; a report older than ``max_report_age`` is no evidence, and so
is one holding a value no sidecar writes (:func:`read_report`, the one check of every value
read from a report: `policy.report_values`).

* :func:`hang_verdict`: the job is hung when the rank *furthest behind* (lowest step; then
  the earliest phase of the step when every such rank is in a known phase; then the one
  longest in its section) has been in its section longer than that section's allowance.
  The ranks ahead of it are waiting for it (in a collective): their own long waits are
  consequences, never the verdict. When no rank is ahead (same step, same section,
  entered within ``same_time_s``), the verdict says all ranks are equally stuck.
* :func:`auto_timeout`: allowances derived from observed step and save durations.
* :func:`job_progress`: the step every rank completed and the step time, for the status.

Stragglers, over the same parsed reports, are `policy.stragglers`.

Every function returns frozen data and explains itself in its result; none mutates input.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rtj_operator.policy import report_values as v

SCHEMA = 1
START_SECTIONS = frozenset({"start", "restore"})  # allowance: the start-up grace
CHECKPOINT = "checkpoint"
PHASES: Mapping[str, int] = {  # order inside one step, after step N completed
    "checkpoint": 0,  # the save at the boundary of step N comes first
    "data": 1,
    "forward": 2,
    "backward": 3,
    "allreduce": 4,
    "optimizer": 5,
}
# the sections a rank waits in for the others (rtj_shim.progress.WAITING_SECTIONS, its
# default): at one step, a rank in one of them is ahead of a rank working in any other
WAITING_SECTIONS = frozenset({"allreduce", "barrier", "collective", "wait", "sync"})
# a record this old when read, while another rank's shows a pulse: its process does not
# run (the shim pulses every second from a thread, even while the training thread waits)
SILENT_SECONDS = 5.0
# a record refreshed this long after its rank entered its section shows a pulse (entering
# a section or completing a step restarts that clock; only a pulse or a heartbeat does not)
PULSE_PROOF_SECONDS = 2.0
DEFAULT_MAX_REPORT_AGE = 30.0
DEFAULT_SAME_TIME = 1.0


@dataclass(frozen=True)
class PodReport:
    """One pod's ``GET /progress`` body and when it was received (caller's clock, s)."""

    pod: str
    received_at: float
    body: Mapping[str, Any]


@dataclass(frozen=True)
class RankProgress:
    """One rank as a decision sees it; times in seconds on the caller's clock."""

    pod: str
    rank: int
    step: int | None
    steps_completed: int
    section: str
    section_since: float
    received_at: float
    exited: bool = False
    median_step: float | None = None
    median_busy: float | None = None
    recent_steps: tuple[float, ...] = ()
    max_checkpoint: float | None = None
    since_update: float | None = None  # the record's age when read (seconds)

    def in_section(self, now: float) -> float:
        return max(0.0, now - self.section_since)

    def silent(self) -> bool:
        """Its record was SILENT_SECONDS old when read (the report's own age aside: a
        report kept from an earlier poll says nothing about silence since)."""
        return self.since_update is not None and self.since_update > SILENT_SECONDS

    def pulses(self) -> bool:
        """Its record was refreshed while it sat in its section, and recently: its process
        runs (a pulse; without one, a record is only written on a change)."""
        if self.since_update is None or self.silent():
            return False
        in_section_at_read = self.received_at - self.section_since
        return in_section_at_read - self.since_update > PULSE_PROOF_SECONDS

    def behind_key(self) -> tuple[int, float]:
        return (-1 if self.step is None else self.step, self.section_since)


@dataclass(frozen=True)
class Parsed:
    ranks: tuple[RankProgress, ...]
    problems: tuple[str, ...]
    bad_pods: tuple[str, ...]


def _rank(pod: PodReport, entry: Any) -> RankProgress | str:
    """One rank entry, every value checked (`report_values`); a string where the entry is
    not a rank yet (no section timing: its record holds none). A value no sidecar writes
    raises BadValue: the whole report is no report."""
    if not isinstance(entry, Mapping):
        raise v.BadValue("a rank entry is not an object")
    rank = v.integer(entry, "rank")
    if rank is None:
        raise v.BadValue("a rank entry without a rank")
    step = v.integer(entry, "step")
    section = v.text(entry, "section", v.MAX_SECTION)
    in_section = v.seconds(entry, "seconds_in_section")
    state = v.text(entry, "state")
    progress = RankProgress(
        pod=pod.pod,
        rank=rank,
        step=step,
        steps_completed=v.integer(entry, "steps_completed", default=0) or 0,
        section=section or "",
        section_since=pod.received_at - (in_section or 0.0),
        received_at=pod.received_at,
        exited=state == "exited",
        median_step=v.seconds(entry, "median_step_seconds"),
        median_busy=v.seconds(entry, "median_busy_seconds"),
        recent_steps=v.seconds_list(entry, "recent_step_seconds", v.MAX_RECENT_STEPS),
        max_checkpoint=v.seconds(entry, "max_checkpoint_seconds"),
        since_update=v.seconds(entry, "seconds_since_update"),
    )
    if in_section is None or section is None:
        return f"{pod.pod}: rank {rank} without section timing"
    return progress


_last_parsed: tuple[tuple[PodReport, ...], float, float, Parsed] | None = None
"""The last parse of a tuple of reports: one plan asks for the same reports at the same
`now` several times (the hang timeouts, the hang verdict, the stragglers, the summary), each
~1/10 s at 1,250 pods. Kept only for a tuple (immutable), by identity."""


def parse_reports(
    reports: Sequence[PodReport], now: float, max_report_age: float = DEFAULT_MAX_REPORT_AGE
) -> Parsed:
    """The ranks of the fresh, well-formed reports. A rank reported by two pods (a stale
    file of an earlier placement) keeps the newer report, then the one with more steps."""
    global _last_parsed
    last = _last_parsed
    if last is not None and last[0] is reports and last[1:3] == (now, max_report_age):
        return last[3]
    parsed = _parse_reports(reports, now, max_report_age)
    if isinstance(reports, tuple):
        _last_parsed = (reports, now, max_report_age, parsed)
    return parsed


def _parse_reports(reports: Sequence[PodReport], now: float, max_report_age: float) -> Parsed:
    found: dict[int, RankProgress] = {}
    problems: list[str] = []
    bad: list[str] = []
    for pod in reports:
        if now - pod.received_at > max_report_age:
            bad.append(pod.pod)
            problems.append(f"{pod.pod}: report is {now - pod.received_at:.0f}s old")
            continue
        read = read_report(pod)
        if read.problem is not None:
            bad.append(pod.pod)
            problems.append(f"{pod.pod}: {read.problem}")
            continue
        for rank in read.entries:
            if isinstance(rank, str):
                problems.append(rank)
                continue
            seen = found.get(rank.rank)
            if seen is not None:
                problems.append(f"rank {rank.rank} reported by {seen.pod} and {rank.pod}")
                newer = (rank.received_at, rank.steps_completed)
                if newer <= (seen.received_at, seen.steps_completed):
                    continue
            found[rank.rank] = rank
    ranks = tuple(sorted(found.values(), key=lambda r: r.rank))
    return Parsed(ranks, tuple(problems), tuple(bad))


@dataclass(frozen=True)
class ReadReport:
    """A pod's report as read: its rank entries (each a rank, or why it is not one yet), or
    the problem that makes it no report at all."""

    entries: tuple[RankProgress | str, ...]
    problem: str | None = None


READ_PARTS = ("supervisor", "fast_tier", "replica", "drain")
"""The parts of a report other than its ranks that the operator reads (`rank_polls`), as
plain JSON: checked by `report_values.plain`."""
_read_reports: dict[str, tuple[PodReport, ReadReport]] = {}
"""Per pod, its last report as read: a poll round's report is checked by the poller and
parsed by the stragglers' window, the plan and the metrics, each at its own `now` (which
decides only whether the whole report is fresh). One entry per pod name, replaced by its
next report (the report is held, as the poller's reading holds it anyway)."""
READ_ENTRIES_LIMIT = 65536
"""Past this many pod names (pods gone since), the entries start again."""


def read_report(pod: PodReport) -> ReadReport:
    """The report read, every value the operator uses checked, once per report: the one
    place a pod's progress report becomes the operator's view (`report_values`)."""
    held = _read_reports.get(pod.pod)
    if held is not None and held[0] is pod:
        return held[1]
    read = _read(pod)
    if len(_read_reports) >= READ_ENTRIES_LIMIT:
        _read_reports.clear()
    _read_reports[pod.pod] = (pod, read)
    return read


def report_problem(pod: PodReport) -> str | None:
    """Why the pod's report is no report (a bad answer of that pod), or None; the pod's
    name is the caller's to add."""
    return read_report(pod).problem


def _read(pod: PodReport) -> ReadReport:
    body = pod.body
    if body.get("schema") != SCHEMA:
        return ReadReport((), f"not a schema {SCHEMA} progress report")
    try:
        entries = tuple(_rank(pod, e) for e in v.items(body, "ranks", v.MAX_RANKS))
        for part in READ_PARTS:
            v.plain(body.get(part), part)
    except v.BadValue as exc:
        return ReadReport((), f"a bad progress report: {exc}")
    return ReadReport(entries)


# ---------------------------------------------------------------------- timeouts


@dataclass(frozen=True)
class Timeouts:
    """How long a rank may stay in one section: ``checkpoint`` in a save, ``startup`` in
    ``start``/``restore`` (before its first step), ``step`` anywhere else."""

    step: float
    checkpoint: float
    startup: float
    reason: str = ""

    @classmethod
    def fixed(cls, seconds: float, *, startup: float | None = None) -> Timeouts:
        """One timeout for everything (``hangTimeoutSeconds``), start-up included unless
        ``startup`` is given."""
        return cls(seconds, seconds, seconds if startup is None else startup, f"fixed {seconds}s")

    def for_section(self, section: str) -> float:
        if section == CHECKPOINT:
            return self.checkpoint
        if section in START_SECTIONS:
            return max(self.step, self.startup)
        return self.step


def auto_timeout(
    reports: Sequence[PodReport],
    factor: float = 5.0,
    floor: float = 30.0,
    startup_grace: float = 600.0,
    *,
    now: float,
    warmup_steps: int = 3,
    first_save_grace: float | None = None,
    max_report_age: float = DEFAULT_MAX_REPORT_AGE,
) -> Timeouts:
    """Allowances from what the ranks observed (the last steps each rank keeps):

    * step: ``factor`` x the median step time, never below ``floor`` nor the longest
      recent step; until every running rank has ``warmup_steps`` step durations (a fresh
      start, a restart: compilation, data loading, restore), at least ``startup_grace``;
    * checkpoint: ``factor`` x the longest save observed, never below the step allowance;
      before any save completed, at least ``first_save_grace`` (default: the start-up grace);
    * startup (``start``, ``restore``): ``startup_grace``.
    """
    ranks = [r for r in parse_reports(reports, now, max_report_age).ranks if not r.exited]
    pooled = [s for r in ranks for s in r.recent_steps]
    warm = bool(ranks) and all(len(r.recent_steps) >= warmup_steps for r in ranks)
    median = statistics.median(pooled) if pooled else None
    step = max(floor, factor * median if median else 0.0, max(pooled, default=0.0))
    why = [f"step: {factor} x median {median:.3g}s" if median else "step: no steps yet"]
    if not warm:
        step = max(step, startup_grace)
        why.append(f"start-up grace {startup_grace}s (ranks with < {warmup_steps} steps)")
    saves = [r.max_checkpoint for r in ranks if r.max_checkpoint]
    if saves:
        checkpoint = max(step, factor * max(saves))
        why.append(f"checkpoint: {factor} x longest save {max(saves):.3g}s")
    else:
        grace = startup_grace if first_save_grace is None else first_save_grace
        checkpoint = max(step, grace)
        why.append(f"checkpoint: no save yet, grace {grace}s")
    why.append(f"floor {floor}s")
    return Timeouts(step, checkpoint, max(step, startup_grace), "; ".join(why))


# ---------------------------------------------------------------------- hangs


@dataclass(frozen=True)
class Hang:
    """The job is hung: ``rank`` (in ``pod``) has been in ``section`` of the step after
    ``step`` for ``seconds``, beyond its ``timeout``."""

    rank: int
    pod: str
    step: int | None
    section: str
    seconds: float
    timeout: float
    all_ranks_equally_stuck: bool
    ranks: int
    ahead: tuple[int, ...] = ()  # ranks past the culprit (a higher step or a later section)
    unreported_pods: tuple[str, ...] = ()
    message: str = ""


def _furthest_behind(ranks: Sequence[RankProgress]) -> RankProgress:
    """Of the ranks at the lowest step, the one not waiting for the others: a silent one
    while another pulses (its process does not run: SIGSTOP, the kernel, a stuck
    interpreter), whatever its section; then one working rather than in a waiting section;
    then the earliest phase of the step, else (user sections) the one longest in its
    section. Silence comes first: a rank stopped in ``barrier`` after the barrier was
    released (its record still says so) while the rank it released waits in ``backward``
    for it (the flake of CI stop 55: the working filter blamed rank 0). A waiting
    rank entered its wait before the frozen rank entered the section it froze in whenever
    it finished the previous step first (rank 0 in the next step's ``barrier``, rank 1
    stopped in the ``step`` between two steps); and in ``backward`` both sit in the same
    section (DDP's allreduce runs inside it): only the pulse tells them apart there.
    Without a rank that shows a pulse, silence tells nothing (every record of a rank
    stuck in a section is as old as its entry) and is not used."""
    lowest = min(r.behind_key()[0] for r in ranks)
    at_lowest = [r for r in ranks if r.behind_key()[0] == lowest]
    silent = [r for r in at_lowest if r.silent()]
    if silent and any(r.pulses() for r in at_lowest):
        at_lowest = silent
    working = [r for r in at_lowest if r.section not in WAITING_SECTIONS]
    at_lowest = working or at_lowest
    if all(r.section in PHASES for r in at_lowest):
        return min(at_lowest, key=lambda r: (PHASES[r.section], r.section_since, r.rank))
    return min(at_lowest, key=lambda r: (r.section_since, r.rank))


def _step_text(step: int | None) -> str:
    return "before its first step" if step is None else f"of step {step + 1}"


def hang_verdict(
    reports: Sequence[PodReport],
    timeout: float | Timeouts,
    now: float,
    *,
    max_report_age: float = DEFAULT_MAX_REPORT_AGE,
    same_time_s: float = DEFAULT_SAME_TIME,
) -> Hang | None:
    """None, or the Hang: the rank furthest behind has been in its section longer than
    the allowance for that section. Ranks that exited are not considered; pods without a
    fresh valid report are named (the culprit may be there) and make "all ranks equally
    stuck" impossible to claim."""
    limits = timeout if isinstance(timeout, Timeouts) else Timeouts.fixed(timeout)
    parsed = parse_reports(reports, now, max_report_age)
    running = [r for r in parsed.ranks if not r.exited]
    if not running:
        return None
    culprit = _furthest_behind(running)
    stuck_for = culprit.in_section(now)
    allowance = limits.for_section(culprit.section)
    if stuck_for <= allowance:
        return None
    # silent while another rank pulses: its process does not run (without pulses, every
    # rank stuck in a section is "silent", which tells nothing)
    silent = culprit.silent() and any(r.pulses() for r in running if r is not culprit)
    ahead = tuple(
        r.rank
        for r in running
        if r is not culprit
        and (
            r.behind_key()[0] > culprit.behind_key()[0]
            or r.section != culprit.section
            or r.section_since - culprit.section_since > same_time_s
            or (silent and r.pulses())
        )
    )
    equal = not ahead and not parsed.bad_pods and len(running) > 1
    where = f"'{culprit.section}' {_step_text(culprit.step)}"
    if equal:
        message = (
            f"all {len(running)} ranks equally stuck in {where} for {stuck_for:.0f}s "
            f"(> {allowance:.0f}s): none is ahead; rank {culprit.rank} entered first"
        )
    else:
        message = (
            f"rank {culprit.rank} ({culprit.pod}) has been in {where} for "
            f"{stuck_for:.0f}s (> {allowance:.0f}s)"
        )
        if silent and culprit.since_update is not None:
            quiet = culprit.since_update + max(0.0, now - culprit.received_at)
            message += f", silent for {quiet:.0f}s (its process does not run)"
        if ahead:
            message += f"; {len(ahead)} rank(s) ahead of it wait"
    if parsed.bad_pods:
        message += f"; no fresh report from {', '.join(parsed.bad_pods)} (the culprit may be there)"
    return Hang(
        rank=culprit.rank,
        pod=culprit.pod,
        step=culprit.step,
        section=culprit.section,
        seconds=stuck_for,
        timeout=allowance,
        all_ranks_equally_stuck=equal,
        ranks=len(running),
        ahead=ahead,
        unreported_pods=parsed.bad_pods,
        message=message,
    )


# ---------------------------------------------------------------------- job summary


@dataclass(frozen=True)
class JobProgress:
    """What the job's status can show: the step every rank completed, the step time."""

    step: int | None
    median_step_seconds: float | None
    steps_per_second: float | None
    ranks: int


def job_progress(
    reports: Sequence[PodReport], now: float, max_report_age: float = DEFAULT_MAX_REPORT_AGE
) -> JobProgress:
    running = [r for r in parse_reports(reports, now, max_report_age).ranks if not r.exited]
    steps = [r.step for r in running if r.step is not None]
    durations = [r.median_step for r in running if r.median_step]
    median = statistics.median(durations) if durations else None
    return JobProgress(
        step=min(steps) if steps and len(steps) == len(running) else None,
        median_step_seconds=median,
        steps_per_second=1.0 / median if median else None,
        ranks=len(running),
    )
