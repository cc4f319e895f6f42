"""Recording a classified failure and acting on the policy's decision: quarantine, restart
with backoff, or fail for good."""

from __future__ import annotations

from dataclasses import replace

from rtj_operator.api.reasons import ConditionType, FailureCategory, FailureClass, Phase, Reason
from rtj_operator.api.status import QuarantinedNode
from rtj_operator.policy.classify import Classification
from rtj_operator.policy.decide import Fail, Quarantine, Restart, decide
from rtj_operator.policy.render import jobset_name, quarantine_taint
from rtj_operator.reconcile.actions import DeleteJobSet, MetricRecord
from rtj_operator.reconcile.builder import MAX_EVIDENCE_CHARS, PlanBuilder, trim_evidence
from rtj_operator.reconcile.converge import HANG_TEARDOWN_GRACE, delete_pods
from rtj_operator.reconcile.world import JobSetView, read_jobset


def describe(found: Classification, lines: int = 3) -> str:
    evidence = " | ".join(found.evidence[:lines])
    return f"class {found.failure_class.value} ({found.category.value}); evidence: {evidence}"


def _end_record(b: PlanBuilder, found: Classification) -> float | None:
    """Close the current attempt's record with the classification; detection seconds."""
    record = b.status.current
    if record is None:
        return None
    failed_at = found.failed_at
    detection = (b.now - failed_at).total_seconds() if failed_at is not None else None
    update = {
        "ended_at": b.now,
        "failure_class": found.failure_class,
        "failure_category": found.category,
        "first_failed": found.first_failed,
        "evidence": trim_evidence(found.evidence),
        "detection_seconds": round(max(detection, 0.0), 3) if detection is not None else None,
        "quarantined_nodes": sorted(
            {q.node for q in b.status.quarantined_nodes if q.attempt == record.attempt}
        ),
    }
    b.replace_current(record.model_copy(update=update))
    return detection


MAX_QUARANTINED_NODES = 64
"""Quarantine records one job may hold (each a node tainted for it)."""
MAX_BAD_STEPS = 64
"""Steps marked bad that status keeps (the newest: an older one a resolver reaches only when
every newer step failed, and its init container rejects it again)."""


def within_quarantine_limit(b: PlanBuilder, found: Classification) -> Classification:
    """`found` without the nodes past MAX_QUARANTINED_NODES for this job (a cluster-wide
    incident must not make the job too large to write, nor let one job taint everything):
    those are named in an Event and not tainted."""
    done = {q.node for q in b.status.quarantined_nodes}
    fresh = [n for n in found.nodes_to_quarantine if n not in done]
    room = max(MAX_QUARANTINED_NODES - len(done), 0)
    if len(fresh) <= room:
        return found
    kept, dropped = fresh[:room], fresh[room:]
    b.event(
        True,
        Reason.NODES_QUARANTINED,
        f"this job already quarantines {len(done)} nodes (the limit is "
        f"{MAX_QUARANTINED_NODES}); not tainting {', '.join(dropped[:10])}"
        + (f" and {len(dropped) - 10} more" if len(dropped) > 10 else ""),
    )
    return replace(
        found, nodes_to_quarantine=(*(n for n in found.nodes_to_quarantine if n in done), *kept)
    )


def record_quarantine(b: PlanBuilder, found: Classification, action: Quarantine) -> None:
    """Record the quarantine of `action.nodes` (the intent: `ensure_quarantines` taints each
    after the status patch commits it), with a condition and an Event."""
    if found.category is FailureCategory.USER:  # never blame a node for the user's code
        b.notes.append("refused to quarantine for a user-category failure")
        return
    n = b.status.attempt
    taint = quarantine_taint(b.rtj)
    records = list(b.status.quarantined_nodes)
    for node in action.nodes:
        records.append(
            QuarantinedNode(
                node=node,
                failure_class=action.failure_class,
                attempt=n,
                since=b.now,
                evidence=(found.evidence[0] if found.evidence else "")[:MAX_EVIDENCE_CHARS],
                taint_key=taint["key"],
                taint_value=taint["value"],
                taint_effect=taint["effect"],
            )
        )
    b.update(quarantined_nodes=records)
    nodes = ", ".join(action.nodes)
    tainted = f"{action.taint_key}={b.rtj.metadata.name}:{action.taint_effect}"
    b.condition(
        ConditionType.NODES_QUARANTINED, True, Reason.NODES_QUARANTINED,
        f"tainted {tainted} on {nodes}",
    )  # fmt: skip
    b.event(
        True, Reason.NODES_QUARANTINED,
        f"attempt {n}: tainted {nodes} ({tainted}); {describe(found)}",
    )  # fmt: skip
    b.notes.append(action.message)


def on_failure(b: PlanBuilder, found: Classification, js: JobSetView | None) -> None:
    """The recovery table's whole-world failure row: one call of the policy quarantines the
    nodes it blames and restarts the whole world or fails the job, in this one plan."""
    action = decide(b.rtj.spec, b.status, found, b.now)
    if isinstance(action, Restart | Fail) and action.quarantine is not None:
        record_quarantine(b, found, action.quarantine)
    if isinstance(action, Restart):
        _restart_world(b, found, js, action)
    elif isinstance(action, Fail):
        _fail(b, found, js, action)
    else:
        b.notes.append(f"no action: {action.message}")


def _restart_world(
    b: PlanBuilder, found: Classification, js: JobSetView | None, action: Restart
) -> None:
    n = b.status.attempt
    detection = _end_record(b, found)
    b.update(
        phase=Phase.RESTARTING,
        in_place=None,  # an in-place restart a pod failure overtook
        restarts=action.restarts,
        bad_steps=sorted(action.bad_steps)[-MAX_BAD_STEPS:],
        next_attempt_at=action.not_before,
    )
    b.condition(ConditionType.RESTARTING, True, action.reason, action.message)
    b.condition(ConditionType.RUNNING, False, action.reason, f"attempt {n} failed")
    b.condition(ConditionType.ADMITTED, False, action.reason, f"attempt {n} failed")
    if js is not None and not js.deleting:
        b.after.append(DeleteJobSet(jobset_name(b.rtj.metadata.name, n)))
    # now, not after the JobSet's cascade (see DELETE_RESEND); a hung world cannot save
    grace = HANG_TEARDOWN_GRACE if found.failure_class is FailureClass.HANG else None
    delete_pods(b, b.snap.pods, grace_seconds=grace)
    b.event(True, action.reason, f"attempt {n}: {action.message}; {describe(found)}")
    b.metrics.append(MetricRecord("failure", found.failure_class))
    b.metrics.append(MetricRecord("restart", found.failure_class))
    if detection is not None:
        b.metrics.append(MetricRecord("detection", found.failure_class, detection))
    b.requeue_in(action.backoff_seconds)
    b.notes.append(action.message)


def _fail(b: PlanBuilder, found: Classification, js: JobSetView | None, action: Fail) -> None:
    n = b.status.attempt
    detection = _end_record(b, found)
    b.update(phase=Phase.FAILED, next_attempt_at=None, in_place=None)
    b.condition(ConditionType.FAILED, True, action.reason, action.message)
    b.condition(ConditionType.RUNNING, False, action.reason, f"attempt {n} failed")
    if js is not None and not js.deleting:  # after the patch: a failed job holds nothing
        b.after.append(DeleteJobSet(jobset_name(b.rtj.metadata.name, n)))
    b.event(True, action.reason, f"attempt {n}: {action.message}; {describe(found)}")
    b.metrics.append(MetricRecord("failure", found.failure_class))
    if detection is not None:
        b.metrics.append(MetricRecord("detection", found.failure_class, detection))
    b.notes.append(action.message)


def release_failed_job(b: PlanBuilder) -> None:
    """A Failed job keeps no JobSet: an admitted JobSet whose pods never fail (a config
    error) would otherwise hold its Kueue quota and GPUs forever. The evidence stays in the
    attempt records and Events; the JobSet's deletion takes its pods with it."""
    uid = b.rtj.metadata.uid
    for view in map(read_jobset, b.snap.jobsets):
        if view.owner_uid == uid and not view.deleting:
            b.after.append(DeleteJobSet(view.name))
            b.notes.append(f"delete JobSet {view.name} of a failed job")
