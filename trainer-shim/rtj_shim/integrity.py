"""Is the training state still the one a healthy machine would compute? Pure judgements
for the two symptoms of silent data corruption that a trainer can see from inside:

* **Replicas that diverge.** Data-parallel ranks hold the same parameters and optimizer
  state after every step; a rank whose copy differs computed wrong. `odd_ranks` names the
  ranks outside the majority (no strict majority: every rank is a suspect).
* **A loss or gradient norm far outside its recent distribution.** `AnomalyGuard` keeps a
  window per signal and flags a value whose robust z-score (distance from the window's
  median in units of its scaled median absolute deviation, never less than a floor, so a
  flat plateau does not make every wiggle an outlier) passes a threshold. Positive signals
  are judged in log space: a corrupted exponent multiplies or divides a value, and a hard
  batch a few times the usual loss is no outlier there (the defaults flag a factor of
  about 20 either way: exponent bits 26 and up of a float32). It judges only after
  `warmup` values, and a flagged value never enters the window.

A suspect state is never published (`rtj_shim.torch.Checkpointer` refuses the save with
`SuspectState`), so the newest verified step is always one reached before the symptom: a
restart resumes from it.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from rtj_shim.wire.suspect_verdict import SuspectVerdict

MAD_SCALE = 1.4826
"""The median absolute deviation of a normal distribution, times this, is its sigma."""


class SuspectState(RuntimeError):
    """The training state shows a symptom of silent data corruption; it is not published.

    The operator classifies a trainer that exits with it as `SilentDataCorruption` and
    restarts from the newest published step (one reached before the symptom), on other
    nodes than the suspect ranks' pods. `verdict` (the message ends with its marked form,
    so a termination message carries it): the step and the ranks and pods suspected."""

    def __init__(self, detail: str, verdict: SuspectVerdict | None = None) -> None:
        super().__init__(f"{detail} [{verdict.encode_text()}]" if verdict else detail)
        self.detail = detail
        self.verdict = verdict


@dataclass(frozen=True)
class Anomaly:
    """One value outside its signal's recent distribution. `spread`: the unit of distance
    (a factor when `factor`: the signal was judged in log space)."""

    step: int
    signal: str
    value: float
    median: float
    spread: float
    factor: bool = False

    def describe(self) -> str:
        if self.factor:
            ratio = max(self.value / self.median, self.median / self.value)
            distance = f"{ratio:.3g} times off its recent median"
            unit = f"usual spread a factor of {self.spread:.3g}"
        else:
            distance = f"{abs(self.value - self.median) / self.spread:.1f} spreads from its median"
            unit = f"spread {self.spread:.3g}"
        return (
            f"{self.signal} {self.value:.6g} at step {self.step} is {distance} "
            f"{self.median:.6g} ({unit})"
        )


@dataclass
class AnomalyGuard:
    """Flags a loss or gradient norm far outside its recent values. `window`: the values
    kept per signal; `warmup`: values seen before any is judged; `threshold`: the robust
    z-score that flags; `floor`: the smallest spread (in log space for a positive signal,
    else as a share of |median|)."""

    window: int = 256
    warmup: int = 64
    threshold: float = 12.0
    floor: float = 0.25
    _seen: dict[str, deque[float]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.window < 8:
            raise ValueError(f"AnomalyGuard(window={self.window}): expected 8 or more")
        if not 1 <= self.warmup <= self.window:
            raise ValueError(
                f"AnomalyGuard(warmup={self.warmup}): expected 1 to window ({self.window})"
            )
        if not (math.isfinite(self.threshold) and self.threshold > 0):
            raise ValueError(f"AnomalyGuard(threshold={self.threshold}): expected > 0")
        if not (math.isfinite(self.floor) and self.floor > 0):
            raise ValueError(f"AnomalyGuard(floor={self.floor}): expected > 0")

    def observe(self, step: int, signal: str, value: float) -> Anomaly | None:
        """Judge `value` against the signal's window, then keep it unless it was flagged.
        Non-finite values are the non-finite guard's (`loss_problem`): not judged here."""
        if not math.isfinite(value):
            return None
        seen = self._seen.setdefault(signal, deque(maxlen=self.window))
        found = self._judge(step, signal, value, seen) if len(seen) >= self.warmup else None
        if found is None:
            seen.append(value)
        return found

    def _judge(self, step: int, signal: str, value: float, seen: deque[float]) -> Anomaly | None:
        logs = value > 0 and min(seen) > 0
        xs = [math.log(v) for v in seen] if logs else list(seen)
        x = math.log(value) if logs else value
        median = statistics.median(xs)
        mad = statistics.median(abs(v - median) for v in xs)
        least = self.floor if logs else self.floor * abs(median)
        spread = max(MAD_SCALE * mad, least, 1e-12)
        if abs(x - median) / spread <= self.threshold:
            return None
        if logs:  # reported in the signal's own units: the median, and the spread as a factor
            return Anomaly(step, signal, value, math.exp(median), math.exp(spread), factor=True)
        return Anomaly(step, signal, value, median, spread)


def odd_ranks(values: Sequence[str]) -> list[int]:
    """The ranks whose value differs from a strict majority's; every rank when no value
    holds a strict majority (two ranks that disagree: either may be the one computing
    wrong). Empty when all agree."""
    if len(set(values)) <= 1:
        return []
    counts: dict[str, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    top, n = max(counts.items(), key=lambda kv: kv[1])
    if 2 * n <= len(values):
        return list(range(len(values)))
    return [rank for rank, v in enumerate(values) if v != top]
