"""A pod's progress answer, bound to the pod and the operator's request (issue 42). Pure.

The operator reads each worker pod's progress at the pod's IP. Whoever answers there is
trusted only if it proves to be that pod: a pod IP freed by a deleted pod may already be
another pod's (another tenant's) before the deletion reaches the operator's cache. So the
operator's read carries a fresh nonce (``X-RTJ-Nonce``), and the sidecar of a pod rendered
to seal its answers signs its answer over the nonce, its pod name, its attempt and the
body (``X-RTJ-Seal``) with the job's answer key: a key derived from the job's control key
for this purpose only (`subkey`), so a seal is never a valid restart order, assignment or
request signature, nor the other way round. A pod of another job (another key), another
pod of the same job (another name), an old answer (another nonce) or a tenant's own server
(no key) cannot produce it.

The seal::

    X-RTJ-Seal: sha256=HMAC(subkey(job key, "progress-answer"),
                            "rtj-answer-1\\n<nonce>\\n<pod>\\n<attempt>\\n" + sha256(body))
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from rtj_shim.wire.control import signature_matches

NONCE_HEADER = "X-RTJ-Nonce"
SEAL_HEADER = "X-RTJ-Seal"
ANSWER_PURPOSE = "progress-answer"
NONCE_HEX = 32


def subkey(job_key: str, purpose: str) -> str:
    """The job's key for one purpose only (hex)."""
    return hmac.new(job_key.encode(), b"rtj-subkey/" + purpose.encode(), hashlib.sha256).hexdigest()


def new_nonce() -> str:
    return secrets.token_hex(NONCE_HEX // 2)


def valid_nonce(value: str | None) -> bool:
    """A nonce as the operator makes them (32 lower-case hex digits)."""
    return (
        value is not None
        and len(value) == NONCE_HEX
        and all(c in "0123456789abcdef" for c in value)
    )


@dataclass(frozen=True)
class Answerer:
    """Who must answer a read: the pod, by name, of the job's attempt."""

    pod: str
    attempt: str


def seal(job_key: str, nonce: str, answerer: Answerer, body: bytes) -> str:
    """The ``X-RTJ-Seal`` of `body`, answered by `answerer` to the read carrying `nonce`."""
    message = "\n".join(["rtj-answer-1", nonce, answerer.pod, answerer.attempt, ""]).encode()
    key = subkey(job_key, ANSWER_PURPOSE).encode()
    return "sha256=" + hmac.new(key, message + hashlib.sha256(body).digest(), "sha256").hexdigest()


def check(job_key: str, nonce: str, answerer: Answerer, body: bytes, got: str | None) -> bool:
    """Whether `got` (the answer's ``X-RTJ-Seal``) is `answerer`'s seal of `body` for
    `nonce`, in constant time."""
    return signature_matches(seal(job_key, nonce, answerer, body), got)
