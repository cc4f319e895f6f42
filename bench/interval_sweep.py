"""`plannedIntervalSeconds: auto` against the best fixed interval (issue 48, deliverable 3's
measurement): the goodput soak (`bench.goodput`) on the same seeded schedule with the
trainers' durable interval fixed at each of several step counts, and once with the
operator's `auto` interval, at each of several fault rates; one run after the other.

Restart in place without a fast tier (`--fast-every 0`): every recovery resumes from the
newest durable step, so the durable interval is what decides the steps trained again (with a
fast tier it decides little). A platform prior at the schedule's own rate for `auto`
(`bench.soak_training.platform_config`).

    python -m bench.interval_sweep --mtbf 120 --mtbf 60 --every 50 --every 100 \
        --every 200 --every 400 --seed 7 --mix rank_killed=1,hang=1,node_lost=0.5 \
        [--steps 4000] [--markdown FILE]

`--mix` (the soak's `KIND=WEIGHT,...`): the faults that lose the work since the newest
durable step are what an interval trades against (an eviction or a preemption saves on
SIGTERM, a corrupted step is a storage fault), so the sweep's default mix is those.

The plan and the table are pure (`plan`, `table`); the runs are `bench.goodput`'s.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
AUTO = 0
"""The `every` of the run with the operator's interval."""
WORK_LOSING_MIX = "rank_killed=1,hang=1,node_lost=0.5"
"""The faults whose recovery resumes from the newest durable step and trains the steps since
it again (with the fast tier off): what a durable interval is chosen against."""


@dataclass(frozen=True)
class Run:
    mtbf: float
    every: int  # AUTO: the operator's interval
    steps: int
    seed: int
    mix: str = ""
    """`bench.goodput --mix` ("": the soak's default mix)."""

    @property
    def name(self) -> str:
        interval = "auto" if self.every == AUTO else f"every{self.every}"
        return f"sweep-mtbf{self.mtbf:g}-{interval}-{self.steps}-seed{self.seed}"

    def argv(self, out: Path, work: Path) -> list[str]:
        interval = ["--auto-interval"] if self.every == AUTO else [f"--save-every={self.every}"]
        return [
            sys.executable, "-m", "bench.goodput", f"--steps={self.steps}",
            f"--mtbf={self.mtbf:g}", f"--seed={self.seed}", "--fast-every=0", "--spares=1",
            "--preload", *interval, f"--out={out}", f"--name={self.name}", f"--work={work}",
            *([f"--mix={self.mix}"] if self.mix else []),
        ]  # fmt: skip


def plan(
    mtbfs: Sequence[float], everies: Sequence[int], steps: int, seed: int, mix: str = ""
) -> list[Run]:
    """Per fault rate, each fixed interval, then `auto`: the same seed, so the same faults."""
    if not mtbfs or not everies:
        raise ValueError("a sweep needs at least one --mtbf and one --every")
    if any(e < 1 for e in everies):
        raise ValueError(f"--every: expected step counts >= 1, got {list(everies)}")
    return [Run(m, e, steps, seed, mix) for m in mtbfs for e in (*sorted(set(everies)), AUTO)]


def table(results: Mapping[Run, Mapping[str, Any]]) -> str:
    """Per fault rate: each run's goodput, the best fixed interval, and `auto` against it."""
    out = [
        "| faults every | durable interval | goodput | checkpoint stalls s | steps trained again |",
        "|---|---|---|---|---|",
    ]
    notes = []
    for mtbf in sorted({r.mtbf for r in results}):
        runs = sorted(
            (r for r in results if r.mtbf == mtbf), key=lambda r: (r.every == AUTO, r.every)
        )
        for run in runs:
            facts = results[run]
            what = "auto" if run.every == AUTO else f"every {run.every} steps"
            lost = sum(int(r.get("lost_steps") or 0) for r in facts.get("recoveries", ()))
            out.append(f"| {mtbf:g} s | {what} | {100 * facts['goodput']:.1f}% | "
                       f"{facts.get('checkpoint_stall_seconds', 0.0):.1f} | {lost} |")  # fmt: skip
        fixed = [r for r in runs if r.every != AUTO]
        auto = [r for r in runs if r.every == AUTO]
        if fixed and auto:
            best = max(fixed, key=lambda r: results[r]["goodput"])
            gap = 100 * (results[auto[0]]["goodput"] - results[best]["goodput"])
            notes.append(f"- faults every {mtbf:g} s: the best fixed interval every {best.every} "
                         f"steps; auto {gap:+.1f} points against it")  # fmt: skip
    return "\n".join([*out, "", *notes]) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mtbf", type=float, action="append", required=True)
    p.add_argument("--every", type=int, action="append", required=True)
    p.add_argument("--steps", type=int, default=4000)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--mix", default=WORK_LOSING_MIX, help="bench.goodput's --mix")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "goodput-runs")
    p.add_argument("--work", type=Path, default=Path("/tmp/rtj-sweep"))
    p.add_argument("--markdown", type=Path)
    args = p.parse_args(argv)
    try:
        runs = plan(args.mtbf, args.every, args.steps, args.seed, args.mix)
    except ValueError as exc:
        p.error(str(exc))
    results: dict[Run, Mapping[str, Any]] = {}
    for run in runs:
        sys.stderr.write(f"{run.name}\n")
        subprocess.run(run.argv(args.out, args.work), cwd=REPO, check=True)
        results[run] = json.loads((args.out / f"{run.name}.json").read_text())
    text = table(results)
    sys.stdout.write(text)
    if args.markdown is not None:
        args.markdown.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
