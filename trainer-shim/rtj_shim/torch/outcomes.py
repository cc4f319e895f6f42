"""What a save or a restore ends with: its report, or the error every rank raises.

A save or restore is collective, so a failure is collective too: each rank contributes its
own problem (or ``None``) and every rank raises the same :class:`CheckpointError` naming
every rank that failed (:func:`raise_if_any`).
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass

from rtj_shim.errors import CheckpointError as CheckpointError
from rtj_shim.torch import _dist

log = logging.getLogger("rtj_shim.torch")


class NonFiniteStateError(CheckpointError):
    """The save was refused: the loss or a parameter is NaN or Inf."""


@dataclass(frozen=True)
class SaveReport:
    step: int
    blocking: bool
    seconds: float  # save() call to published
    stall_seconds: float  # time the training thread was held
    bytes: int
    files: int
    uri: str | None
    already_published: bool = False  # the same state was published as this step before


@dataclass(frozen=True)
class RestoreReport:
    step: int  # 0: fresh start
    source: str  # "resume-file", "resolved", "fast-tier" or "fresh"
    skipped: tuple[tuple[int, str], ...]
    seconds: float
    notes: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()  # objects passed but not restored (strict=False)
    unused: tuple[str, ...] = ()  # objects in the checkpoint that were not passed
    uri: str | None = None  # the step restored, or the root of a fresh start

    def line(self) -> str:
        """One line: which step, from where, what was skipped (steps and objects)."""
        how = {"resume-file": "pinned by the resume file", "resolved": "newest verified",
               "fast-tier": "the fast tier, pinned by the resume file"}  # fmt: skip
        if self.source == "fresh":
            parts = [f"no verified checkpoint under {self.uri}: starting fresh at step 0"]
        else:
            parts = [
                f"restored step {self.step} from {self.uri} "
                f"({how.get(self.source, self.source)}, sha256-verified) in {self.seconds:.2f}s"
            ]
        if self.skipped:
            shown = [f"{s} ({why})" for s, why in self.skipped[:SHOWN]]
            more = len(self.skipped) - SHOWN
            parts.append("skipped " + ", ".join(shown) + (f" and {more} more" if more > 0 else ""))
        if self.missing:
            parts.append(f"not in the checkpoint, left as they are: {list(self.missing)}")
        if self.unused:
            parts.append(f"in the checkpoint, not restored: {list(self.unused)}")
        parts.extend(self.notes)
        return "rtj_shim.torch: " + "; ".join(parts)


SHOWN = 5  # skipped steps named in a restore's line (all are in RestoreReport.skipped)


def raise_if_any(coord: _dist.Coordinator, error: str | None, what: str) -> None:
    """Collective: raise on every rank when any rank passed an error."""
    errors = [e for e in coord.all_gather(error) if e]
    if errors:
        raise CheckpointError(f"{what}: " + "; ".join(errors))


def announce(report: RestoreReport, *, rank: int, printed: bool) -> None:
    """Rank 0 prints the restore's line to stderr (``printed``, the default) and logs it:
    at warning level when something was skipped and the line was not printed, else info."""
    if rank != 0:
        return
    line = report.line()
    if printed:
        print(line, file=sys.stderr, flush=True)
    noteworthy = report.skipped or report.missing or report.notes
    level = logging.WARNING if noteworthy and not printed else logging.INFO
    log.log(level, "%s", line)
