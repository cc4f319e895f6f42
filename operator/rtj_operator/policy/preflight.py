"""The preflight: the platform's check that a new world may train (issue 43 section 3). Pure.

Every worker pod of an attempt gets a first init container, ``rtj-preflight``, running
``rtj-shim preflight`` (`rtj_shim.agent.preflight`) in the platform's image with the
platform's node-local command: a ring transfer across the new world, then the node check.
A pod that fails ends with the verdict in its termination message (`preflight_finding`): its
node is quarantined as ``PreflightFailed`` and the attempt replaced, without spending the
user's budget while each failure quarantines a new node (`policy.decide`).

Who speaks: the container's image and command are the platform's (the operator's
configuration, ``preflight`` in ``--platform-config``; its image defaults to the platform's
resolver image), never the job's. A verdict quarantines a node only when its node check
failed and the kubelet reports that the container ran the platform's image (a tenant who
edits its own pod's image gets a restart, never a quarantine). The ring's verdict is measured
with the job's own pods, which the tenant can slow (it runs pods beside them and can read
its job's key): it never taints a node; the job's next attempt avoids that node
(`render.avoided_nodes`), no one else's. Without a platform image the job gets no
preflight: the trainer's image is the tenant's.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rtj_operator.api import keys
from rtj_operator.api.reasons import FailureClass
from rtj_shim.wire.preflight_verdict import PreflightCheck, PreflightVerdict, PreflightVerdictError

Obj = dict[str, Any]

PREFLIGHT_INIT_CONTAINER = "rtj-preflight"
DEFAULT_NODE_COMMAND: tuple[str, ...] = ("dcgmi", "diag", "-r", "1")
"""NVIDIA DCGM's quick diagnostic (run level 1: software, PCIe, memory checks; seconds).
Skipped with a note where the image has no ``dcgmi`` (a CPU node, an image without DCGM)."""
PREFLIGHT_RESOURCES: Obj = {
    "requests": {"cpu": "100m", "memory": "64Mi"},
    "limits": {"memory": "256Mi"},
}


class PreflightConfigError(ValueError):
    """The platform's ``preflight`` block is malformed; names the field."""


@dataclass(frozen=True)
class PreflightPolicy:
    """The platform's preflight settings (``preflight:`` in ``--platform-config``)."""

    image: str | None = None
    """The preflight's image (it must contain rtj-shim, and the node command's program);
    None: the platform's resolver image."""
    node_command: tuple[str, ...] = DEFAULT_NODE_COMMAND

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> PreflightPolicy:
        unknown = sorted(set(raw) - {"image", "nodeCommand"})
        if unknown:
            raise PreflightConfigError(
                f"preflight: unknown field(s) {', '.join(unknown)}; expected image, nodeCommand"
            )
        image = raw.get("image")
        if image is not None and (not isinstance(image, str) or not image):
            raise PreflightConfigError("preflight.image: expected an image reference")
        command = raw.get("nodeCommand", list(DEFAULT_NODE_COMMAND))
        if not isinstance(command, list) or not all(isinstance(c, str) and c for c in command):
            raise PreflightConfigError(
                "preflight.nodeCommand: expected a list of strings (a command, no shell); "
                "[] for none"
            )
        return cls(image, tuple(command))

    def image_for(self, resolver_image: str | None) -> str | None:
        """The platform's image for the preflight; None: the platform has none."""
        return self.image or resolver_image


def preflight_command(spec_timeout: int, factor: float, node_command: Sequence[str]) -> list[str]:
    return [
        "rtj-shim", "preflight", "--timeout", str(spec_timeout), "--factor", f"{factor:g}",
        "--termination-log", keys.TERMINATION_LOG, "--", *node_command,
    ]  # fmt: skip


def preflight_container(
    image: str,
    node_command: Sequence[str],
    timeout_seconds: int,
    bandwidth_factor: float,
    rendezvous_env: Sequence[Obj],
    key_env: Sequence[Obj],
    security_context: Obj,
) -> Obj:
    """The ``rtj-preflight`` init container: the trainer's rendezvous (rank 0's address and
    port, the world size, the pod's rank), its own address, whether the Job re-created it
    (a replacement pod: the node check alone), its node's name (``RTJ_NODE_NAME``, for the
    node command), and the job's key to sign with."""
    pod_ip = {"name": "RTJ_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    node = {"name": "RTJ_NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    failures_at = f"metadata.annotations['{keys.JOB_INDEX_FAILURE_COUNT}']"
    failures = {
        "name": keys.ENV_INDEX_FAILURES,
        "valueFrom": {"fieldRef": {"fieldPath": failures_at}},
    }
    return {
        "name": PREFLIGHT_INIT_CONTAINER,
        "image": image,
        "command": preflight_command(timeout_seconds, bandwidth_factor, node_command),
        "env": [
            *(copy.deepcopy(e) for e in rendezvous_env),
            pod_ip,
            node,
            failures,
            *(copy.deepcopy(e) for e in key_env),
        ],
        "resources": copy.deepcopy(PREFLIGHT_RESOURCES),
        "terminationMessagePath": keys.TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": copy.deepcopy(security_context),
    }


def same_image(reported: str, platform: str) -> bool:
    """Whether the image the kubelet reports running is the platform's: runtimes report a
    short name fully qualified (``foo:1`` as ``docker.io/library/foo:1``)."""

    def plain(ref: str) -> str:
        for prefix in ("docker.io/library/", "docker.io/", "index.docker.io/library/"):
            if ref.startswith(prefix):
                return ref[len(prefix) :]
        return ref

    return bool(reported) and plain(reported) == plain(platform)


def preflight_finding(
    message: str, exit_code: int | None, ran_image: str, platform_image: str | None
) -> tuple[FailureClass, str, bool]:
    """What a failed ``rtj-preflight`` container means: the class, why, and whether its node
    may be quarantined (a verdict from the platform's image, failing its pod)."""
    try:
        verdict = PreflightVerdict.parse(message)
    except PreflightVerdictError:
        return FailureClass.UNKNOWN, "the preflight failed without its JSON verdict", False
    if verdict.passed:
        why = f"the preflight exited {exit_code} after passing"
        return FailureClass.UNKNOWN, why, False
    platforms = platform_image is not None and same_image(ran_image, platform_image)
    check = verdict.check.value if verdict.check is not None else "preflight"
    why = f"failed the platform's {check} check: {verdict.reason[:400]}"
    if not platforms:
        why += f" (image {ran_image or '?'} is not the platform's: its node is not blamed)"
    elif verdict.check is not PreflightCheck.NODE:
        why += (" (a link measured with the job's own pods, which the tenant runs beside: "
                "this job's next attempt avoids the node, no one else's does)")  # fmt: skip
    return FailureClass.PREFLIGHT_FAILED, why, platforms and verdict.check is PreflightCheck.NODE


RENDEZVOUS_ENV = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "NODE_RANK")


def with_preflight(
    jobset: Obj, image: str, node_command: Sequence[str], timeout_seconds: int, factor: float
) -> Obj:
    """`jobset` with the preflight as the first init container of every pod template: the
    workers' (the collective test and the node check) and the warm spares' (the node check
    alone: a spare joins a world already past it). The env it needs is the rendered pod's
    own (the trainer's rendezvous, the sidecar's key), the security context the resume init
    container's."""
    out = copy.deepcopy(jobset)
    for replicated in out["spec"]["replicatedJobs"]:
        spec = replicated["template"]["spec"]["template"]["spec"]
        containers = {c["name"]: c for c in [*spec.get("initContainers", []), *spec["containers"]]}
        env = [
            e for c in spec["containers"] for e in c.get("env", []) if e["name"] in RENDEZVOUS_ENV
        ]
        rendezvous = list({e["name"]: e for e in env}.values())
        sidecar = containers.get(keys.PROGRESS_SIDECAR, {})
        key_env = [e for e in sidecar.get("env", []) if e["name"] == keys.ENV_CONTROL_KEY]
        resolver = containers.get(keys.RESUME_INIT_CONTAINER) or sidecar
        container = preflight_container(
            image, node_command, timeout_seconds, factor, rendezvous, key_env,
            resolver.get("securityContext") or {},
        )  # fmt: skip
        if replicated["name"] == keys.SPARE_REPLICATED_JOB:
            container["env"].append({"name": keys.ENV_SPARE, "value": "1"})
        kept = [c for c in spec.get("initContainers", []) if c["name"] != PREFLIGHT_INIT_CONTAINER]
        spec["initContainers"] = [container, *kept]
    return out
