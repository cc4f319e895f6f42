"""decide(): table-driven cases over the fixture corpus, and property tests of its budgets."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rtj_test_support import NOW, make_job

from rtj_operator.api import (
    AttemptRecord,
    FailureCategory,
    FailureClass,
    Phase,
    QuarantinedNode,
    ResilientTrainingJobSpec,
    ResilientTrainingJobStatus,
    RestartCounts,
    VerifiedCheckpoint,
)
from rtj_operator.api.attempts import FirstFailed
from rtj_operator.policy.classify import Classification
from rtj_operator.policy.decide import (
    Fail,
    Quarantine,
    Restart,
    StartAttempt,
    Wait,
    backoff_seconds,
    decide,
)

C = FailureClass


def _spec(**failure_policy: Any) -> ResilientTrainingJobSpec:
    return make_job(failurePolicy=failure_policy).spec


def _found(cls: FailureClass, nodes: tuple[str, ...] = ()) -> Classification:
    first = FirstFailed(pod="llm-a1-worker-0-1-b9q4m", rank=11, node_rank=1, node="gpu-node-011",
                        container="trainer", exit_code=1, finished_at=NOW)  # fmt: skip
    return Classification(cls, first, nodes, ("evidence",))


def _running(attempt: int = 1, **fields: Any) -> ResilientTrainingJobStatus:
    record = AttemptRecord(attempt=attempt, job_set=f"llm-a{attempt}", resumed_from_step=12000)
    base: dict[str, Any] = {"phase": Phase.RUNNING, "attempt": attempt, "attempts": [record]}
    return ResilientTrainingJobStatus(**{**base, **fields})


def _checkpoint(step: int) -> VerifiedCheckpoint:
    return VerifiedCheckpoint(
        step=step, uri=f"s3://ckpt/steps/{step}", committed_at=NOW, verified_at=NOW
    )


# --- table ---------------------------------------------------------------------------------

TABLE = [
    # (name, class, policy, status fields, expected action type, expected reason / detail)
    ("gpu first quarantines", C.GPU_FAULT, {}, {}, Restart, "RestartScheduled"),
    ("infra restarts", C.NETWORK_FAULT, {}, {}, Restart, "RestartScheduled"),
    ("unknown is flagged", C.UNKNOWN, {}, {}, Restart, "UnknownFailureFlagged"),
    ("infra budget spent", C.NODE_LOST, {"maxRestarts": 2},
     {"restarts": RestartCounts(infrastructure=2)}, Fail, "RestartBudgetExhausted"),
    ("user error fails fast", C.USER_ERROR, {}, {}, Fail, "UserErrorBudgetExhausted"),
    ("oom within user budget", C.OUT_OF_MEMORY, {"userErrorRestarts": 1}, {}, Restart,
     "RestartScheduled"),
    ("config beyond user budget", C.CONFIG_ERROR, {"userErrorRestarts": 1},
     {"restarts": RestartCounts(user=1)}, Fail, "UserErrorBudgetExhausted"),
    ("preemption is free", C.PREEMPTED, {"maxRestarts": 0}, {}, Restart, "RestartScheduled"),
    ("counted preemption spends", C.PREEMPTED, {"maxRestarts": 0, "countPreemptions": True}, {},
     Fail, "RestartBudgetExhausted"),
    ("corrupt step marked bad", C.CHECKPOINT_CORRUPT, {"maxRestarts": 0}, {}, Restart,
     "CheckpointMarkedBad"),
    ("corrupt again spends budget", C.CHECKPOINT_CORRUPT, {"maxRestarts": 0},
     {"bad_steps": [12000]}, Fail, "RestartBudgetExhausted"),
    ("suspect state spends its own budget", C.SILENT_DATA_CORRUPTION, {"maxRestarts": 0},
     {"restarts": RestartCounts(silent_data_corruption=2)}, Restart, "RestartScheduled"),
    ("suspect state budget spent", C.SILENT_DATA_CORRUPTION,
     {"silentDataCorruptionRestarts": 1, "maxRestarts": 5},
     {"restarts": RestartCounts(silent_data_corruption=1)}, Fail,
     "SilentDataCorruptionBudgetExhausted"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "cls", "policy", "fields", "kind", "reason"), TABLE)
def test_decision_table(
    name: str,
    cls: FailureClass,
    policy: dict[str, Any],
    fields: dict[str, Any],
    kind: type,
    reason: str,
) -> None:
    nodes = ("gpu-node-011",) if cls.category is FailureCategory.INFRASTRUCTURE else ()
    if name != "gpu first quarantines":
        fields = {**fields, "quarantined_nodes": [_quarantined("gpu-node-011")]}
    action = decide(_spec(**policy), _running(**fields), _found(cls, nodes), NOW)
    assert isinstance(action, kind), action
    assert action.reason.value == reason  # type: ignore[union-attr]
    quarantine = getattr(action, "quarantine", None)
    assert (quarantine is not None) == (name == "gpu first quarantines"), action


def _quarantined(node: str) -> QuarantinedNode:
    return QuarantinedNode(node=node, failure_class=C.GPU_FAULT, attempt=1, since=NOW)


def test_quarantine_carries_the_taint_from_the_spec() -> None:
    spec = make_job(nodeHealth={"taintKey": "example.com/bad", "taintEffect": "NoExecute"}).spec
    action = decide(spec, _running(), _found(C.GPU_FAULT, ("gpu-node-011",)), NOW)
    assert isinstance(action, Restart) and isinstance(action.quarantine, Quarantine)
    q = action.quarantine
    assert (q.nodes, q.taint_key, q.taint_effect, q.reason.value) == (
        ("gpu-node-011",), "example.com/bad", "NoExecute", "NodesQuarantined",
    )  # fmt: skip


def test_quarantine_and_restart_are_one_decision_and_the_quarantine_outlives_the_budget() -> None:
    """One call of the policy: the nodes to taint and the restart (or the failure, when the
    budget is spent: a bad node is bad for the next job too) come back together."""
    first = decide(_spec(), _running(), _found(C.GPU_FAULT, ("gpu-node-011",)), NOW)
    assert isinstance(first, Restart) and first.quarantine is not None
    assert first.restarts.infrastructure == 1
    spent = _running(restarts=RestartCounts(infrastructure=3))
    last = decide(_spec(maxRestarts=3), spent, _found(C.NODE_LOST, ("gpu-node-011",)), NOW)
    assert isinstance(last, Fail) and last.quarantine is not None
    assert last.quarantine.nodes == ("gpu-node-011",)


def test_restart_after_quarantine_counts_and_backs_off() -> None:
    status = _running(
        quarantined_nodes=[_quarantined("gpu-node-011")],
        restarts=RestartCounts(infrastructure=2),
    )
    action = decide(_spec(), status, _found(C.GPU_FAULT, ("gpu-node-011",)), NOW)
    assert isinstance(action, Restart)
    assert action.restarts.infrastructure == 3
    assert action.backoff_seconds == 40.0  # 10 * 2^2
    assert action.not_before == NOW + timedelta(seconds=40)
    assert "GPUFault on rank 11" in action.message


def test_a_preemption_is_free_but_backs_off_so_the_job_does_not_churn() -> None:
    first = decide(_spec(maxRestarts=0), _running(), _found(C.PREEMPTED), NOW)
    assert isinstance(first, Restart) and first.backoff_seconds == 10.0
    assert (first.restarts.preemption, first.restarts.infrastructure) == (1, 0)
    again = _running(restarts=RestartCounts(preemption=3))
    third = decide(_spec(maxRestarts=0), again, _found(C.PREEMPTED), NOW)
    assert isinstance(third, Restart) and third.backoff_seconds == 80.0  # 10 * 2^3
    assert third.restarts.infrastructure == 0


@pytest.mark.parametrize("cls", [C.IMAGE_PULL_FAILED, C.PODS_READY_TIMEOUT])
def test_pull_failures_and_pods_ready_timeouts_spend_the_restart_budget(
    cls: FailureClass,
) -> None:
    status = _running(restarts=RestartCounts(infrastructure=1))
    action = decide(_spec(maxRestarts=3), status, _found(cls), NOW)
    assert isinstance(action, Restart) and action.restarts.infrastructure == 2
    assert action.restarts.user == 0 and action.backoff_seconds == 20.0
    spent = _running(restarts=RestartCounts(infrastructure=3))
    assert isinstance(decide(_spec(maxRestarts=3), spent, _found(cls), NOW), Fail)


def test_a_suspect_gpu_fault_restarts_without_quarantine() -> None:
    action = decide(_spec(), _running(), _found(C.GPU_FAULT, ()), NOW)
    assert isinstance(action, Restart) and action.restarts.infrastructure == 1


def test_corrupt_step_is_marked_bad_and_next_attempt_skips_it() -> None:
    status = _running(last_verified_checkpoint=_checkpoint(12000))
    action = decide(_spec(), status, _found(C.CHECKPOINT_CORRUPT), NOW)
    assert isinstance(action, Restart) and action.bad_steps == (12000,)
    restarting = status.model_copy(
        update={
            "phase": Phase.RESTARTING,
            "bad_steps": list(action.bad_steps),
            "next_attempt_at": NOW,
        }
    )
    start = decide(_spec(), restarting, None, NOW, verified_steps=[11000, 12000, 10000])
    assert isinstance(start, StartAttempt)
    assert (start.attempt, start.resume_step) == (2, 11000)


def test_backoff_waits_then_starts() -> None:
    status = _running(phase=Phase.RESTARTING, next_attempt_at=NOW + timedelta(seconds=30))
    waiting = decide(_spec(), status, None, NOW)
    assert isinstance(waiting, Wait) and waiting.until == NOW + timedelta(seconds=30)
    started = decide(_spec(), status, None, NOW + timedelta(seconds=30))
    assert isinstance(started, StartAttempt) and started.attempt == 2


def test_first_attempt_and_quiet_and_terminal() -> None:
    fresh = ResilientTrainingJobStatus()
    start = decide(_spec(), fresh, None, NOW)
    assert isinstance(start, StartAttempt) and (start.attempt, start.resume_step) == (1, None)
    assert isinstance(decide(_spec(), _running(), None, NOW), Wait)
    done = _running(phase=Phase.SUCCEEDED)
    assert isinstance(decide(_spec(), done, _found(C.USER_ERROR), NOW), Wait)


def test_backoff_is_exponential_and_capped() -> None:
    policy = _spec(backoff={"initialSeconds": 10, "maxSeconds": 60}).failure_policy
    assert [backoff_seconds(policy, k) for k in range(5)] == [10, 20, 40, 60, 60]
    assert backoff_seconds(policy, 10_000) == 60


# --- properties ------------------------------------------------------------------------------

USER_CLASSES = [c for c in FailureClass if c.category is FailureCategory.USER]
steps = st.integers(min_value=0, max_value=50).map(lambda s: s * 500)


@st.composite
def statuses(draw: st.DrawFn, phase: Phase | None = None) -> ResilientTrainingJobStatus:
    attempt = draw(st.integers(min_value=1, max_value=20))
    pinned = draw(st.none() | steps)
    last = draw(st.none() | steps)
    return ResilientTrainingJobStatus(
        phase=phase or draw(st.sampled_from([Phase.RUNNING, Phase.ADMITTED, Phase.PENDING])),
        attempt=attempt,
        attempts=[
            AttemptRecord(attempt=attempt, job_set=f"llm-a{attempt}", resumed_from_step=pinned)
        ],
        bad_steps=sorted(draw(st.sets(steps, max_size=6))),
        last_verified_checkpoint=None if last is None else _checkpoint(last),
        restarts=RestartCounts(
            infrastructure=draw(st.integers(0, 12)),
            user=draw(st.integers(0, 6)),
            preemption=draw(st.integers(0, 6)),
        ),
        next_attempt_at=NOW + timedelta(seconds=draw(st.integers(-100, 100))),
    )


policies = st.fixed_dictionaries(
    {
        "maxRestarts": st.integers(0, 10),
        "userErrorRestarts": st.integers(0, 5),
        "countPreemptions": st.booleans(),
        "backoff": st.fixed_dictionaries(
            {"initialSeconds": st.integers(0, 60), "maxSeconds": st.integers(60, 900)}
        ),
    }
)
nodes = st.lists(st.sampled_from(["gpu-node-010", "gpu-node-011", "gpu-node-012"]), unique=True)


@settings(max_examples=300, deadline=None)
@given(policies, statuses(), st.sampled_from(USER_CLASSES), nodes.map(tuple))
def test_user_failures_never_restart_beyond_their_budget(
    policy: dict[str, Any],
    status: ResilientTrainingJobStatus,
    cls: FailureClass,
    bad: tuple[str, ...],
) -> None:
    action = decide(_spec(**policy), status, _found(cls, bad), NOW)
    budget = policy["userErrorRestarts"]
    assert getattr(action, "quarantine", None) is None, "never taint a node for a user failure"
    if status.restarts.user >= budget:
        assert isinstance(action, Fail)
    else:
        assert isinstance(action, Restart)
        assert action.restarts.user == status.restarts.user + 1 <= budget
        assert action.restarts.infrastructure == status.restarts.infrastructure


@settings(max_examples=300, deadline=None)
@given(
    policies,
    statuses(),
    st.sampled_from(list(FailureClass)),
    nodes.map(tuple),
    st.lists(steps, max_size=8),
)
def test_decide_never_returns_a_bad_step_and_respects_budgets(
    policy: dict[str, Any],
    status: ResilientTrainingJobStatus,
    cls: FailureClass,
    bad_nodes: tuple[str, ...],
    verified: list[int],
) -> None:
    spec = _spec(**policy)
    action = decide(spec, status, _found(cls, bad_nodes), NOW, verified_steps=verified)
    if isinstance(action, Restart):
        assert set(status.bad_steps) <= set(action.bad_steps)
        assert action.restarts.infrastructure <= max(
            spec.failure_policy.max_restarts, status.restarts.infrastructure
        )
        assert 0 <= action.backoff_seconds <= spec.failure_policy.backoff.max_seconds
        restarting = status.model_copy(
            update={"phase": Phase.RESTARTING, "bad_steps": list(action.bad_steps),
                    "next_attempt_at": action.not_before}
        )  # fmt: skip
        action = decide(spec, restarting, None, action.not_before, verified_steps=verified)
        assert isinstance(action, StartAttempt)
    if isinstance(action, StartAttempt) and action.resume_step is not None:
        assert action.resume_step not in status.bad_steps
        assert action.resume_step in {*verified, *_last(status)}


@settings(max_examples=200, deadline=None)
@given(statuses(phase=Phase.RESTARTING), st.lists(steps, max_size=8), st.integers(-300, 300))
def test_start_after_backoff_never_pins_a_bad_step(
    status: ResilientTrainingJobStatus, verified: list[int], offset: int
) -> None:
    now: datetime = NOW + timedelta(seconds=offset)
    action = decide(_spec(), status, None, now, verified_steps=verified)
    assert isinstance(action, Wait | StartAttempt)
    if isinstance(action, StartAttempt):
        assert action.resume_step not in status.bad_steps
        assert action.attempt == status.attempt + 1


def _last(status: ResilientTrainingJobStatus) -> set[int]:
    last = status.last_verified_checkpoint
    return set() if last is None else {last.step}


@settings(max_examples=100, deadline=None)
@given(policies, statuses(), st.sampled_from(list(FailureClass)))
def test_decide_does_not_mutate_its_inputs(
    policy: dict[str, Any], status: ResilientTrainingJobStatus, cls: FailureClass
) -> None:
    spec = _spec(**policy)
    before = (spec.model_dump(), status.model_dump())
    decide(spec, status, _found(cls, ("gpu-node-011",)), NOW)
    assert (spec.model_dump(), status.model_dump()) == before


def test_a_failed_preflight_replaces_its_node_at_once_and_spends_nothing() -> None:
    """Issue 43 section 3: no state was loaded on the bad node, so the next attempt starts
    without backoff and maxRestarts stays whole, while each failure quarantines a new node."""
    spent = _running(restarts=RestartCounts(infrastructure=2))
    action = decide(_spec(maxRestarts=2), spent, _found(C.PREFLIGHT_FAILED, ("gpu-node-011",)), NOW)
    assert isinstance(action, Restart) and action.quarantine is not None
    assert action.quarantine.nodes == ("gpu-node-011",)
    assert (action.restarts.preflight, action.restarts.infrastructure) == (1, 2)
    assert action.backoff_seconds == 0 and action.reason.value == "PreflightNodeReplaced"
    # the node is already quarantined (or none may be): an infrastructure failure as any other
    again = _running(quarantined_nodes=[_quarantined("gpu-node-011")],
                     restarts=RestartCounts(infrastructure=2, preflight=1))  # fmt: skip
    last = decide(_spec(maxRestarts=2), again, _found(C.PREFLIGHT_FAILED, ("gpu-node-011",)), NOW)
    assert isinstance(last, Fail) and last.reason.value == "RestartBudgetExhausted"
    untrusted = decide(_spec(), _running(), _found(C.PREFLIGHT_FAILED), NOW)
    assert isinstance(untrusted, Restart) and untrusted.quarantine is None
    assert untrusted.restarts.infrastructure == 1, "a verdict that blames no node spends"
