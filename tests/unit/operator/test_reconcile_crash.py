"""Crash safety of the planner: an operator that dies at any point of any plan, or decides
from a stale read of the job, still converges to one JobSet for the current attempt, no
orphan pods and exactly one counted restart per failure.

`FakeWorld` applies plans as the API server would (conditional status patches, 409 on a
second create, a deleted JobSet gone at once and its pods on a later tick). A crash is a
plan cut short after any action; a restart is just the next plan, from what exists.
"""

from __future__ import annotations

import copy

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rtj_world import FakeWorld, Stop, rtj_raw

from rtj_operator import reconcile as rc
from rtj_operator.api import keys

GPU_MESSAGE = "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus"
NCCL_MESSAGE = "NCCL timeout: Watchdog caught collective operation timeout"


def _attempt_pods_running(world: FakeWorld, attempt: int) -> bool:
    mine = [
        p
        for p in world.pods.values()
        if p["metadata"]["labels"][keys.ATTEMPT_LABEL] == str(attempt)
    ]
    return bool(mine) and all(p["status"]["phase"] == "Running" for p in mine)


def _step(world: FakeWorld, cut: int | None, stale: dict | None) -> rc.Plan:
    snap = world.snapshot()
    if stale is not None:
        raw, world.raw = world.raw, stale
        snap = world.snapshot()
        world.raw = raw
    plan = rc.plan(snap)
    actions = plan.actions if cut is None else plan.actions[:cut]
    try:
        for action in actions:
            world.apply(action)
    except Stop:
        pass
    return plan


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cuts=st.lists(st.one_of(st.none(), st.integers(0, 5)), max_size=60),
    stale=st.lists(st.booleans(), max_size=60),
    faults=st.lists(st.booleans(), min_size=1, max_size=3),
)
def test_crash_at_any_point_converges_and_counts_each_restart_once(
    cuts: list[int | None], stale: list[bool], faults: list[bool]
) -> None:
    world = FakeWorld(
        rtj_raw(replicas=2, failurePolicy={"backoff": {"initialSeconds": 0, "maxSeconds": 0}})
    )
    history: list[dict] = []
    injected = 0
    cuts_it, stale_it = iter(cuts), iter(stale)
    for _ in range(400):
        cut = next(cuts_it, None)
        old = history[-2] if next(stale_it, False) and len(history) >= 2 else None
        before = world.raw["metadata"]["resourceVersion"]
        plan = _step(world, cut, old)
        if world.raw["metadata"]["resourceVersion"] != before:
            history.append(copy.deepcopy(world.raw))
        world.tick(1)
        status = world.raw.get("status") or {}
        attempt = status.get("attempt", 0)
        if (
            injected < len(faults)
            and attempt == injected + 1
            and status.get("phase") == "Running"
            and _attempt_pods_running(world, attempt)
        ):
            if faults[injected]:
                world.fail_pod(0, GPU_MESSAGE, xid=79)
            else:
                world.fail_pod(0, NCCL_MESSAGE)
            injected += 1
        done = injected == len(faults) and status.get("phase") == "Running"
        if done and not plan.actions and cut is None and old is None:
            break

    status = world.raw["status"]
    n = len(faults) + 1
    assert status["phase"] == "Running", status
    assert status["attempt"] == n
    assert status["restarts"]["infrastructure"] == len(faults), "each failure counted once"
    assert [r["attempt"] for r in status["attempts"]] == list(range(1, n + 1))
    assert list(world.jobsets) == [f"llm-a{n}"], "exactly one JobSet, the current attempt's"
    assert {p["metadata"]["labels"][keys.ATTEMPT_LABEL] for p in world.pods.values()} == {str(n)}
    assert world.created == [f"llm-a{i}" for i in range(1, n + 1)], "no attempt created twice"
    assert world.overlaps == [], "every old JobSet and pod was gone before the next JobSet"
    quarantined = {q["node"] for q in status.get("quarantinedNodes", [])}
    assert quarantined == ({"gpu-node-000"} if any(faults) else set())
    # every taint is recorded, every record holds its taint and this job's claim
    tainted = {n for n, body in world.nodes.items() if body["spec"]["taints"]}
    assert tainted == quarantined
    for name in quarantined:
        claims = world.nodes[name]["metadata"]["annotations"][keys.QUARANTINE_OWNERS_ANNOTATION]
        assert "6f1c-uid" in claims
    finalizers = world.raw["metadata"].get("finalizers", [])
    assert finalizers == ([keys.RELEASE_FINALIZER] if quarantined else [])
