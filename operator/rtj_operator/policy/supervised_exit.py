"""What a supervised trainer's exit means (spec.recovery.inPlace, issue 15): the pod stays
up (its supervisor keeps it for an in-place restart), so only the supervisor's report, read
through the progress sidecar, says the command ended. The earliest exit of the generation is
the first failed; read beside the nodes' signals it may implicate a node (a GPU fault, a
lost node: replace), and a pinned step the restarted trainers refused is a bad step. Pure:
one of the classification package's failure facts, beside `classify` (pods, nodes, events)
and `progress` (hangs); `reconcile.supervised_exits` gathers its inputs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from rtj_operator.api import keys
from rtj_operator.api.attempts import FirstFailed
from rtj_operator.api.detection_spec import NodeHealth
from rtj_operator.api.reasons import FailureClass
from rtj_operator.policy import in_place
from rtj_operator.policy.classify import Classification, Decision, classify_failure
from rtj_operator.policy.findings import iso
from rtj_operator.policy.spares import natural_rank
from rtj_shim.wire.supervisor_report import SupervisorReport, SupervisorState
from rtj_shim.wire.suspect_verdict import SuspectVerdict

Json = Mapping[str, Any]


@dataclass(frozen=True)
class ExitContext:
    """What the plan knows beside the reports: the generation, the trainer container's
    name, the time, the events and the platform's node-health policy and preflight image."""

    generation: int
    trainer: str
    now: datetime
    events: Sequence[Json] = ()
    node_health: NodeHealth = field(default_factory=NodeHealth)
    preflight_image: str | None = None


def _pod_name(pod: Json) -> str:
    return str((pod.get("metadata") or {}).get("name") or "")


def _get(obj: Json, *path: str) -> Any:
    value: Any = obj
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def supervisor_failure(
    reports: Mapping[str, SupervisorReport],
    live: Sequence[Json],
    nodes: Sequence[Json],
    ctx: ExitContext,
) -> Classification | None:
    """A supervised pod whose trainer command exited with an error in this generation (the
    pod stays up: only its supervisor knows). The earliest exit is the first failed.
    `nodes`: the job's nodes as the plan judged them (`liveness.judged_nodes`)."""
    generation = ctx.generation
    exited = [
        (p, r) for p in live
        if (r := reports.get(_pod_name(p))) is not None
        and r.shows(generation, frozenset({SupervisorState.EXITED}))
    ]  # fmt: skip
    if not exited:
        return None
    pod, report = min(exited, key=lambda pr: pr[1].updated_wall_time or 0.0)
    code, when = report.exit_code, report.updated_wall_time
    index = _get(pod, "metadata", "annotations", keys.JOB_COMPLETION_INDEX)
    name, node = _pod_name(pod), _get(pod, "spec", "nodeName")
    first = FirstFailed(
        pod=name,
        rank=None,
        node_rank=int(index) if isinstance(index, str) and index.isdigit() else None,
        node=node if isinstance(node, str) else None,
        container=ctx.trainer,
        exit_code=code,
        finished_at=datetime.fromtimestamp(float(when), timezone.utc) if when else ctx.now,
    )
    others = [_pod_name(p) for p, _ in exited if p is not pod]
    evidence = [
        f"pod {name} on node {node}: the trainer's command exited with code {code} "
        "(rtj-shim supervise keeps the pod up for an in-place restart)"
    ]
    if others:
        evidence.append(f"also exited: {', '.join(others[:5])}")
    if (rejected := report.rejected) is not None:
        step, reason = rejected.step, rejected.reason
        evidence.insert(0, f"pod {name}: the restarted trainers refused pinned step {step}: "
                           f"{reason[:300]}")  # fmt: skip
        return Classification(
            FailureClass.CHECKPOINT_CORRUPT, first, (), tuple(evidence),
            Decision(signal=f"step {step} refused", source=f"pod {name}: supervisor",
                     rule="a pinned step the restore does not verify is bad"),
        )  # fmt: skip
    verdict = next((r.suspect for _, r in exited if r.suspect is not None), None)
    if verdict is not None:
        return _suspect_state(verdict, first, live, reports, tuple(evidence), name)
    cause = _node_cause(ctx, live, nodes, exited)
    if cause is not None:  # a GPU fault or a lost node under the exit: replace, not restart
        return replace(cause, evidence=(*cause.evidence, *evidence))
    return Classification(
        FailureClass.UNKNOWN,
        first,
        (),
        tuple(evidence),
        Decision(
            signal=f"exit code {code}",
            source=f"pod {name}: {keys.PROGRESS_SIDECAR} GET /progress (supervisor)",
            rule="a supervised trainer that exits with an error is a failure of the attempt",
        ),
    )


def _suspect_state(
    verdict: SuspectVerdict,
    first: FirstFailed,
    live: Sequence[Json],
    reports: Mapping[str, SupervisorReport],
    evidence: tuple[str, ...],
    exited_first: str,
) -> Classification:
    """The trainers exited refusing a suspect state: silent data corruption, named at the
    pod their verdict suspects (the rank its supervisor serves, else its own index)."""

    def served(pod: Json) -> int | None:
        report = reports.get(_pod_name(pod))
        if report is not None and report.rank is not None:
            return report.rank
        return natural_rank(pod)

    by_rank = {rank: p for p in live if (rank := served(p)) is not None}
    pod = next((by_rank[n] for n in verdict.pods if n in by_rank), None)
    if pod is not None:
        report, node = reports.get(_pod_name(pod)), _get(pod, "spec", "nodeName")
        first = first.model_copy(update={
            "pod": _pod_name(pod), "node_rank": served(pod), "suspect": True,
            "node": node if isinstance(node, str) else None,
            "rank": verdict.ranks[0] if verdict.ranks else None,
            "exit_code": report.exit_code if report is not None else None,
        })  # fmt: skip
    named = "no rank (no majority to judge by)"
    if first.suspect:
        ranks = ", ".join(map(str, verdict.ranks))
        named = f"rank {ranks} (pod {first.pod} on node {first.node or '?'})"
    line = (f"the trainers refused to publish step {verdict.step} as a suspect state "
            f"({verdict.kind.value}); they suspect {named}")  # fmt: skip
    return Classification(
        FailureClass.SILENT_DATA_CORRUPTION, first, (), (line, *evidence),
        Decision(signal=f"suspect state at step {verdict.step} ({verdict.kind.value})",
                 source=f"pod {exited_first}: {keys.PROGRESS_SIDECAR} GET /progress "
                 "(supervisor)",
                 rule="a state the trainers refuse as suspect restarts the whole world from "
                 "the newest published step, away from the suspect pod's node"),
    )  # fmt: skip


def _node_cause(
    ctx: ExitContext,
    live: Sequence[Json],
    nodes: Sequence[Json],
    exited: Sequence[tuple[Json, SupervisorReport]],
) -> Classification | None:
    """What the classifier makes of the exits (each supervised pod whose trainer exited,
    with its supervisor's report) read as the trainer containers' terminations, beside the
    nodes' signals (an XID condition, a lost node), when that implicates a node; None when
    nothing explains them better than the exits themselves. Every exit counts: two GPU
    faults at once quarantine both nodes, not only the first exit's."""
    ended = {id(pod): _terminated(ctx, pod, report) for pod, report in exited}
    found = classify_failure(
        [ended.get(id(p), p) for p in live],
        list(nodes),
        list(ctx.events),
        ctx.now,
        node_health=ctx.node_health,
        preflight_image=ctx.preflight_image,
    )
    if found is None or found.failure_class not in in_place.REPLACE_CLASSES:
        return None
    return found


def _terminated(ctx: ExitContext, pod: Json, report: SupervisorReport) -> Json:
    """`pod` as if its trainer container had ended as its supervisor reports the command
    did (exit code, time; now when it gives none)."""
    code, when = report.exit_code, report.updated_wall_time
    terminated: dict[str, Any] = {
        "exitCode": code if code is not None else 1,
        "reason": "Error",
    }
    at = ctx.now
    if when:
        at = datetime.fromtimestamp(float(when), timezone.utc)
    terminated["finishedAt"] = iso(at)
    statuses = [
        c for c in _get(pod, "status", "containerStatuses") or []
        if c.get("name") != ctx.trainer
    ]  # fmt: skip
    statuses.append({"name": ctx.trainer, "state": {"terminated": terminated}})
    return {**pod, "status": {**(pod.get("status") or {}), "containerStatuses": statuses}}
