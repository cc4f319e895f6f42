"""Saving a step number that is already published: a no-op when nothing changed, else an error.

A published step is immutable. The common way to meet one again is harmless: a run resumes
from step N at a save boundary and its loop saves step N again (a loop that saves at the
top of an iteration, or a final save of a run that had already finished). The Checkpointer
keeps a :class:`Snapshot` of the state it last restored or published (per-object identity
digests: :mod:`rtj_shim.torch.fingerprint`); ``save(N)`` of that same step with the same
state publishes nothing and says so, while a state that changed since (a training step, an
edited value) raises, naming what changed: the published step N holds something else.

The global RNGs are reported, not compared: code that runs between ``restore()`` and the
second ``save(N)`` runs again after any later resume from N, so the published state is
still the right one to resume from.

:func:`check`, :func:`refusal` and :func:`no_op_line` are pure; :func:`settle` is the
collective step the Checkpointer runs when every rank has its :class:`Check`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rtj_shim.checkpoint.layout import step_key
from rtj_shim.checkpoint.storage import CheckpointStore
from rtj_shim.checkpoint.verification import Depth
from rtj_shim.checkpoint.verifier import verify_step
from rtj_shim.torch import _dist
from rtj_shim.torch.outcomes import CheckpointError, SaveReport

log = logging.getLogger("rtj_shim.torch")


@dataclass(frozen=True)
class Snapshot:
    step: int
    digests: Mapping[str, str]  # per object, identity digests
    rng: str  # digest of this rank's global RNG states
    origin: str  # "this run restored from it" or "this run published"


@dataclass(frozen=True)
class Check:
    """One rank's view of a save of the snapshot's step."""

    changed: tuple[str, ...]  # objects whose state differs from the snapshot
    rng_moved: bool


def check(
    snapshot: Snapshot | None, step: int, digests: Mapping[str, str], rng: str
) -> Check | None:
    """None when ``step`` is not the snapshot's step (an ordinary save)."""
    if snapshot is None or snapshot.step != step:
        return None
    names = sorted(set(snapshot.digests) | set(digests))
    changed = tuple(n for n in names if snapshot.digests.get(n) != digests.get(n))
    return Check(changed, snapshot.rng != rng)


def refusal(step: int, snapshot: Snapshot, checks: Sequence[Check | None]) -> str | None:
    """The error every rank raises when any rank's state changed, else None."""
    rows = [f"rank {rank}: {list(c.changed)}" for rank, c in enumerate(checks) if c and c.changed]
    if not rows:
        return None
    return (
        f"step {step} is already published, and the state to save differs from the state "
        f"{snapshot.origin} ({'; '.join(rows)} changed since); a published step is "
        "immutable: save under the number of the step just completed"
    )


def no_op_line(step: int, snapshot: Snapshot, checks: Sequence[Check | None]) -> str:
    line = (
        f"rtj_shim.torch: save of step {step} did nothing: step {step} is already published "
        f"with this same state (the state {snapshot.origin})"
    )
    if any(c is not None and c.rng_moved for c in checks):
        line += (
            "; the global RNGs moved since (code between them drew random numbers; a resume "
            f"from step {step} runs that code again)"
        )
    return line


def settle(
    store: CheckpointStore,
    step: int,
    snapshot: Snapshot,
    checks: Sequence[Check | None],
    coord: _dist.Coordinator,
    blocking: bool,
    started: float,
) -> SaveReport | None:
    """Collective: a save of the snapshot's step. Raises if any rank's state changed; a
    report when the save is a no-op; None when the step is no longer published (a
    retention pass or a corruption since): then it is saved again as usual."""
    refused = refusal(step, snapshot, checks)
    if refused:
        raise CheckpointError(refused)
    published = None
    if coord.rank == 0:
        try:
            published = verify_step(store, step, Depth.SHALLOW).valid
        except Exception as exc:
            published = False
            log.warning("step %d could not be checked (%s); saving it again", step, exc)
    if not coord.broadcast(published):
        return None
    if coord.rank == 0:
        log.warning("%s", no_op_line(step, snapshot, checks))
    seconds = time.perf_counter() - started
    uri = store.key_uri(step_key(step))
    return SaveReport(step, blocking, seconds, seconds, 0, 0, uri, already_published=True)
