"""API conventions of the CRD (issue 44) on a real kube-apiserver (the e2e.cluster harness):
credentialsSecretRef beside the deprecated credentialsSecret, spec.managedBy (immutable; a
job managed by another controller is left alone), spec.queueName optional (JobSet alone),
and the Warning Event a deprecated field earns."""

from __future__ import annotations

from typing import Any

import pytest
from rtj_patches import refused

from e2e.operator_proc import (
    events_of,
    jobsets_of,
    rtj_body,
    rtj_status,
    running_pods,
    wait_for,
)
from rtj_operator.api import keys
from rtj_operator.api.checkpoint_spec import CREDENTIALS_CONFLICT
from rtj_operator.kube import Kube
from rtj_operator.kube_errors import Invalid

pytestmark = [pytest.mark.cluster, pytest.mark.operator]

FILE_URI = "file:///mnt/ckpt/llm"
MULTIKUEUE = "kueue.x-k8s.io/multikueue"


def test_the_api_server_holds_the_new_fields_to_their_rules(rtj_api: Kube, rtj_ns: Any) -> None:
    ns = rtj_ns.name
    # two different Secrets: refused, naming both fields
    both = {"uri": FILE_URI, "credentialsSecret": "a", "credentialsSecretRef": {"name": "b"}}
    with pytest.raises(Invalid) as err:
        rtj_api.create_rtj(ns, rtj_body("two", ns, FILE_URI, checkpoint=both))
    assert CREDENTIALS_CONFLICT in str(err.value)
    same = {**both, "credentialsSecretRef": {"name": "a"}}
    rtj_api.create_rtj(ns, rtj_body("same", ns, FILE_URI, checkpoint=same))
    # managedBy: a domain-prefixed path, immutable (nor set, changed or removed)
    with pytest.raises(Invalid):
        rtj_api.create_rtj(ns, rtj_body("bad", ns, FILE_URI, managedBy="multikueue"))
    rtj_api.create_rtj(ns, rtj_body("mk", ns, FILE_URI, managedBy=MULTIKUEUE))
    assert "immutable" in refused(rtj_api, ns, "mk", {"managedBy": "example.com/x"}, "managedBy")
    refused(rtj_api, ns, "mk", {"managedBy": None}, "managedBy")
    refused(rtj_api, ns, "same", {"managedBy": MULTIKUEUE}, "managedBy")
    # queueName is optional now
    body = rtj_body("free", ns, FILE_URI)
    body["spec"].pop("queueName")
    rtj_api.create_rtj(ns, body)
    assert "queueName" not in rtj_api.get_rtj(ns, "free")["spec"]


def test_managed_elsewhere_is_left_alone_and_no_queue_runs_by_jobset_alone(
    rtj_api: Kube, rtj_ns: Any, run_operator: Any
) -> None:
    ns = rtj_ns.name
    run_operator()
    rtj_api.create_rtj(ns, rtj_body("mk", ns, FILE_URI, managedBy=MULTIKUEUE))
    body = rtj_body("free", ns, FILE_URI, nodeHealth={"taintKey": "team-a.example/own"})
    body["spec"].pop("queueName")
    rtj_api.create_rtj(ns, body)
    wait_for("the job without a queue to run", lambda: running_pods(rtj_api, ns, "free", 1, 2), 90)
    (js,) = jobsets_of(rtj_api, ns, "free")
    assert keys.KUEUE_QUEUE_LABEL not in js["metadata"]["labels"]
    admitted = wait_for(  # the pods may run a poll before the status says so
        "Admitted",
        lambda: next((c for c in rtj_status(rtj_api, ns, "free").get("conditions", [])
                      if c["type"] == "Admitted" and c["status"] == "True"), None),
        30,
    )  # fmt: skip
    assert "without Kueue" in admitted["message"]
    warned = wait_for(
        "the deprecation warning",
        lambda: [e for e in events_of(rtj_api, ns, "free") if e["reason"] == "DeprecatedField"],
        30,
    )
    assert warned[0]["type"] == "Warning" and "nodeHealth.taintKey" in warned[0]["message"]
    # by then the operator has long seen the other job: it created nothing, wrote nothing
    assert jobsets_of(rtj_api, ns, "mk") == []
    assert rtj_status(rtj_api, ns, "mk") == {}
    assert events_of(rtj_api, ns, "mk") == []
