"""The soak's recoveries as the operator's recovery ledger tells them (`status.recoveries`,
issue 48), checked against the trainers' own logs. Pure.

Per recovery after which a world trained: the ledger record of that world (its attempt and
trainer generation) must be there and complete, its phases (`policy.ledger.phase_seconds`,
which sum to its onset-to-first-step time by construction) are the recovery's breakdown, and
its first step (when the last rank completed one, from the ranks' milestones) must agree
with the last rank's own log line of that world's first step within FIRST_STEP_EPSILON.
Anything else is a problem of the run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bench import soak_accounting as acc
from rtj_operator.api.ledger import RecoveryRecord
from rtj_operator.policy.ledger import phase_seconds, wall_seconds

FIRST_STEP_EPSILON = 2.0
"""Seconds the ledger's first step may follow (or, by one report's clock placement,
precede by 0.05 s) the last rank's log line of it: a trainer logs its step, then reports it
at the step's boundary, where the fast tier's save and the agreement's collective run."""


def with_ledger(
    recoveries: Sequence[Mapping[str, Any]],
    status: Mapping[str, Any],
    worlds: Mapping[acc.World, Mapping[int, Sequence[Mapping[str, Any]]]],
) -> tuple[list[dict[str, Any]], list[str]]:
    """Each recovery with its ledger phases (`ledger`: phase -> seconds) and the ledger's
    first step minus the trainers' (`ledger_lag`); and the problems."""
    records = {
        (int(r["attempt"]), int(r.get("generation") or 0)): r
        for r in reversed(status.get("recoveries") or [])  # newest first: the newest wins
    }
    out, problems = [], []
    for r in recoveries:
        found = dict(r)
        out.append(found)
        if r.get("resumed_attempt") is None:
            continue  # nothing trained after it
        world = (int(r["resumed_attempt"]), int(r.get("resumed_generation") or 0))
        label = acc.world_label(world)
        raw = records.get(world)
        if raw is None or not raw.get("complete"):
            what = "incomplete" if raw else "missing"
            problems.append(f"{r['kind']} at +{float(r['injected_at']):.0f}: world {label} "
                            f"trained but its ledger record is {what}")  # fmt: skip
            continue
        record = RecoveryRecord.model_validate(raw)
        found["ledger"] = {p.value: round(s, 3) for p, s in phase_seconds(record)}
        found["ledger_seconds"] = wall_seconds(record)
        firsts = [
            acc.world_log(world, lines).first_time for lines in worlds.get(world, {}).values()
        ]
        if not firsts or None in firsts or record.first_step_at is None:
            problems.append(f"world {label}: a rank logged no step, its ledger says it did")
            continue
        lag = record.first_step_at.timestamp() - max(t for t in firsts if t is not None)
        found["ledger_lag"] = round(lag, 3)
        if not -0.05 <= lag <= FIRST_STEP_EPSILON:
            problems.append(f"world {label}: the ledger's first step is {lag:+.2f} s from the "
                            f"trainers' logs (allowed -0.05..{FIRST_STEP_EPSILON})")  # fmt: skip
    return out, problems
