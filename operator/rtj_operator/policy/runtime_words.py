"""Which words in a pod's status are the kubelet's or the container runtime's, not the tenant's.
Pure.

Everything a container writes is the tenant speaking: its exit code (126 and 127 are what any
shell returns for a command it cannot run, and any process may exit with them) and its
termination message (`FallbackToLogsOnError` fills it from the trainer's own log; the
termination-log file is written by the trainer). Neither can prove a node bad, whatever words
it quotes.

What no container can write is the *reason* the runtime or the kubelet sets where the
tenant's code never ran:

- `state.terminated.reason` `StartError` (containerd CRI: the task could not be created or
  started; exit code 128, the message is the runtime's own error, e.g. an OCI hook's stderr)
  or `ContainerCannotRun` (dockershim/cri-dockerd, the same from dockerd);
- `status.reason` `UnexpectedAdmissionError` (the kubelet refused to admit the pod, e.g. its
  device manager could not allocate the devices the node advertised).

A container that ran (reason `Error`, `Completed`, `OOMKilled`, or none) is the trainer's
evidence, read by `text.read_message`. This module is the one place that rule is written:
`node_to_quarantine` is the only way a pod's own status names a node to quarantine.
"""

from __future__ import annotations

import re
from enum import Enum

from rtj_operator.api.reasons import FailureClass
from rtj_operator.policy.observed import PodView, Termination


class RuntimeWord(str, Enum):
    """A reason only the kubelet or the container runtime sets, before any code of the job ran."""

    START_ERROR = "StartError"
    """containerd internal/cri/server/helpers.go errorStartReason (exit code 128)."""
    CONTAINER_CANNOT_RUN = "ContainerCannotRun"
    """dockershim/cri-dockerd: dockerd could not run the container (exit code 128)."""
    UNEXPECTED_ADMISSION_ERROR = "UnexpectedAdmissionError"
    """kubelet pkg/kubelet/cm/admission/errors.go: the pod was rejected at admission."""


NEVER_STARTED = frozenset({RuntimeWord.START_ERROR, RuntimeWord.CONTAINER_CANNOT_RUN})
"""`state.terminated.reason` values of a container whose process never started."""
NEVER_ADMITTED = frozenset({RuntimeWord.UNEXPECTED_ADMISSION_ERROR})
"""`status.reason` values of a pod the kubelet refused before any container ran."""

_GPU_RUNTIME = re.compile(
    r"nvidia-container-cli: (?:initialization|detection) error|driver/library version mismatch"
    r"|nvml error: (?:driver not loaded|unknown error)|Failed to initialize NVML"
)
"""The NVIDIA container hook's words: the runtime's only where the runtime wrote them."""
_DEVICE_ADMISSION = re.compile(r"devices|nvidia\.com/|amd\.com/gpu", re.I)


def _word(reason: str, allowed: frozenset[RuntimeWord]) -> RuntimeWord | None:
    return next((w for w in allowed if w.value == reason), None)


def container_word(term: Termination) -> RuntimeWord | None:
    """The runtime's reason for a container it never started, or None: the container ran, and
    its exit code and message are the trainer's."""
    return _word(term.reason, NEVER_STARTED)


def pod_word(pod: PodView) -> RuntimeWord | None:
    """The kubelet's reason for a pod it never admitted, or None."""
    return _word(pod.reason, NEVER_ADMITTED)


def gpu_runtime_failure(term: Termination) -> str | None:
    """The NVIDIA hook's words in a message the runtime wrote (a container it never started),
    or None: the same words in a message of a container that ran are the trainer's."""
    if container_word(term) is None:
        return None
    match = _GPU_RUNTIME.search(term.message)
    return match.group(0) if match else None


def device_admission_failure(pod: PodView) -> bool:
    """The kubelet refused the pod because it could not allocate the devices it advertised."""
    return pod_word(pod) is not None and bool(_DEVICE_ADMISSION.search(pod.message))


def node_to_quarantine(
    pod: PodView, failure_class: FailureClass | None, word: RuntimeWord | None
) -> str | None:
    """The node a pod's own status proves bad: only a GPU fault the kubelet or the runtime
    reported in a reason of its own (`word`), never anything a container said."""
    if failure_class is not FailureClass.GPU_FAULT or word is None:
        return None
    return pod.node
