"""Which checkpoint step the next attempt resumes from: a pure choice and a thin reader.

Two roads, by the checkpoint root's scheme:

- ``s3://``: the operator reads the store itself with ``rtj_shim`` (shallow verification:
  COMMITTED matches the manifest, every file present with its size) and pins the newest
  verified step that is not marked bad. The init container re-verifies it deeply.
- ``file://``: the root lives on a volume only the pods mount, so the operator pins
  nothing; the init container picks the newest step that verifies, and the operator reads
  its answer back from the init container's termination message (`parse_init_result`).

A store that cannot be read is :class:`CheckpointUnreadable`, never "no checkpoint": the
caller blocks the restart rather than start from scratch.

The pure part (`plan_candidates`, `choose`, `parse_init_result`, `pin_for`) works over
plain listings and verdicts; `read_store` is the only function here that does I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from rtj_operator.policy.init_result import InitResult as InitResult
from rtj_operator.policy.init_result import parse_init_result as parse_init_result
from rtj_operator.s3_clients import S3Clients
from rtj_shim.checkpoint.selection import resume_candidates, select_resume_step

S3_SCHEME = "s3://"
FILE_SCHEME = "file://"


class CheckpointUnreadable(Exception):
    """The checkpoint store could not be read (credentials, network, permissions)."""


@dataclass(frozen=True)
class StepVerdict:
    """One published step as shallow verification judged it."""

    step: int
    valid: bool
    reason: str
    committed_at: datetime | None = None


@dataclass(frozen=True)
class Selection:
    """The newest usable step (None: the store holds none) and every step passed over."""

    step: int | None
    uri: str | None
    committed_at: datetime | None
    skipped: tuple[tuple[int, str], ...] = ()

    def summary(self) -> str:
        chosen = f"step {self.step}" if self.step is not None else "no verified step"
        if not self.skipped:
            return chosen
        passed = "; ".join(f"{step}: {why}" for step, why in self.skipped[:5])
        more = f" (+{len(self.skipped) - 5} more)" if len(self.skipped) > 5 else ""
        return f"{chosen}; skipped {passed}{more}"


def operator_reads_store(uri: str) -> bool:
    """Only object stores are read by the operator; file:// roots live inside the cluster."""
    return uri.startswith(S3_SCHEME)


def plan_candidates(published: Iterable[int], bad_steps: Iterable[int]) -> list[int]:
    """Published steps newest first, without those an init container already rejected."""
    return resume_candidates(published, bad_steps)


def choose(
    candidates: Iterable[int],
    verify: Callable[[int], StepVerdict],
    bad_steps: Iterable[int] = (),
    step_uri: Callable[[int], str] = str,
) -> Selection:
    """Verify candidates newest first; the first that verifies wins (lazy: stops there):
    the shim's chooser, with the steps marked bad reported among those passed over."""
    found, passed = select_resume_step(list(candidates), verify)
    skipped = [(step, "marked bad by an earlier attempt's init container") for step in bad_steps]
    skipped = sorted([*skipped, *((p.step, p.reason) for p in passed)], reverse=True)
    if found is None:
        return Selection(None, None, None, tuple(skipped))
    newer = tuple(s for s in skipped if s[0] > found.step)
    return Selection(found.step, step_uri(found.step), found.committed_at, newer)


def pin_for(uri: str, selection: Selection | None, decided: int | None) -> int | None:
    """The step to pin into the next attempt's JobSet.

    For s3:// the fresh reading wins over what `decide` proposed from status (a step seen
    earlier may have been rejected since); file:// roots are never pinned by the operator,
    so their init container always takes the newest step that verifies deeply.
    """
    if not operator_reads_store(uri):
        return None
    return selection.step if selection is not None else decided


# --- the only I/O in this module -------------------------------------------------------------


def read_store(
    uri: str, bad_steps: Iterable[int] = (), credentials: Mapping[str, str] | None = None
) -> Selection:
    """Read the checkpoint root and choose (shallow verification). Blocking: run in a thread.

    `credentials` are the keys of the job's `checkpoint.credentialsSecretRef` (the same
    AWS_* variables the pods get); without them the operator's own environment is used.
    Raises CheckpointUnreadable when the store cannot be read; a root that does not exist
    yet is an ordinary "no checkpoint" (a fresh run).
    """
    from rtj_shim.checkpoint.layout import step_key
    from rtj_shim.checkpoint.verification import Depth
    from rtj_shim.checkpoint.verifier import verify_step
    from rtj_shim.errors import ShimError, StoreError

    bad = sorted(set(bad_steps), reverse=True)
    try:
        try:
            store = _open(uri, credentials)
        except (ShimError, StoreError):
            raise
        except Exception as exc:  # botocore rejecting the endpoint or the region
            raise CheckpointUnreadable(f"cannot open {uri}: {type(exc).__name__}: {exc}") from exc
        if not store.root_exists():
            return Selection(None, None, None)
        published = [d.name.step for d in store.list_step_dirs() if not d.name.in_progress]

        def verify(step: int) -> StepVerdict:
            verdict = verify_step(store, step, Depth.SHALLOW)
            created = verdict.manifest.created_at if verdict.manifest is not None else None
            if created is not None and created.tzinfo is None:
                created = created.replace(tzinfo=timezone.utc)
            return StepVerdict(step, verdict.valid, verdict.reason, created)

        listed = [s for s in bad if s in set(published)]
        return choose(
            plan_candidates(published, bad), verify, listed, lambda s: store.key_uri(step_key(s))
        )
    except StoreError as exc:
        raise CheckpointUnreadable(str(exc)) from exc
    except ShimError as exc:  # a usage error (malformed URI) is just as blocking
        raise CheckpointUnreadable(str(exc)) from exc


def _open(uri: str, credentials: Mapping[str, str] | None) -> Any:
    """The store at `uri`; an S3 root through the client for its credentials, made once
    (`s3_clients`)."""
    from rtj_shim.checkpoint.storage import open_store

    if not operator_reads_store(uri):
        return open_store(uri)
    from rtj_shim.checkpoint.storage.s3 import S3Store

    return S3Store.from_uri(uri, client=S3_CLIENTS.client(credentials))


S3_CLIENTS = S3Clients()
"""The operator's S3 clients, shared by every read of every job (thread-safe)."""
