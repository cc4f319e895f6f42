"""Why a pod failed, from what its kubelet, the control plane and its container wrote. Pure.

Each function reads one part of a pod (a container termination, a DisruptionTarget
condition, status.reason, a waiting container, its deletion, its events) and returns the
failures it shows, each with its source, so that `classify` can rank them and tell node-level
evidence (which may quarantine) from a trainer's words (which may not). Which of a pod's words
are the runtime's, and so may quarantine, is decided in one place: `runtime_words`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from rtj_operator.api.keys import RESUME_INIT_CONTAINER
from rtj_operator.api.reasons import FailureClass
from rtj_operator.policy import runtime_words, text
from rtj_operator.policy.findings import (
    CONTROL_PLANE,
    KUBELET,
    PLATFORM,
    TRAINER,
    Finding,
    iso,
    who,
)
from rtj_operator.policy.init_result import parse_init_result
from rtj_operator.policy.observed import EventView, PodView, Termination, Waiting, first_line
from rtj_operator.policy.pod_security import root_refusal_hint
from rtj_operator.policy.preflight import PREFLIGHT_INIT_CONTAINER, preflight_finding

C = FailureClass
CONFIG_ERROR_GRACE = timedelta(seconds=120)
"""Image pulls and missing Secrets can be transient: stuck this long, they are failures."""

_WAITING_NOW = frozenset({"InvalidImageName", "ErrImageNeverPull"})
_PULL_WAITING = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "RegistryUnavailable", "SignatureValidationFailed"}
)
_CONFIG_WAITING = frozenset({"CreateContainerConfigError", "CreateContainerError"})
_GRACEFUL_SHUTDOWN = "Pod was terminated in response to imminent node shutdown."
_NODE_PRESSURE = ("The node was low on resource", "The node had condition")
_OWN_LIMIT = re.compile(
    r"exceeds the total limit of containers|exceeded its local ephemeral storage limit"
    r"|Usage of EmptyDir volume .* exceeds the limit"
)
_POD_EVENTS = {
    "Evicted": C.EVICTED,
    "Preempted": C.PREEMPTED,
    "TaintManagerEviction": C.EVICTED,
    "NodeNotReady": C.NODE_LOST,  # node-controller MarkPodsNotReady: "Node is not ready"
}


READ_EVENT_REASONS = frozenset(
    {*_POD_EVENTS, runtime_words.RuntimeWord.UNEXPECTED_ADMISSION_ERROR.value}
)


@dataclass(frozen=True)
class PodContext:
    quarantine_codes: frozenset[int]
    events: Sequence[EventView]
    pulled_images: frozenset[str]
    """Images some pod of the attempt started: they can be pulled, somewhere."""
    now: datetime
    preflight_image: str | None = None
    """The platform's preflight image: a failed preflight that ran it blames its node."""


# --- one container termination ------------------------------------------------------------


def _cannot_run(term: Termination) -> tuple[FailureClass, str]:
    """StartError/ContainerCannotRun: the runtime refused before any code of the job ran, and
    wrote the message itself (`runtime_words`)."""
    if words := runtime_words.gpu_runtime_failure(term):
        return C.GPU_FAULT, f"the node's GPU runtime failed to start it ({words})"
    return C.CONFIG_ERROR, f"could not run ({term.reason})"


def _init_verdict(term: Termination) -> tuple[FailureClass, str]:
    """The resume init container reports in JSON (`rtj-shim resolve --termination-log`):
    exit 1 with a verdict and no step is a checkpoint that failed verification; exit 2 a
    usage error; an `error` a store that could not be read. Anything else, a crash with no
    JSON (an image without boto3, say), proves nothing about the checkpoint."""
    result = parse_init_result(term.message)
    if result is None:
        return C.UNKNOWN, "the resume init container failed without its JSON verdict"
    if result.error is not None:
        if term.exit_code == 2:
            return C.CONFIG_ERROR, f"rtj-shim usage error: {result.error}"
        return C.UNKNOWN, f"the checkpoint store could not be read: {result.error}"
    if term.exit_code == 1 and result.step is None:
        skipped = "; ".join(f"{s}: {why}" for s, why in result.skipped[:3])
        return C.CHECKPOINT_CORRUPT, "no checkpoint step verified" + (
            f" ({skipped})" if skipped else ""
        )
    return C.UNKNOWN, f"the resume init container exited {term.exit_code} after verifying"


def _blamed_node(
    pod: PodView, cls: FailureClass, word: runtime_words.RuntimeWord | None, source: str
) -> str | None:
    """The node a finding proves bad: the runtime's own word on a GPU fault, or the
    platform's preflight run in the platform's image."""
    if source == PLATFORM and cls is C.PREFLIGHT_FAILED:
        return pod.node
    return runtime_words.node_to_quarantine(pod, cls, word)


def termination(pod: PodView, term: Termination, ctx: PodContext) -> Finding | None:
    if term.exit_code in (0, None) and term.reason != "OOMKilled":
        return None
    source, suspect, rank, verdict = KUBELET, False, None, None
    hints: tuple[str, ...] = ()
    word = runtime_words.container_word(term)
    if term.reason == "OOMKilled":
        cls, why = C.OUT_OF_MEMORY, "OOMKilled (the container's memory limit)"
    elif word is not None:
        cls, why = _cannot_run(term)
    elif term.init and term.container == RESUME_INIT_CONTAINER:
        cls, why = _init_verdict(term)
    elif term.init and term.container == PREFLIGHT_INIT_CONTAINER:
        cls, why, blamed = preflight_finding(
            term.message, term.exit_code, term.image, ctx.preflight_image
        )
        source = PLATFORM if blamed else source
    elif term.init:
        cls, why = C.CONFIG_ERROR, "an init container failed"
    else:
        reading = text.read_message(term.message, ctx.quarantine_codes)
        cls, why, suspect, rank = reading.failure_class, reading.why, reading.suspect, reading.rank
        hints, verdict = reading.hints, reading.verdict
        source = TRAINER
    detail = first_line(term.message)
    detail = "" if detail and detail in why else detail
    noted = "".join(f"; {h}" for h in hints)
    suspicion = "; suspect only: no node-level evidence yet" if suspect else ""
    return Finding(
        cls,
        f"{who(pod)}: container {term.container} exited {term.exit_code} at "
        f"{iso(term.finished_at)}: {why}{noted}{suspicion}" + (f": {detail}" if detail else ""),
        at=term.finished_at,
        container=term.container,
        exit_code=term.exit_code,
        quarantine=_blamed_node(pod, cls, word, source),
        rank=rank,
        source=source,
        signal=f"pod {pod.name} container {term.container} state.terminated"
        + (" message" if source == TRAINER else f" reason {term.reason or '-'}"),
        suspect=suspect,
        verdict=verdict,
    )


# --- the pod object ------------------------------------------------------------------------


def planned_shutdown(pod: PodView) -> bool:
    return pod.reason == "Terminated" and pod.message.startswith(_GRACEFUL_SHUTDOWN)


def _evicted_class(message: str) -> tuple[FailureClass, str]:
    if _OWN_LIMIT.search(message):
        return C.USER_ERROR, "evicted for exceeding its own limit"
    if message.startswith(_NODE_PRESSURE):
        return C.EVICTED, "evicted: the node ran short"
    return C.EVICTED, "evicted"


def disruption(pod: PodView) -> list[Finding]:
    cond = pod.condition("DisruptionTarget")
    if cond is None:
        return []
    reason = cond.reason
    cls = {
        "PreemptionByScheduler": C.PREEMPTED,
        "DeletionByPodGC": C.NODE_LOST,
        "EvictionByEvictionAPI": C.EVICTED,
        "DeletionByTaintManager": C.EVICTED,
    }.get(reason, C.UNKNOWN)
    if reason == "TerminationByKubelet":
        cls = C.NODE_LOST if planned_shutdown(pod) else _evicted_class(cond.message)[0]
    source = KUBELET if reason == "TerminationByKubelet" else CONTROL_PLANE
    return [
        Finding(
            cls,
            f"{who(pod)}: DisruptionTarget {reason} at {iso(cond.since)}: {cond.message}",
            at=cond.since,
            source=source,
            signal=f"pod {pod.name} condition DisruptionTarget ({reason})",
        )
    ]


def status_reason(pod: PodView) -> list[Finding]:
    """status.reason: Evicted (pressure or its own limit), a graceful node shutdown, or an
    admission the kubelet rejected because a device could not be allocated."""
    signal = f"pod {pod.name} status.reason {pod.reason}"
    line = f"{who(pod)}: status {pod.reason}: {pod.message}"
    if pod.reason == "Evicted":
        cls, why = _evicted_class(pod.message)
        return [Finding(cls, f"{line} ({why})", source=KUBELET, signal=signal)]
    if planned_shutdown(pod):
        return [
            Finding(
                C.NODE_LOST,
                f"{line} (a planned node shutdown: not the node's fault)",
                source=KUBELET,
                signal=signal,
            )
        ]
    if word := runtime_words.pod_word(pod):
        if runtime_words.device_admission_failure(pod):
            return [
                Finding(
                    C.GPU_FAULT,
                    f"{line} (the node cannot allocate the devices it advertised)",
                    at=pod.scheduled_at,
                    quarantine=runtime_words.node_to_quarantine(pod, C.GPU_FAULT, word),
                    source=KUBELET,
                    signal=signal,
                )
            ]
        return [Finding(C.UNKNOWN, line, at=pod.scheduled_at, source=KUBELET, signal=signal)]
    if pod.reason == "NodeLost":  # kubelets before the DisruptionTarget condition
        return [Finding(C.NODE_LOST, line, source=CONTROL_PLANE, signal=signal)]
    return []


def _pull_failure(pod: PodView, w: Waiting, ctx: PodContext) -> tuple[FailureClass, str]:
    if w.reason in _WAITING_NOW:
        return C.CONFIG_ERROR, "the image cannot be used as named"
    if w.image and w.image in ctx.pulled_images:
        return C.IMAGE_PULL_FAILED, "other pods of this attempt pulled the same image"
    said = [
        e.message
        for e in ctx.events
        if e.kind == "Pod" and e.name == pod.name and e.message.startswith("Failed to pull image")
    ]
    return text.read_pull_error("\n".join([w.reason, w.message, *said]))


def waiting(pod: PodView, ctx: PodContext) -> list[Finding]:
    onset = pod.scheduled_at
    stuck = onset is not None and ctx.now - onset >= CONFIG_ERROR_GRACE
    found = []
    for w in pod.waiting:
        if w.reason in _WAITING_NOW or (stuck and w.reason in _PULL_WAITING):
            cls, why = _pull_failure(pod, w, ctx)
        elif stuck and w.reason in _CONFIG_WAITING:
            cls, why = C.CONFIG_ERROR, "its configuration cannot be satisfied"
            if hint := root_refusal_hint(w.message or ""):
                why = f"{why}: {hint}"
        else:
            continue
        found.append(
            Finding(
                cls,
                f"{who(pod)}: container {w.container} waiting: {w.reason}: {w.message} ({why})",
                at=onset,
                container=w.container,
                source=KUBELET,
                signal=f"pod {pod.name} container {w.container} state.waiting {w.reason}",
            )
        )
    return found


def deleted(pod: PodView) -> list[Finding]:
    if pod.deletion_onset is None:
        return []
    at = pod.deletion_onset
    return [
        Finding(
            C.UNKNOWN,
            f"{who(pod)}: deleted at {iso(at)}",
            at=at,
            source=CONTROL_PLANE,
            signal=f"pod {pod.name} metadata.deletionTimestamp",
        )
    ]


def _event_class(e: EventView) -> FailureClass:
    return _evicted_class(e.message)[0] if e.reason == "Evicted" else _POD_EVENTS[e.reason]


def pod_events(pod: PodView, events: Sequence[EventView]) -> list[Finding]:
    return [
        Finding(
            _event_class(e),
            f"{who(pod)}: event {e.reason} at {iso(e.at)}: {e.message}",
            at=e.at,
            source=CONTROL_PLANE,
            signal=f"pod {pod.name} event {e.reason} ({e.api})",
        )
        for e in events
        if e.kind == "Pod" and e.name == pod.name and e.reason in _POD_EVENTS
    ]
