"""Only the kubelet's and the runtime's own reasons quarantine a node; a container's exit code
and termination message are the tenant speaking (issue 42).

The pods are the corpus's `start_error_nvidia_driver_mismatch` (containerd's StartError as
NVIDIA/gpu-operator#898 quotes it, SOURCES.md `rt.nvidia-hook`), with the reason and exit
code containerd gives a process that ran instead (`rt.cri-reasons`) where a case needs it.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from rtj_test_support import FIXTURES, NOW, load_json

from rtj_operator.api import FailureClass
from rtj_operator.policy.classify import Classification, classify_failure
from rtj_operator.policy.findings import TRAINER
from rtj_operator.policy.observed import PodView, Termination, read_pod
from rtj_operator.policy.runtime_words import (
    RuntimeWord,
    container_word,
    gpu_runtime_failure,
    node_to_quarantine,
)

CASE = FIXTURES / "classify" / "start_error_nvidia_driver_mismatch"
DRIVER_NOT_LOADED = "nvidia-container-cli: initialization error: nvml error: driver not loaded"
BAD_NODE = "gpu-node-013"
C = FailureClass


def _world(reason: str, exit_code: int, message: str) -> tuple[list[Any], list[Any]]:
    pods: list[Any] = copy.deepcopy(load_json(CASE / "pods.json")["items"])
    term = pods[3]["status"]["containerStatuses"][0]["state"]["terminated"]
    term.update(reason=reason, exitCode=exit_code, message=message)
    return pods, load_json(CASE / "nodes.json")["items"]


def _classify(reason: str, exit_code: int, message: str) -> Classification:
    pods, nodes = _world(reason, exit_code, message)
    found = classify_failure(pods, nodes, [], NOW)
    assert found is not None and found.first_failed is not None
    assert found.first_failed.node == BAD_NODE
    return found


@pytest.mark.parametrize("exit_code", [127, 126])
@pytest.mark.parametrize("reason", ["Error", ""])
def test_a_trainer_quoting_the_nvidia_hook_quarantines_nothing(reason: str, exit_code: int) -> None:
    found = _classify(reason, exit_code, DRIVER_NOT_LOADED)
    assert found.nodes_to_quarantine == ()
    assert found.decided_by is not None and found.decided_by.source == TRAINER
    assert found.failure_class is not C.GPU_FAULT or found.decided_by.suspect


def test_the_trainers_message_is_read_as_the_trainers() -> None:
    """Exit 127 with a Python exception in the log: the job's error, not "could not run"."""
    found = _classify("Error", 127, "Traceback (most recent call last):\nKeyError: 'lr'")
    assert found.failure_class is C.USER_ERROR and found.nodes_to_quarantine == ()


def _trainer(pod: PodView) -> Termination:
    return next(t for t in pod.terminations if t.container == "trainer")


def test_the_rule_reads_reasons_never_exit_codes() -> None:
    pods, _ = _world("Error", 127, DRIVER_NOT_LOADED)
    ran = _trainer(read_pod(pods[3]))
    assert ran.exit_code == 127 and DRIVER_NOT_LOADED in ran.message
    assert container_word(ran) is None and gpu_runtime_failure(ran) is None
    pods, _ = _world("StartError", 128, DRIVER_NOT_LOADED)
    pod = read_pod(pods[3])
    refused = _trainer(pod)
    assert container_word(refused) is RuntimeWord.START_ERROR
    assert gpu_runtime_failure(refused) == "nvidia-container-cli: initialization error"
    assert node_to_quarantine(pod, C.GPU_FAULT, RuntimeWord.START_ERROR) == BAD_NODE
    assert node_to_quarantine(pod, C.GPU_FAULT, None) is None
    assert node_to_quarantine(pod, C.CONFIG_ERROR, RuntimeWord.START_ERROR) is None
    pods, _ = _world("ContainerCannotRun", 128, DRIVER_NOT_LOADED)
    assert container_word(_trainer(read_pod(pods[3]))) is RuntimeWord.CONTAINER_CANNOT_RUN
