"""The supervisors' reports of the current attempt, and the failure their exits mean
(`policy.supervised_exit`, pure): this module gathers its inputs from the plan."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rtj_operator.policy.classify import Classification
from rtj_operator.policy.render import trainer_name
from rtj_operator.policy.supervised_exit import ExitContext
from rtj_operator.policy.supervised_exit import supervisor_failure as exit_failure
from rtj_operator.reconcile.builder import PlanBuilder
from rtj_operator.reconcile.world import Json, preflight_image
from rtj_shim.wire.supervisor_report import SupervisorReport


def supervisors(b: PlanBuilder) -> Mapping[str, SupervisorReport]:
    """The current attempt's supervisors' last reports, by pod."""
    readings = b.snap.ranks
    if readings is None or readings.attempt != b.status.attempt:
        return {}
    return readings.supervisors


def supervisor_failure(
    b: PlanBuilder, live: Sequence[Json], nodes: Sequence[Json]
) -> Classification | None:
    """The failure a supervised trainer's exit means in this generation, if any (`nodes`:
    the job's nodes as this plan judged them, `liveness.judged_nodes`)."""
    ctx = ExitContext(
        generation=b.status.attempt_generation,
        trainer=trainer_name(b.rtj),
        now=b.now,
        events=tuple(b.snap.events or ()),
        node_health=b.rtj.spec.node_health,
        preflight_image=preflight_image(b.snap),
    )
    return exit_failure(supervisors(b), live, nodes, ctx)
