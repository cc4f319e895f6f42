"""The Checkpointer's silent-corruption watch: what each rank brings to a save, and the
collective verdict that refuses to publish a suspect state (`rtj_shim.integrity`).

At every save each rank brings the exact checksums of its replicated modules and optimizers
(`replica_check`) and, with an `AnomalyGuard`, the first step at which its loss or gradient
norm showed an anomaly, and which signals did (sticky: a state once suspect stays suspect in
this process). Losses and gradient norms given to `step_boundary`, and this rank's gradient
norm before the all-reduce where `watch_gradients` hooked DDP (`local_gradients`), are kept
as they come (tensors stay on their device: no per-step sync) and judged in one batch at the
next save, or every `BATCH` steps.

Whom a verdict names: for replicas that diverge, the ranks outside a strict majority; for
an anomaly, the ranks whose *own* signal (`LOCAL_SIGNALS`: its loss, its gradient before
the all-reduce) was off at the earliest step any rank saw one. The gradient norm after the
all-reduce is the same on every rank: off there names no one; nor does a symptom every
rank's own signal shows (a bad batch for all, a learning-rate spike).

The data alignment check (`rtj_shim.alignment`) rides on the same rows: each brings the
rank's level (the mean log of its last losses), the gathered levels update the reference a
save records in its manifest, and after a resume `alignment_due` says when the ranks gather
their new levels to compare with it.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rtj_shim import alignment
from rtj_shim.alignment import AlignmentCheck, Reference
from rtj_shim.integrity import Anomaly, AnomalyGuard, SuspectState, odd_ranks
from rtj_shim.torch import local_gradients, replica_check
from rtj_shim.torch.state import Entry
from rtj_shim.wire.misaligned_resume import MisalignedRanks
from rtj_shim.wire.suspect_verdict import MAX_RANKS, SuspectKind, SuspectVerdict

BATCH = 64
"""Signals kept before they are judged without waiting for a save (bounds the memory)."""
LOCAL_SIGNALS = frozenset({"loss", local_gradients.SIGNAL})
"""Signals of one rank alone; ``grad_norm`` (after DDP's all-reduce, or a clip's total) is
the same on every rank."""


@dataclass(frozen=True)
class RankIntegrity:
    """What one rank brings to a save's verdict."""

    suspect: str | None
    checksums: dict[str, int]
    pod: int | None = None
    """The node rank (pod index) this rank runs in: what a verdict names beside the rank."""
    anomaly_step: int | None = None
    """The first step at which one of this rank's signals was an anomaly."""
    anomaly_signals: tuple[str, ...] = ()
    """The signals that were, at that step."""
    loss_level: float | None = None
    """The mean log of this rank's last losses (`rtj_shim.alignment.level`)."""


class IntegrityWatch:
    def __init__(
        self,
        guard: AnomalyGuard | None,
        every_steps: int | None = None,
        aligned: AlignmentCheck | None = None,
    ) -> None:
        if every_steps is not None and (isinstance(every_steps, bool) or every_steps < 1):
            raise ValueError(
                f"Checkpointer(integrity_every_steps={every_steps!r}): expected a positive "
                "number of steps, or None (check at saves only)"
            )
        self.guard = guard
        self.every_steps = every_steps
        self.pod = pod_index(os.environ)
        self.suspect: str | None = None
        self._first: list[Anomaly] = []  # the anomalies of the first step that showed one
        self._pending: list[tuple[int, str, Any]] = []
        self._local_grads: local_gradients.LocalGradientNorm | None = None
        self.aligned = aligned
        self._losses: deque[Any] = deque(maxlen=aligned.window if aligned else 1)
        self.reference: Reference | None = None
        """The ranks' losses as the gathers so far saw them (restored with a checkpoint)."""
        self._resumed: tuple[int, Reference] | None = None  # the check due after a resume

    def watch_gradients(self, model: Any) -> None:
        if self.guard is None:
            raise ValueError(
                "Checkpointer.watch_gradients(model): the Checkpointer has no anomaly guard "
                "to judge the norms; construct it with "
                "integrity=IntegrityOptions(anomaly_guard=AnomalyGuard())"
            )
        self._local_grads = local_gradients.watch(model)

    def note(self, step: int, **signals: float | torch.Tensor | None) -> None:
        """Keep this step's signals (loss, grad_norm, this rank's gradient norm before the
        all-reduce where watched) for the guard; no device sync."""
        loss = signals.get("loss")
        if self.aligned is not None and loss is not None:
            self._losses.append(loss.detach() if isinstance(loss, torch.Tensor) else loss)
        if self.guard is None:
            return
        if self._local_grads is not None:
            signals[local_gradients.SIGNAL] = self._local_grads.take()
        for name, value in signals.items():
            if value is not None:
                kept = value.detach().reshape(()) if isinstance(value, torch.Tensor) else value
                self._pending.append((step, name, kept))
        if len(self._pending) >= BATCH:
            self.judge_pending()

    def due(self, step: int) -> bool:
        return self.every_steps is not None and step > 0 and step % self.every_steps == 0

    def judge_pending(self) -> None:
        pending, self._pending = self._pending, []
        if self.guard is None or not pending:
            return
        values = _floats([v for _, _, v in pending])
        for (step, name, _), value in zip(pending, values, strict=True):
            found = self.guard.observe(step, name, value)
            if found is not None and (not self._first or self._first[0].step == step):
                self._first.append(found)
        if self._first:  # this rank's own signal first: the one that can name it
            own = sorted(self._first, key=lambda a: a.signal not in LOCAL_SIGNALS)
            self.suspect = own[0].describe()

    def local(self, entries: Iterable[Entry]) -> RankIntegrity:
        return self._row(replica_check.checksums(entries))

    def local_anomaly(self) -> RankIntegrity:
        """The row without the checksums' pass: the anomaly part of the verdict only."""
        return self._row({})

    def _row(self, checksums: dict[str, int]) -> RankIntegrity:
        self.judge_pending()
        first = self._first[0].step if self._first else None
        signals = tuple(a.signal for a in self._first)
        return RankIntegrity(self.suspect, checksums, self.pod, first, signals, self.level())

    # ------------------------------------------------------------ data alignment

    def level(self) -> float | None:
        """This rank's level over its last losses (None: none, or no check)."""
        return alignment.level(_floats(list(self._losses))) if self._losses else None

    def observed(self, rows: Sequence[RankIntegrity]) -> None:
        """Every rank's level from one gather: the reference a save records."""
        levels = [row.loss_level for row in rows]
        ref = self.reference
        self.reference = alignment.reference(levels) if ref is None else ref.observed(levels)

    def resumed(self, step: int, saved: Reference | None) -> None:
        """Restored from ``step`` whose manifest recorded ``saved``: the check is due once
        every rank has a window of new losses."""
        self._losses.clear()
        self.reference = saved
        self._resumed = (step, saved) if saved is not None and self.aligned else None

    def alignment_due(self, step: int) -> bool:
        return (
            self._resumed is not None
            and self.aligned is not None
            and (step >= self._resumed[0] + self.aligned.window)
        )

    def judge_alignment(self, step: int, levels: Sequence[float | None]) -> MisalignedRanks | None:
        """The verdict on the gathered levels (once per resume)."""
        assert self._resumed is not None and self.aligned is not None
        _, saved = self._resumed
        self._resumed = None
        return alignment.misaligned(step, levels, saved, self.aligned)


def _floats(values: Sequence[Any]) -> list[float]:
    """The values as floats, each device's tensors in one transfer."""
    out: list[float | None] = [None] * len(values)
    by_device: dict[torch.device, list[int]] = {}
    for i, v in enumerate(values):
        if isinstance(v, torch.Tensor):
            by_device.setdefault(v.device, []).append(i)
        else:
            out[i] = float(v)
    for indexes in by_device.values():
        stacked = torch.stack([values[i].float() for i in indexes]).tolist()
        for i, f in zip(indexes, stacked, strict=True):
            out[i] = float(f)
    return [float("nan") if f is None else f for f in out]


def pod_index(env: Mapping[str, str]) -> int | None:
    """The pod this process runs in, as the operator numbers them: ``NODE_RANK`` (the pod's
    completion index, or the rank a restart in place gave it), else torchrun's
    ``GROUP_RANK``; None outside a job."""
    for name in ("NODE_RANK", "GROUP_RANK"):
        value = env.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def verdict(step: int, rows: Sequence[RankIntegrity], what: str = "not published") -> None:
    """Raise SuspectState on every rank (they read the same rows) when any rank saw an
    anomaly, or a replicated module's or optimizer's checksum differs between ranks."""
    seen = [rank for rank, row in enumerate(rows) if row.suspect]
    if seen:
        detail = "; ".join(f"rank {rank}: {rows[rank].suspect}" for rank in seen)
        raise SuspectState(f"step {step} {what}: {detail}",
                           _named(step, SuspectKind.ANOMALY, _first_own(rows), rows))  # fmt: skip
    names = sorted({name for row in rows for name in row.checksums})
    differing, suspects = [], set()
    for name in names:
        odd = odd_ranks([str(row.checksums.get(name)) for row in rows])
        if odd:
            differing.append(f"{name!r} on rank {', '.join(map(str, odd))}")
            suspects.update(odd)
    if differing:
        named = sorted(suspects) if len(suspects) < len(rows) else []  # no majority: no one
        raise SuspectState(
            f"step {step} {what}: replicas diverged ({'; '.join(differing)} "
            "differs from the other ranks' copy bit for bit): a rank computing wrong",
            _named(step, SuspectKind.DIVERGED, named, rows),
        )


def _first_own(rows: Sequence[RankIntegrity]) -> list[int]:
    """The ranks whose own signal was off at the earliest step any rank saw an anomaly;
    none where every rank's was (with more than one rank: no one stands out)."""
    steps = [row.anomaly_step for row in rows if row.anomaly_step is not None]
    if not steps:
        return []
    first = min(steps)
    named = [
        rank
        for rank, row in enumerate(rows)
        if row.anomaly_step == first and LOCAL_SIGNALS & set(row.anomaly_signals)
    ]
    return named if len(rows) == 1 or len(named) < len(rows) else []


def _named(
    step: int, kind: SuspectKind, ranks: Sequence[int], rows: Sequence[RankIntegrity]
) -> SuspectVerdict:
    ranks = list(ranks)[:MAX_RANKS]
    pods = {p for r in ranks if (p := rows[r].pod) is not None}
    return SuspectVerdict(step, kind, tuple(ranks), tuple(sorted(pods)))
