"""The security settings a rendered worker pod gets: the operator fills in only what the
user's template leaves unset, and never in a way that breaks a choice the user made. Pure.

Many GPU images run as root (the NGC PyTorch images have no `USER`), RDMA needs
`IPC_LOCK`, and some trainers call the Kubernetes API. So:

- **Pod.** `automountServiceAccountToken: false` unless the template sets it (an explicit
  true is kept). `seccompProfile: RuntimeDefault` unless set. No `runAsNonRoot` unless the
  template sets it: the operator cannot see the namespace's Pod Security level, and a pod
  that says nothing about identity runs as its image's user, so the common root images (NGC
  PyTorch, most Hugging Face images) start on day one. In a namespace whose Pod Security
  is `restricted`, the API server refuses such a pod; set
  `spec.template.spec.securityContext.runAsNonRoot: true` (and a non-root
  `spec.template.spec.securityContext.runAsUser` for a root image) to run there.
- **The user's containers.** `allowPrivilegeEscalation: false` unless set, or the container
  is privileged or adds CAP_SYS_ADMIN (the API server refuses false with either:
  kubernetes `pkg/apis/core/validation/validation.go`, ValidateSecurityContext).
  `capabilities: {drop: [ALL]}` only when the container sets no `capabilities` at all (an
  `add: [IPC_LOCK]` is kept exactly as written, without a drop the user did not ask for),
  is not privileged, and is not run as root by the user's choice (runAsUser 0 or
  runAsNonRoot false, its own or else the pod's): dropping every capability of a root
  process breaks what root images do (chown, writing others' files) and buys nothing, since
  a root container is outside the restricted profile anyway. No container-level
  runAsNonRoot or seccompProfile: the container inherits the pod's, so a pod-level choice
  (runAsUser 0, seccomp Unconfined) is never overridden per container.
- **The operator's containers** (the resume init container, the progress sidecar) stay
  restricted whatever the template says: no privilege escalation, every capability
  dropped, RuntimeDefault seccomp, runAsNonRoot. They run the trainer's image, so they run
  as the trainer's user when it is a non-root uid set on the trainer container, and as
  65532 when the user chose root for the trainer (a restricted container cannot run as
  root; the kubelet makes the termination-message file writable by any user, mode 0666 in
  `pkg/kubelet/kuberuntime/kuberuntime_container.go`, and the resume volume is an emptyDir).
  When neither the trainer container nor the pod names a user, they run as 65532 too (the
  image's user may be root, which their runAsNonRoot would refuse); when the pod names a
  non-root uid they inherit it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

Obj = dict[str, Any]

RESTRICTED_CONTAINER: Obj = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}
"""The operator's own containers: the restricted Pod Security Standard's container rules."""

NONROOT_UID = 65532
"""The operator's containers' user when the trainer runs as root by the user's choice (the
conventional `nonroot` uid of distroless images)."""

_SYS_ADMIN = {"SYS_ADMIN", "CAP_SYS_ADMIN"}


def _context(value: object) -> Obj:
    return dict(value) if isinstance(value, Mapping) else {}


def says_identity(security_context: object) -> bool:
    """Whether a securityContext chooses who runs (runAsUser or runAsNonRoot)."""
    sc = _context(security_context)
    return "runAsUser" in sc or "runAsNonRoot" in sc


def _chose_root(sc: Obj) -> bool:
    return sc.get("runAsUser") == 0 or sc.get("runAsNonRoot") is False


def runs_as_root_by_choice(container_sc: object, pod_sc: object) -> bool:
    """The user chose root for this container: runAsUser 0 or runAsNonRoot false on the
    container, or on the pod when the container says nothing about identity."""
    own = _context(container_sc)
    if says_identity(own):
        return _chose_root(own)
    return _chose_root(_context(pod_sc))


def service_account_token(pod_spec: Mapping[str, Any]) -> bool:
    """`automountServiceAccountToken`: the template's value, false when it sets none."""
    value = pod_spec.get("automountServiceAccountToken")
    return value if isinstance(value, bool) else False


def pod_security_context(pod_sc: object, user_containers: Iterable[Mapping[str, Any]]) -> Obj:
    """The pod's securityContext: the user's, with seccomp RuntimeDefault added where unset.
    No runAsNonRoot is added (see the module docstring); `user_containers` are kept in the
    signature for callers that pass them."""
    del user_containers
    chosen = _context(pod_sc)
    return {"seccompProfile": {"type": "RuntimeDefault"}, **copy.deepcopy(chosen)}


def user_container_security(container_sc: object, pod_sc: object) -> Obj:
    """A user container's securityContext: theirs, with allowPrivilegeEscalation false and
    capabilities drop ALL added only where they are unset and do not break the user's
    choices (see the module docstring)."""
    chosen = _context(container_sc)
    privileged = chosen.get("privileged") is True
    capabilities = _context(chosen.get("capabilities"))
    adds = {str(c) for c in capabilities.get("add") or ()}
    out: Obj = {}
    if not privileged and not adds & _SYS_ADMIN:
        out["allowPrivilegeEscalation"] = False
    if not privileged and not runs_as_root_by_choice(chosen, pod_sc):
        out["capabilities"] = {"drop": ["ALL"]}
    return {**out, **copy.deepcopy(chosen)}


def operator_container_security(current: object, trainer: Mapping[str, Any], pod_sc: object) -> Obj:
    """An operator container's securityContext: restricted (what its renderer set, over
    RESTRICTED_CONTAINER), running as a user the restricted rules allow (see the module
    docstring)."""
    out = {**copy.deepcopy(RESTRICTED_CONTAINER), **_context(current), "runAsNonRoot": True}
    trainer_sc = _context(trainer.get("securityContext"))
    uid = trainer_sc.get("runAsUser")
    if isinstance(uid, int) and not isinstance(uid, bool) and uid > 0:
        out["runAsUser"] = uid  # the trainer's own user: it reads what the trainer wrote
    elif runs_as_root_by_choice(trainer_sc, pod_sc) or not _names_user(trainer_sc, pod_sc):
        out["runAsUser"] = NONROOT_UID
    return out


def _names_user(trainer_sc: Obj, pod_sc: object) -> bool:
    """The trainer or the pod chose who runs (so the image's user is not all we know)."""
    return says_identity(trainer_sc) or says_identity(_context(pod_sc))


ROOT_FIX = (
    "set spec.template.spec.securityContext.runAsNonRoot: true and a non-root "
    "spec.template.spec.securityContext.runAsUser (e.g. 1000) for an image that runs as root, "
    "or run the job in a namespace whose Pod Security level allows root"
)
"""What to change when a pod is refused for running as root (the fields, by path)."""

_ROOT_REFUSALS = ("runAsNonRoot != true", "image will run as root", "runAsUser=0")


def root_refusal_hint(message: str) -> str | None:
    """ROOT_FIX when a kubelet or Pod Security admission message refuses a pod for running
    as root (or for not saying runAsNonRoot under `restricted`); None otherwise."""
    return ROOT_FIX if any(word in message for word in _ROOT_REFUSALS) else None
