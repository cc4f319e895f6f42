"""rtj_restarts_total{scope}: a restart in place and a whole-world restart are counted apart,
from the plan's MetricRecord through the applier to the registry."""

from __future__ import annotations

from typing import Any, cast

from prometheus_client import CollectorRegistry
from rtj_world import jobset, pod, rtj_raw, snapshot
from test_in_place import IN_PLACE, RUNNING, plan, readings, supervised_pods

from rtj_operator import reconcile as rc
from rtj_operator.api import FailureClass
from rtj_operator.kube import Kube
from rtj_operator.metrics import Metrics, sample
from rtj_operator.plan_apply import PlanApplier
from rtj_operator.reconcile.actions import MetricRecord

KEY = ("team-a", "llm")


def _applier(reg: CollectorRegistry) -> PlanApplier:
    async def io(fn: Any, *args: Any) -> Any:
        return fn(*args)

    return PlanApplier(
        cast(Kube, None), Metrics(reg), io, identity="test",
        committed=lambda key, body: None, rejected=lambda key, why: None,
    )  # fmt: skip


def _restarts(reg: CollectorRegistry, cls: str, scope: str) -> float:
    return sample(reg, "rtj_restarts_total", {"namespace": KEY[0], "name": KEY[1],
                                              "class": cls, "scope": scope})  # fmt: skip


def test_a_restart_in_place_is_counted_with_scope_in_place() -> None:
    pods = supervised_pods()
    raw = rtj_raw(RUNNING, **IN_PLACE)
    failed = plan(raw, pods, readings(pods, (0, "running", None), (0, "exited", 1)))
    (restart,) = [m for m in failed.metrics if m.kind == "restart"]
    assert restart.in_place and restart.failure_class is FailureClass.UNKNOWN
    reg = CollectorRegistry()
    _applier(reg)._record(KEY, failed.metrics)
    assert _restarts(reg, "Unknown", "in_place") == 1
    assert _restarts(reg, "Unknown", "world") == 0


def test_a_whole_world_restart_is_counted_with_scope_world() -> None:
    pods = [pod(1, 0, exit_code=1, message="NCCL error: unhandled system error")]
    raw = rtj_raw(RUNNING)  # spec.recovery.inPlace off: a failure restarts every pod
    failed = rc.plan(snapshot(raw, jobsets=[jobset(1)], pods=pods + [pod(1, i) for i in (1, 2)]))
    (restart,) = [m for m in failed.metrics if m.kind == "restart"]
    assert not restart.in_place and restart.failure_class is FailureClass.NETWORK_FAULT
    reg = CollectorRegistry()
    applier = _applier(reg)
    applier._record(KEY, failed.metrics)
    applier._record(KEY, [MetricRecord("restart", FailureClass.NETWORK_FAULT, in_place=True)])
    applier._record(KEY, failed.metrics)
    assert _restarts(reg, "NetworkFault", "world") == 2
    assert _restarts(reg, "NetworkFault", "in_place") == 1
    # summed over scope, the counter still says how often the job restarted at all
    assert sum(_restarts(reg, "NetworkFault", s) for s in ("world", "in_place")) == 3
