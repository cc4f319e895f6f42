"""rtj_restarts_total{scope}: a restart in place and a whole-world restart are counted apart,
from the plan's MetricRecord through the applier to the registry."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
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


class _SlowDeletes:
    """A Kube whose status patch succeeds and whose JobSet delete fails, noting what
    /metrics said at the moment each call came."""

    def __init__(self, reg: CollectorRegistry) -> None:
        self.reg = reg
        self.seen: dict[str, float] = {}

    def _failures(self) -> float:
        return sample(self.reg, "rtj_failures_total",
                      {"namespace": KEY[0], "name": KEY[1], "class": "NetworkFault"})  # fmt: skip

    def patch_rtj_status(self, *args: Any) -> dict[str, Any]:
        self.seen["patch"] = self._failures()
        return {}

    def delete_jobset(self, *args: Any) -> None:
        self.seen["delete"] = self._failures()
        raise ConnectionResetError("the apiserver went away mid-delete")


def test_a_decisions_counters_move_when_its_status_is_committed_not_after_later_actions() -> None:
    reg = CollectorRegistry()
    kube = _SlowDeletes(reg)
    applier = _applier(reg)
    applier.kube = cast(Kube, kube)
    decided = rc.Plan(
        actions=(rc.PatchStatus({}, {}, "1"), rc.DeleteJobSet("llm-1")),
        metrics=(MetricRecord("failure", FailureClass.NETWORK_FAULT),),
    )
    raw = rtj_raw(RUNNING)
    with pytest.raises(ConnectionResetError):
        asyncio.run(applier.apply(KEY, snapshot(raw, jobsets=[jobset(1)], pods=[]), decided))
    # counted once, before the delete went out: a reader of the Failed status sees it, and
    # the retry (planned from the committed status) has nothing left to count
    assert kube.seen == {"patch": 0, "delete": 1}
    assert kube._failures() == 1
