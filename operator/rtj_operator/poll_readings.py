"""One job's reading from a progress-poll round (`rank_polls`): which pods answered with
a usable report, which did not and since when, and the parts of their reports the plan
reads (supervisors, fast tiers, peer replicas, drains), with the straggler verdict.
Pure: the poller gathers the answers and keeps what this returns.

Every value read from a report is checked once, here (`policy.progress.report_problem`): a
bad report is that pod's bad answer. A pod that did not answer this round keeps its last
report (it ages out of the evidence by itself), and a `rested` pod (not asked this round:
it answered less than RESTING_SECONDS ago, was just given its order, or its job's time
budget left it out) keeps its last report as an answer.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from rtj_operator.policy import progress as rank_progress
from rtj_operator.policy import stragglers as rank_stragglers
from rtj_operator.reconcile.world import PollTarget, RankReadings
from rtj_shim.wire.supervisor_report import SupervisorReport, SupervisorReportError

log = logging.getLogger("rtj_operator.rank_polls")

Key = tuple[str, str]
Answers = Mapping[tuple[Key, int, str], tuple[Any, "str | None", float]]


def reading_of(
    key: Key,
    targets: Sequence[PollTarget],
    answers: Answers,
    received: float,
    rested: Collection[tuple[Key, int, str]],
    held: RankReadings | None,
    state: rank_stragglers.StragglerState | None,
    quiet: Mapping[str, float],
    straggler_ratio: float = 0.7,
    straggler_windows: int = 3,
) -> tuple[RankReadings, rank_stragglers.StragglerState]:
    """The job's reading, and its straggler state for the next round. `held` is its last
    reading, `state` the straggler state kept with it; `quiet` names, per pod not answering,
    when the first of its unanswered polls went out."""
    attempt = targets[0].attempt if targets else 0
    previous = {r.pod: r for r in held.reports} if held and held.attempt == attempt else {}
    reports: list[rank_progress.PodReport] = []
    unanswered: list[str] = []
    quiet_since: dict[str, float] = {}
    supervisors: dict[str, SupervisorReport] = {}
    fast_tiers: dict[str, Mapping[str, Any] | None] = {}
    replicas: dict[str, Mapping[str, Any] | None] = {}
    drains: dict[str, Mapping[str, Any] | None] = {}
    kept_parts = (("fast_tier", fast_tiers), ("replica", replicas), ("drain", drains))
    for target in targets:
        ident = (key, target.attempt, target.pod)
        last = previous.get(target.pod)
        if ident in rested:
            if last is None:
                continue  # not read this round, and nothing heard from it before
            body, error, arrived = last.body, None, last.received_at
        else:
            body, error, arrived = answers.get(
                ident, (None, "not asked this round (did not answer)", received)
            )
        if isinstance(body, Mapping):
            report = rank_progress.PodReport(target.pod, arrived, body)
            # every value read from it checked once, here: a bad report is a bad answer
            error = rank_progress.report_problem(report)
            supervisor: SupervisorReport | None = None
            if error is None and body.get("supervisor") is not None:
                try:
                    supervisor = SupervisorReport.parse(body["supervisor"])
                except SupervisorReportError as exc:
                    error = str(exc)
            if error is None:
                reports.append(report)
                if supervisor is not None:
                    supervisors[target.pod] = supervisor
                for name, kept in kept_parts:
                    if name in body:
                        value = body.get(name)
                        kept[target.pod] = value if isinstance(value, Mapping) else None
                continue
        unanswered.append(f"{target.pod}: {error or 'not a JSON object'}")
        if target.pod in previous:
            reports.append(previous[target.pod])  # ages out of the evidence by itself
            if held is not None:
                for before, kept in zip(
                    (held.fast_tiers, held.replicas, held.drains),
                    (fast_tiers, replicas, drains), strict=True,
                ):  # fmt: skip
                    if target.pod in before:
                        kept[target.pod] = before[target.pod]
            quiet_since[target.pod] = quiet.get(target.pod, arrived)
    # one window per round; a rank with no new step since the last one keeps its count
    verdict = rank_stragglers.stragglers(
        reports,
        state if previous else None,
        now=received,
        ratio=straggler_ratio,
        windows=straggler_windows,
    )
    reading = RankReadings(
        attempt=attempt,
        reports=tuple(reports),
        polled_at=received,
        unanswered=tuple(unanswered),
        quiet_since=quiet_since,
        supervisors=supervisors,
        fast_tiers=fast_tiers,
        replicas=replicas,
        drains=drains,
        indexes={t.pod: t.index for t in targets if t.index is not None},
        stragglers=verdict.stragglers,
    )
    if unanswered:
        log.debug("%s/%s: progress not read from %s", *key, "; ".join(unanswered[:3]))
    return reading, verdict.state
