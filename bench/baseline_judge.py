"""The baseline's facts from its trainer's logs. Pure.

Goodput is counted exactly as for the operator's run (`bench.soak_accounting`): the time
on the steps that survive into the final model, over the wall time from the JobSet's
creation. A baseline may never finish (a node lost for good, a crash loop on a corrupted
file): then its wall time runs to the cap, whatever it was doing by then. What the baseline
gets wrong is a *finding*, reported, not a failure: a final model that differs from the
no-fault run, two worlds training at once, not finishing. Only what makes the figures
meaningless is a *problem* (nothing trained; a resume from a step no attempt logged).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bench import soak_accounting as acc


def judge(
    created: float,
    stopped: float,
    completed: str | None,
    logs: Mapping[int, Mapping[int, Sequence[str]]],
    injected: Sequence[Mapping[str, Any]],
    reference: Mapping[int, Mapping[int, float]],
    stall: str | None,
    steps: int,
) -> dict[str, Any]:
    """`logs[attempt][rank]`: JSON lines; `completed`: the JobSet's terminal condition
    (None: still running at `stopped`, the cap); `reference[rank][step]`: no-fault losses."""
    attempts = {a: acc.parse_attempt(a, ranks.get(0, [])) for a, ranks in logs.items()}
    problems: list[str] = []
    findings: list[str] = []
    try:
        line = acc.lineage(attempts)
    except ValueError as exc:
        problems.append(str(exc))
        line = acc.Lineage(())
    if not line.ranges:
        problems.append("no training step was logged")
    productive = acc.productive_seconds(attempts, line)
    last_time = max((t for log in attempts.values() for t in log.steps.values()), default=created)
    end = last_time if completed == "Completed" else max(stopped, last_time)
    reached = line.ranges[0][2] if line.ranges else 0
    for rank in sorted(reference):
        per_rank = {a: acc.parse_attempt(a, r.get(rank, [])) for a, r in logs.items()}
        try:
            got = acc.lineage(per_rank).losses(per_rank)
        except ValueError:
            continue  # rank 0's lineage already said so
        want = {s: v for s, v in reference[rank].items() if s <= reached}
        diff = sorted(s for s in set(got) | set(want) if got.get(s) != want.get(s))
        if diff:
            findings.append(f"rank {rank}: the model differs from the no-fault run at "
                            f"{len(diff)} of {reached} steps (first {diff[:5]})")  # fmt: skip
    rank_steps = {
        a: {r: list(acc.parse_attempt(a, lines).steps.values()) for r, lines in ranks.items()}
        for a, ranks in logs.items()
    }
    findings += [f"attempts {o.earlier} and {o.later} trained at once ({o.seconds:.2f} s)"
                 for o in acc.overlaps(rank_steps)]  # fmt: skip
    if completed != "Completed":
        findings.append(f"did not finish: step {reached} of {steps} at the cap"
                        f" ({stall or completed or 'no reason recorded'})")  # fmt: skip
    recoveries = acc.recoveries([(f["kind"], f["at"]) for f in injected], attempts)
    return {
        "created": created,
        "timeline": {a: dict(log.steps) for a, log in attempts.items()},
        "goodput": productive / (end - created) if end > created else 0.0,
        "wall_seconds": end - created,
        "productive_seconds": productive,
        "checkpoint_stall_seconds": acc.stall_seconds(attempts, line),
        "attempts": len(attempts),
        "injected": list(injected),
        "recoveries": [r.__dict__ for r in recoveries],
        "records": [],
        "completed": completed,
        "reached_step": reached,
        "stall": stall,
        "findings": findings,
        "problems": problems,
    }
