"""The lifecycle fields and the immutability rules on a real kube-apiserver (the e2e.cluster
harness: real JobSet and Kueue controllers, KWOK nodes, the operator as a process).

- The CRD's CEL transition rules: checkpoint.uri and runId never change; replicas,
  template and trainerContainer only while the job is suspended; the rest may change.
- suspend and resume: the running attempt's JobSet and pods go, phase Suspended; the resume
  starts the next attempt, no budget spent.
- activeDeadlineSeconds: the job fails with DeadlineExceeded; ttlSecondsAfterFinished: the
  operator deletes it (foreground), under the chart's least-privilege rules' new `delete`.
"""

from __future__ import annotations

from typing import Any

import pytest
from rtj_patches import patch_spec, refused

from e2e.operator_proc import (
    events_of,
    jobsets_of,
    pods_of,
    rtj_body,
    rtj_status,
    running_pods,
    wait_for,
)
from rtj_operator.kube import Kube
from rtj_operator.kube_errors import Invalid, NotFound

pytestmark = [pytest.mark.cluster, pytest.mark.operator]

FILE_URI = "file:///mnt/ckpt/llm"


def _trainer(image: str) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "trainer", "image": image, "command": ["x"]}]}}


# --- CEL transition rules (no operator: the API server alone) ---------------------------------


def test_fields_unsafe_to_change_mid_run_are_refused_by_the_api_server(
    rtj_api: Kube, rtj_ns: Any
) -> None:
    ns = rtj_ns.name
    rtj_api.create_rtj(ns, rtj_body("cel", ns, "s3://bucket/a", runId="run-a"))
    assert "another store" in refused(
        rtj_api, ns, "cel", {"checkpoint": {"uri": "s3://bucket/b"}}, "checkpoint.uri"
    )
    refused(rtj_api, ns, "cel", {"runId": "run-b"}, "runId")
    refused(rtj_api, ns, "cel", {"runId": None}, "runId")  # removing it changes the run too
    refused(rtj_api, ns, "cel", {"replicas": 3}, "replicas")
    # the image is not a declared field of the template's schema: equality still sees it
    assert "suspended" in refused(rtj_api, ns, "cel", {"template": _trainer("img:2")}, "template")
    refused(rtj_api, ns, "cel", {"trainerContainer": "trainer"}, "trainerContainer")
    # what may change while the job runs
    spec = patch_spec(
        rtj_api, ns, "cel",
        {"activeDeadlineSeconds": 7200, "ttlSecondsAfterFinished": 600, "queueName": "team-b",
         "failurePolicy": {"maxRestarts": 9}, "checkpoint": {"plannedIntervalSeconds": 60}},
    )["spec"]  # fmt: skip
    assert (spec["activeDeadlineSeconds"], spec["failurePolicy"]["maxRestarts"]) == (7200, 9)
    # suspended (in the same update or an earlier one): the next attempt may change
    spec = patch_spec(
        rtj_api, ns, "cel", {"suspend": True, "replicas": 3, "template": _trainer("img:2")}
    )["spec"]
    assert spec["replicas"] == 3 and spec["template"]["spec"]["containers"][0]["image"] == "img:2"
    spec = patch_spec(rtj_api, ns, "cel", {"suspend": False, "replicas": 4})["spec"]
    assert (spec["suspend"], spec["replicas"]) == (False, 4)
    refused(rtj_api, ns, "cel", {"replicas": 2}, "replicas")  # running again
    # the store and the run stay immutable even while suspended
    refused(rtj_api, ns, "cel", {"suspend": True, "checkpoint": {"uri": "s3://b/c"}},
             "checkpoint.uri")  # fmt: skip
    # the operator's status writes are not spec updates
    rtj_api.patch_rtj_status(ns, "cel", {"phase": "Pending"}, None)


def test_lifecycle_bounds_are_validated(rtj_api: Kube, rtj_ns: Any) -> None:
    ns = rtj_ns.name
    for name, spec in (("zero", {"activeDeadlineSeconds": 0}),
                       ("negative", {"ttlSecondsAfterFinished": -1})):  # fmt: skip
        with pytest.raises(Invalid):
            rtj_api.create_rtj(ns, rtj_body(name, ns, FILE_URI, **spec))
    rtj_api.create_rtj(ns, rtj_body("ok", ns, FILE_URI, ttlSecondsAfterFinished=0))
    assert rtj_api.get_rtj(ns, "ok")["spec"]["suspend"] is False, "suspend defaults to false"


def test_the_planned_interval_is_seconds_or_auto(rtj_api: Kube, rtj_ns: Any) -> None:
    """`plannedIntervalSeconds` is an int-or-string: seconds >= 1 or `auto` (issue 48); the
    CEL rule's message names the field, the default stays 600."""
    ns = rtj_ns.name
    for name, bad in (("zero", 0), ("word", "often"), ("text", "60")):
        body = rtj_body(name, ns, FILE_URI, checkpoint={"uri": FILE_URI,
                                                        "plannedIntervalSeconds": bad})  # fmt: skip
        with pytest.raises(Invalid) as err:
            rtj_api.create_rtj(ns, body)
        assert "checkpoint.plannedIntervalSeconds: expected seconds >= 1 or 'auto'" in str(
            err.value
        )
    auto = {"uri": FILE_URI, "plannedIntervalSeconds": "auto"}
    rtj_api.create_rtj(ns, rtj_body("auto", ns, FILE_URI, checkpoint=auto))
    assert rtj_api.get_rtj(ns, "auto")["spec"]["checkpoint"]["plannedIntervalSeconds"] == "auto"
    rtj_api.create_rtj(ns, rtj_body("plain", ns, FILE_URI))
    assert rtj_api.get_rtj(ns, "plain")["spec"]["checkpoint"]["plannedIntervalSeconds"] == 600
    # the fast tier's interval too; a drain needs a fixed one (its steps are multiples)
    fast = {"uri": FILE_URI, "fastTier": {"everySteps": "auto"}}
    rtj_api.create_rtj(ns, rtj_body("fast-auto", ns, FILE_URI, checkpoint=fast,
                                    recovery={"inPlace": True}))  # fmt: skip
    stored = rtj_api.get_rtj(ns, "fast-auto")["spec"]["checkpoint"]["fastTier"]
    assert stored["everySteps"] == "auto"
    drained = {"uri": FILE_URI, "fastTier": {"everySteps": "auto", "drainEverySteps": 100}}
    with pytest.raises(Invalid) as err:
        rtj_api.create_rtj(ns, rtj_body("drained", ns, FILE_URI, checkpoint=drained,
                                        recovery={"inPlace": True}))  # fmt: skip
    assert "a drain cannot follow `auto`" in str(err.value)


def test_a_fast_tier_needs_a_restart_in_place(rtj_api: Kube, rtj_ns: Any) -> None:
    """spec.checkpoint.fastTier (issue 16): the spec-wide CEL rule names the field."""
    ns = rtj_ns.name
    checkpoint = {"uri": FILE_URI, "fastTier": {"everySteps": 20, "sizeLimit": "8Gi"}}
    with pytest.raises(Invalid) as err:
        rtj_api.create_rtj(ns, rtj_body("fast", ns, FILE_URI, checkpoint=checkpoint))
    assert "spec.checkpoint.fastTier needs spec.recovery.inPlace: true" in str(err.value)
    for name, fast in (("zero", {"everySteps": 0}), ("keep", {"everySteps": 5, "keep": 1}),
                       ("size", {"everySteps": 5, "sizeLimit": "-1Gi"}),
                       ("peers", {"everySteps": 5, "peerReplicas": 2})):  # fmt: skip
        body = rtj_body(name, ns, FILE_URI, recovery={"inPlace": True},
                        checkpoint={"uri": FILE_URI, "fastTier": fast})  # fmt: skip
        with pytest.raises(Invalid):
            rtj_api.create_rtj(ns, body)
    rtj_api.create_rtj(ns, rtj_body("fast", ns, FILE_URI, checkpoint=checkpoint,
                                    recovery={"inPlace": True}))  # fmt: skip
    stored = rtj_api.get_rtj(ns, "fast")["spec"]["checkpoint"]["fastTier"]
    assert stored == {
        "everySteps": 20,
        "keep": 2,
        "medium": "Memory",
        "peerReplicas": 1,
        "sizeLimit": "8Gi",
    }
    # turning inPlace off under it is refused too
    assert "fastTier" in refused(rtj_api, ns, "fast", {"recovery": {"inPlace": False}},
                                  "checkpoint.fastTier")  # fmt: skip


def test_elastic_needs_replacing_restarts_and_a_wait_within_their_deadline(
    rtj_api: Kube, rtj_ns: Any
) -> None:
    """spec.elastic (issue 45): the API server's CEL rules name the field and the reason."""
    ns = rtj_ns.name
    in_place = {"inPlace": True}
    cases = (
        ("above", {"minReplicas": 5}, in_place, "spec.elastic.minReplicas must be at most"),
        ("off", {"minReplicas": 1}, {}, "spec.elastic.minReplicas below spec.replicas needs"),
        ("late", {"minReplicas": 1, "waitForReplacementSeconds": 60}, in_place,
         "spec.elastic.waitForReplacementSeconds must be less than"),
        ("zero", {"minReplicas": 0}, in_place, "minReplicas"),
    )  # fmt: skip
    for name, elastic, recovery, message in cases:
        body = rtj_body(name, ns, FILE_URI, replicas=4, elastic=elastic, recovery=recovery)
        with pytest.raises(Invalid) as err:
            rtj_api.create_rtj(ns, body)
        assert message in str(err.value), (name, str(err.value))
    rtj_api.create_rtj(ns, rtj_body("on", ns, FILE_URI, replicas=4, elastic={"minReplicas": 3},
                                    recovery=in_place))  # fmt: skip
    stored = rtj_api.get_rtj(ns, "on")["spec"]["elastic"]
    assert stored == {"minReplicas": 3, "waitForReplacementSeconds": 30, "growBack": True}
    rtj_api.create_rtj(ns, rtj_body("plain", ns, FILE_URI, replicas=4))
    assert rtj_api.get_rtj(ns, "plain")["spec"]["elastic"] == {
        "waitForReplacementSeconds": 30,
        "growBack": True,
    }, "not elastic unless asked"


def test_a_preload_needs_a_restart_in_place_and_module_names(rtj_api: Kube, rtj_ns: Any) -> None:
    """spec.recovery.inPlacePreload (issue 15): only with inPlace, only dotted module names."""
    ns = rtj_ns.name
    with pytest.raises(Invalid) as err:
        rtj_api.create_rtj(ns, rtj_body("warm", ns, FILE_URI,
                                        recovery={"inPlacePreload": ["torch"]}))  # fmt: skip
    assert "spec.recovery.inPlacePreload needs spec.recovery.inPlace: true" in str(err.value)
    for bad in (["torch; rm -rf /"], ["1torch"], ["torch."]):
        with pytest.raises(Invalid):
            rtj_api.create_rtj(ns, rtj_body("bad", ns, FILE_URI,
                               recovery={"inPlace": True, "inPlacePreload": bad}))  # fmt: skip
    warm = {"inPlace": True, "inPlacePreload": ["torch", "rtj_shim.torch"]}
    rtj_api.create_rtj(ns, rtj_body("warm", ns, FILE_URI, recovery=warm))
    stored = rtj_api.get_rtj(ns, "warm")["spec"]["recovery"]["inPlacePreload"]
    assert stored == ["torch", "rtj_shim.torch"]


# --- suspend, resume, deadline and TTL with the operator -------------------------------------


def test_suspend_stops_the_attempt_and_resume_starts_the_next_one(
    rtj_api: Kube, rtj_ns: Any, run_operator: Any
) -> None:
    ns = rtj_ns.name
    run_operator()
    rtj_api.create_rtj(ns, rtj_body("llm", ns, FILE_URI))
    wait_for("attempt 1 to run", lambda: running_pods(rtj_api, ns, "llm", 1, 2), 90)
    patch_spec(rtj_api, ns, "llm", {"suspend": True})
    wait_for(
        "the old world to go",
        lambda: not jobsets_of(rtj_api, ns, "llm") and not pods_of(rtj_api, ns, "llm"),
        90,
    )
    status = rtj_status(rtj_api, ns, "llm")
    assert status["phase"] == "Suspended"
    assert status["attempts"][-1]["endReason"] == "Suspended"
    suspended = next(c for c in status["conditions"] if c["type"] == "Suspended")
    assert (suspended["status"], suspended["reason"]) == ("True", "JobSuspended")
    # resized while suspended: the resume starts attempt 2 at the new size, no budget spent
    patch_spec(rtj_api, ns, "llm", {"replicas": 3, "suspend": False})
    wait_for("attempt 2 to run", lambda: running_pods(rtj_api, ns, "llm", 2, 3), 90)
    status = rtj_status(rtj_api, ns, "llm")
    assert status["restarts"]["infrastructure"] == 0
    assert [js["metadata"]["name"] for js in jobsets_of(rtj_api, ns, "llm")] == ["llm-a2"]
    reasons = {e["reason"] for e in events_of(rtj_api, ns, "llm")}
    assert {"Suspended", "Resumed"} <= reasons


def test_past_its_deadline_the_job_fails_and_is_deleted_after_its_ttl(
    rtj_api: Kube, rtj_ns: Any, run_operator: Any
) -> None:
    ns = rtj_ns.name
    op = run_operator()
    rtj_api.create_rtj(
        ns, rtj_body("llm", ns, FILE_URI, activeDeadlineSeconds=10, ttlSecondsAfterFinished=8)
    )
    wait_for("attempt 1 to run", lambda: running_pods(rtj_api, ns, "llm", 1, 2), 90)
    failed = wait_for(
        "the deadline to fail the job",
        lambda: (s := rtj_status(rtj_api, ns, "llm")).get("phase") == "Failed" and s,
        60,
    )
    condition = next(c for c in failed["conditions"] if c["type"] == "Failed")
    assert condition["reason"] == "DeadlineExceeded"
    assert failed["attempts"][-1]["failureCategory"] == "user"
    wait_for(
        "a warning, not a page",
        lambda: op.metric("rtj_job_failed", namespace=ns, name="llm", category="user") == 1,
        5,
    )

    def gone() -> bool:
        try:
            rtj_api.get_rtj(ns, "llm")
        except NotFound:
            return True
        return False

    wait_for("ttlSecondsAfterFinished to delete the job", gone, 60)
    assert not jobsets_of(rtj_api, ns, "llm"), "foreground: its JobSets went first"
