"""What a failed API call means: typed errors, so callers branch on meaning, not on codes.

`kube.Kube` raises only these. `from_answer` maps the API server's answer (its HTTP status
and `Status` body) to one; `from_exception` does the same for the official client's
`ApiException`, which carries the same two fields.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager


class KubeError(Exception):
    """An API call failed; `status` is the HTTP status (None: no answer)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class NotFound(KubeError):
    pass


class Conflict(KubeError):
    """A precondition (resourceVersion) failed: re-read and decide again."""


class AlreadyExists(KubeError):
    pass


class Invalid(KubeError):
    """422 (validation, CEL rules, webhooks) or 400 (a strict decoding error: an unknown or
    duplicate field): the object was rejected as written."""


class Forbidden(KubeError):
    pass


class Unavailable(KubeError):
    """No answer, a timeout or a 5xx/429: retry later."""


def from_answer(what: str, status: int | None, body: object, message: str) -> KubeError:
    """The error for an answer with HTTP `status` and `body` (a `Status` object as JSON, or
    anything else); `message` stands where the body names none. `what` names the call."""
    reason = ""
    if isinstance(body, (str, bytes)) and body:
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            message = str(parsed.get("message", message))
            reason = str(parsed.get("reason", ""))
    text = f"{what}: {message}"
    if status == 404:
        return NotFound(text, status)
    if status == 409:
        return AlreadyExists(text, status) if reason == "AlreadyExists" else Conflict(text, status)
    if status == 422 or (status == 400 and reason == "BadRequest"):
        return Invalid(text, status)
    if status in (401, 403):
        return Forbidden(text, status)
    if not status or status == 429 or status >= 500:
        return Unavailable(text, status)
    return KubeError(text, status)


def from_exception(exc: object, what: str) -> KubeError:
    """The error for the client's exception (`ApiException`: `status` and `body`)."""
    status = getattr(exc, "status", None)
    return from_answer(
        what, status if isinstance(status, int) else None, getattr(exc, "body", None), str(exc)
    )


@contextmanager
def translated(what: str) -> Iterator[None]:
    """Raise what goes wrong inside as a KubeError: the transport's errors (no answer, a
    timeout, a broken stream) as Unavailable, the client's ApiException by its status."""
    from urllib3.exceptions import HTTPError

    try:
        yield
    except KubeError:
        raise
    except (HTTPError, OSError) as exc:
        raise Unavailable(f"{what}: {type(exc).__name__}: {exc}") from exc
    except Exception as exc:
        if getattr(exc, "status", None) is not None:
            raise from_exception(exc, what) from exc
        raise
