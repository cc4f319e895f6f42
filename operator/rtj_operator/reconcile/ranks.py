"""Ranks that stop or slow down, in the plan: which pods the progress poller reads, a Hang
from their reports, stragglers, and the per-job progress summary in status. Pure.

The reports are what each worker pod's progress sidecar answered the operator's poller
(`rtj_operator.rank_polls`), held in memory and handed over in the snapshot; the decisions
are `policy.progress` (hang_verdict, auto_timeout, job_progress). A Hang is recorded like
any failure (`failure.on_failure`): class `Hang`, category `unknown` (maxRestarts with
backoff, no quarantine), the culprit rank as the first failed rank, dated from when it
last made progress, so `detectionSeconds` is the time from the freeze to the record.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from rtj_operator.api import keys
from rtj_operator.api.detection_spec import ProgressMonitoring
from rtj_operator.api.reasons import ConditionType, Phase, Reason
from rtj_operator.api.status import JobProgress, MisalignedResume, Straggler
from rtj_operator.metrics import ProgressFacts
from rtj_operator.policy import fast_drain, fast_tier, peer_replica, spares
from rtj_operator.policy import progress as rank_progress
from rtj_operator.policy.classify import Classification
from rtj_operator.policy.hang import hang_failure
from rtj_operator.policy.render import trainer_name
from rtj_operator.reconcile.builder import PlanBuilder, condition_true
from rtj_operator.reconcile.world import (
    Json,
    PollTarget,
    RankReadings,
    Snapshot,
    attempt_of,
    get_in,
    owned_jobset_uids,
    pod_name,
    trusted_pod,
)

SUMMARY_EVERY = timedelta(seconds=30)
"""status.progress is rewritten at most this often while only the step moves (a change of
attempt or of the stragglers, and the attempt's first fast-tier step, are written at once):
one write per job per 30 s, whatever the number of ranks."""
AUTO_TIMEOUT_FLOOR = 30.0
"""The automatic step allowance is never below this (seconds)."""


def _epoch(moment: datetime) -> float:
    return moment.timestamp()


def poll_targets(snap: Snapshot) -> tuple[PollTarget, ...]:
    """The current attempt's trusted, Running worker pods with an IP and a progress sidecar
    (polled on the sidecar's own port), when the job has progress monitoring on and is
    admitted or running. While it restarts, the failed attempt's pods still there (being
    deleted) are read on: a node whose pods all went quiet with its Lease overdue is fenced
    without waiting for the Lease alone (`reconcile.liveness.fenced_nodes`)."""
    rtj = snap.rtj
    status = rtj.status
    teardown = status.phase is Phase.RESTARTING
    if not rtj.spec.progress.enabled or not (
        teardown or status.phase in (Phase.ADMITTED, Phase.RUNNING)
    ):
        return ()
    owned = owned_jobset_uids(snap)
    assigned, world = status.spare_ranks, status.world_size
    out = []
    for pod in snap.pods:
        if attempt_of(pod) != status.attempt or not trusted_pod(pod, owned):
            continue
        ip = get_in(pod, "status", "podIP")
        running = get_in(pod, "status", "phase") == "Running"
        deleting = get_in(pod, "metadata", "deletionTimestamp") is not None
        port = progress_port(pod)
        wanted = running and (teardown or not deleting)
        if wanted and isinstance(ip, str) and ip and port is not None:
            node = get_in(pod, "spec", "nodeName")
            out.append(PollTarget(pod_name(pod), ip, port, status.attempt,
                                  spares.rank_of(pod, assigned, world),
                                  node if isinstance(node, str) else None,
                                  spares.is_idle(pod, assigned, world),
                                  answers_sealed(pod)))  # fmt: skip
    return tuple(sorted(out, key=lambda t: t.pod))


def completion_index(pod: Json) -> int | None:
    """The pod's completion index (its Job's annotation; None: not annotated)."""
    index = get_in(pod, "metadata", "annotations", keys.JOB_COMPLETION_INDEX)
    return int(index) if isinstance(index, str) and index.isdigit() else None


def answers_sealed(pod: Json) -> bool:
    """Whether the pod's progress sidecar was rendered to seal its answers (its
    ``RTJ_SEALED_ANSWERS=1``): as the pod was created, whatever the operator renders now."""
    for container in get_in(pod, "spec", "initContainers") or []:
        if isinstance(container, dict) and container.get("name") == keys.PROGRESS_SIDECAR:
            return any(isinstance(e, dict) and e.get("name") == keys.ENV_SEALED_ANSWERS
                       and e.get("value") == "1" for e in container.get("env") or [])  # fmt: skip
    return False


def progress_port(pod: Json) -> int | None:
    """The port of the pod's own progress sidecar (None: the pod has none, e.g. it was
    created with progress monitoring off: nothing to poll)."""
    for container in get_in(pod, "spec", "initContainers") or []:
        if isinstance(container, dict) and container.get("name") == keys.PROGRESS_SIDECAR:
            for port in container.get("ports") or []:
                if port.get("name") == keys.PROGRESS_PORT_NAME:
                    value = port.get("containerPort")
                    return value if isinstance(value, int) else None
    return None


def _readings(b: PlanBuilder) -> RankReadings | None:
    readings = b.snap.ranks
    if not b.rtj.spec.progress.enabled:
        return None  # turned off while the attempt runs: its reports are no evidence
    if readings is None or readings.attempt != b.status.attempt:
        return None
    return readings


def _timeouts(b: PlanBuilder, reports: Sequence[rank_progress.PodReport]) -> rank_progress.Timeouts:
    return step_allowances(b.rtj.spec.progress, reports, _epoch(b.now))


def step_allowances(
    spec: ProgressMonitoring, reports: Sequence[rank_progress.PodReport], now: float
) -> rank_progress.Timeouts:
    """How long a rank of this job may stay in one section: `spec.hangTimeoutSeconds`, or
    the automatic allowances from what the ranks observed (`policy.progress.auto_timeout`)."""
    grace = float(spec.startup_grace_seconds)
    if spec.hang_timeout_seconds is not None:
        fixed = float(spec.hang_timeout_seconds)
        return rank_progress.Timeouts.fixed(fixed, startup=max(fixed, grace))
    return rank_progress.auto_timeout(
        reports,
        factor=spec.timeout_factor,
        floor=AUTO_TIMEOUT_FLOOR,
        startup_grace=grace,
        now=now,
    )


def find_hang(b: PlanBuilder, live: Sequence[Json]) -> Classification | None:
    """A Hang of the current attempt from its ranks' reports (None: no hang, or nothing to
    judge from). Only while every worker runs: a pod still starting is not hung."""
    readings = _readings(b)
    if readings is None or b.status.phase is not Phase.RUNNING:
        return None
    pods = {pod_name(p): p for p in live if get_in(p, "status", "phase") == "Running"}
    reports = tuple(r for r in readings.reports if r.pod in pods)
    if len(reports) == len(readings.reports):
        reports = readings.reports  # the same tuple: its parse is shared (parse_reports)
    if not reports:
        return None
    timeouts = _timeouts(b, reports)
    hang = rank_progress.hang_verdict(reports, timeouts, _epoch(b.now))
    if hang is None:
        return None
    silent = sorted(set(pods) - {r.pod for r in reports})
    allowance = timeouts.reason or f"{hang.timeout:.0f}s"
    return hang_failure(hang, pods.get(hang.pod, {}), silent, allowance, trainer_name(b.rtj), b.now)


def _stragglers(b: PlanBuilder, readings: RankReadings, was: JobProgress | None) -> list[Straggler]:
    before = {
        s.rank: s
        for s in (was.stragglers if was is not None else ())
        if s.attempt == readings.attempt
    }
    nodes = {pod_name(p): get_in(p, "spec", "nodeName") for p in b.snap.pods}
    out = []
    for s in readings.stragglers[:64]:
        held = before.get(s.rank)
        out.append(
            Straggler(
                rank=s.rank,
                pod=s.pod,
                node=nodes.get(s.pod),
                ratio=round(s.ratio, 2),
                attempt=readings.attempt,
                since=held.since if held is not None and held.pod == s.pod else b.now,
            )
        )
    return out


def note_progress(b: PlanBuilder) -> None:
    """The per-job progress summary (status.progress) and the Straggling condition."""
    readings = _readings(b)
    if readings is None:
        return
    was = b.status.progress
    summary = rank_progress.job_progress(readings.reports, _epoch(b.now))
    stragglers = _stragglers(b, readings, was)
    fast = _fast_tier(b, readings)
    fresh = JobProgress(
        attempt=readings.attempt,
        step=summary.step,
        step_seconds=round(summary.median_step_seconds, 3) if summary.median_step_seconds else None,
        steps_per_second=round(summary.steps_per_second, 3) if summary.steps_per_second else None,
        ranks=summary.ranks,
        observed_at=b.now,
        stragglers=stragglers,
        fast_step=fast[0] if fast is not None else None,
        fast_committed_at=fast[1] if fast is not None else None,
        drained_step=fast_drain.drained_step(readings.drains),
        misaligned_resume=_misaligned_resume(b, readings, was),
    )
    found = fresh.misaligned_resume
    new_finding = found is not None and (was is None or was.misaligned_resume != found)
    before = {
        (s.rank, s.pod)
        for s in (was.stragglers if was is not None else ())
        if s.attempt == readings.attempt
    }
    after = {(s.rank, s.pod) for s in stragglers}
    first_fast = (was is not None and was.fast_step is None) and fresh.fast_step is not None
    if was is None or was.attempt != fresh.attempt or before != after or first_fast or new_finding:
        b.update(progress=fresh)  # the attempt's first fast step shows at once, as its start
    elif (was.step, was.ranks, was.fast_step, was.drained_step) != (
        fresh.step, fresh.ranks, fresh.fast_step, fresh.drained_step,
    ):  # fmt: skip
        if b.now - was.observed_at >= SUMMARY_EVERY:
            b.update(progress=fresh)
        else:
            b.requeue_in((was.observed_at + SUMMARY_EVERY - b.now).total_seconds())
    _straggling(b, stragglers, before != after)
    if new_finding and found is not None:
        _misaligned_event(b, found)


def _misaligned_event(b: PlanBuilder, found: MisalignedResume) -> None:
    named = ", ".join(
        f"rank {r} ({f:.3g}x the others' loss)"
        for r, f in zip(found.ranks, found.factors, strict=False)
    )
    b.event(True, Reason.RESUME_MISALIGNED,
            f"attempt {found.attempt}, generation {found.generation}: the data alignment "
            f"check at step {found.step} named {named}, outside the ranks' spread before "
            "the fault: it may have resumed reading its data at the wrong position")  # fmt: skip


def _misaligned_resume(
    b: PlanBuilder, readings: RankReadings, was: JobProgress | None
) -> MisalignedResume | None:
    """The finding a pod's supervisor reports for the attempt's current generation, or the
    one status already holds for it (a pod that stopped answering keeps it shown)."""
    generation = b.status.attempt_generation
    for report in readings.supervisors.values():
        found = report.misaligned
        if found is not None and report.generation == generation:
            return MisalignedResume(attempt=readings.attempt, generation=generation,
                                    step=found.step, ranks=list(found.ranks),
                                    factors=[round(f, 3) for f in found.factors])  # fmt: skip
    kept = was.misaligned_resume if was is not None else None
    if kept is not None and (kept.attempt, kept.generation) == (readings.attempt, generation):
        return kept
    return None


def _fast_tier(b: PlanBuilder, readings: RankReadings) -> tuple[int, datetime] | None:
    """The newest fast-tier step every pod of the attempt holds (None: no fast tier, or a
    pod does not report one yet)."""
    if b.rtj.spec.checkpoint.fast_tier is None or not readings.fast_tiers:
        return None
    return fast_tier.summary(readings.fast_tiers, [r.pod for r in readings.reports])


def _straggling(b: PlanBuilder, stragglers: Sequence[Straggler], changed: bool) -> None:
    if stragglers:
        ratio = b.rtj.spec.progress.stragglers.ratio
        named = ", ".join(
            f"rank {s.rank} ({s.pod} on {s.node or '?'}, {s.ratio:.2f}x the others' busy time)"
            for s in stragglers[:5]
        )
        more = f" and {len(stragglers) - 5} more" if len(stragglers) > 5 else ""
        action = b.rtj.spec.progress.stragglers.action
        then = "; the next attempt will avoid its node" if action == "ReplaceNode" else ""
        message = f"slower than the others' median / {ratio}: {named}{more}{then}"
        b.condition(ConditionType.STRAGGLING, True, Reason.STRAGGLER_DETECTED, message)
        if changed:
            b.event(True, Reason.STRAGGLER_DETECTED, f"attempt {b.status.attempt}: {message}")
    elif condition_true(b.status, ConditionType.STRAGGLING):
        b.condition(
            ConditionType.STRAGGLING,
            False,
            Reason.NO_STRAGGLERS,
            "no rank is slower than the others",
        )


def progress_facts(readings: RankReadings, now: datetime) -> ProgressFacts:
    """What the progress gauges show for one job after a poll round."""
    at = _epoch(now)
    summary = rank_progress.job_progress(readings.reports, at)
    running = [r for r in rank_progress.parse_reports(readings.reports, at).ranks if not r.exited]
    return ProgressFacts(
        step=summary.step,
        step_seconds=summary.median_step_seconds,
        seconds_without_progress=max((r.in_section(at) for r in running), default=None),
        ranks=len(running),
        stragglers=len(readings.stragglers),
        fast_replicated_step=(
            peer_replica.replicated_step(readings.replicas, readings.indexes)
            if readings.replicas
            else None
        ),
        drained_step=fast_drain.drained_step(readings.drains),
    )
