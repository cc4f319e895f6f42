"""The operator's soak judged from its trainers' logs and the job's status. Pure.

`logs[attempt][rank]`: the JSON lines of every pod of an attempt (in place, several trainer
generations append to the same files: `bench.soak_accounting` splits them into worlds).
Any invariant that fails is a *problem* and fails the run:

- the final model equals a no-fault run of the same steps bit for bit (every surviving
  step's loss on every rank);
- never two worlds training at once: per attempt *and* trainer generation, a world's first
  step on any rank comes after every step of every earlier world;
- every rank of a world resumed from the same step, and from the step the operator pinned
  for that world: a re-created world (generation 0 of an attempt) from the attempt's
  `resumedFromStep`, a world restarted in place from its `inPlaceRestarts` entry's
  `resumedFromFastStep` when the trainer's restore record says `"source": "fast-tier"`,
  else from its `resumedFromStep` (a fast step that did not verify on every rank falls
  back to it: reported, not a problem); never a durable step marked bad before it;
- budgets: the restarts status counts equal the restarts seen (in place: one per
  `inPlaceRestarts` entry; whole world: one per later attempt, none for an in-place restart
  that fell back, already paid), within `maxRestarts`; `trainerGeneration` counts the
  in-place restarts;
- a Kueue preemption (the urgent workload admitted) is recorded `Preempted`, category
  `preemption`, and the status counts every such attempt under `restarts.preemption`, none
  under `maxRestarts`' infrastructure count;
- every recovery after which a world trained has a complete record in the operator's
  recovery ledger, whose first step agrees with the trainers' logs (`bench.soak_ledger`);
- the job succeeded; nothing leaked (the caller's list: the urgent workloads and their
  priority classes included).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from bench import soak_accounting as acc
from bench import soak_ledger

CORRUPTED = re.compile(r"step-0*(\d+)/")
"""The step a corrupt_newest fault flipped a byte of, from its description."""


def judge(
    created: float,
    status: Mapping[str, Any],
    logs: Mapping[int, Mapping[int, Sequence[str]]],
    injected: Sequence[Mapping[str, Any]],
    baseline: Mapping[int, Mapping[int, float]],
    leaks: Sequence[str],
    max_restarts: int | None = None,
) -> dict[str, Any]:
    worlds = acc.split_worlds(logs)
    rank0 = {w: acc.world_log(w, ranks.get(0, [])) for w, ranks in worlds.items()}
    problems: list[str] = []
    try:
        line = acc.lineage(rank0)
    except ValueError as exc:
        problems.append(str(exc))
        line = acc.Lineage[acc.World](())
    productive = acc.productive_seconds(rank0, line)
    end = max((t for log in rank0.values() for t in log.steps.values()), default=created)
    for rank in sorted(baseline):
        per_rank = {w: acc.world_log(w, ranks.get(rank, [])) for w, ranks in worlds.items()}
        try:
            got = acc.lineage(per_rank).losses(per_rank)
        except ValueError as exc:
            problems.append(f"rank {rank}: {exc}")
            continue
        want = baseline[rank]
        diff = sorted(s for s in got if got[s] != want.get(s))
        missing = sorted(set(want) - set(got))
        if diff:
            problems.append(f"rank {rank}: {len(diff)} steps differ from the no-fault run "
                            f"(first {diff[:5]})")  # fmt: skip
        if missing:
            problems.append(f"rank {rank}: {len(missing)} steps of the no-fault run never "
                            f"trained (first {missing[:5]})")  # fmt: skip
    rank_steps = {
        w: {r: list(acc.world_log(w, records).steps.values()) for r, records in ranks.items()}
        for w, ranks in worlds.items()
    }
    problems += [
        f"worlds {acc.world_label(o.earlier)} and {acc.world_label(o.later)} trained at once "
        f"({o.seconds:.2f} s)"
        for o in acc.overlaps(rank_steps)
    ]
    records = {int(r["attempt"]): r for r in status.get("attempts") or []}
    resumes, fallbacks = _resumes(worlds, records, status, injected)
    problems += [p for r in resumes for p in r["problems"]]
    problems += _budget(status, max_restarts)
    if status.get("phase") != "Succeeded":
        problems.append(f"the job ended {status.get('phase')}")
    problems += [f"leaked: {what}" for what in leaks]
    recs = acc.recoveries([(f["kind"], f["at"]) for f in injected], rank0)
    recoveries = [
        _with_preemptor(_with_record(r.__dict__, records), f)
        for r, f in zip(recs, injected, strict=True)
    ]
    problems += _preemptions(injected, recoveries, status)
    recoveries, disagreements = soak_ledger.with_ledger(recoveries, status, worlds)
    problems += disagreements
    in_place = [e for r in records.values() for e in r.get("inPlaceRestarts") or []]
    return {
        "created": created,
        "timeline": {acc.world_label(w): dict(log.steps) for w, log in rank0.items()},
        "goodput": productive / (end - created) if end > created else 0.0,
        "wall_seconds": end - created,
        "productive_seconds": productive,
        "checkpoint_stall_seconds": acc.stall_seconds(rank0, line),
        "phase": status.get("phase"),
        "reached_step": line.ranges[0][2] if line.ranges else 0,
        "attempts": len({w[0] for w in rank0}),
        "worlds": len([w for w, log in rank0.items() if log.steps]),
        "in_place_restarts": len(in_place),
        "injected": list(injected),
        "recoveries": recoveries,
        "resumes": resumes,
        "fallbacks": fallbacks,
        "records": list(status.get("attempts") or []),
        "restarts": dict(status.get("restarts") or {}),
        "problems": problems,
    }


def _corrupted_at(injected: Sequence[Mapping[str, Any]]) -> dict[int, float]:
    out: dict[int, float] = {}
    for f in injected:
        if f["kind"] == "corrupt_newest" and (m := CORRUPTED.search(str(f["what"]))):
            out.setdefault(int(m.group(1)), float(f["at"]))
    return out


def _in_place_entry(record: Mapping[str, Any] | None, generation: int) -> dict[str, Any] | None:
    for entry in (record or {}).get("inPlaceRestarts") or []:
        if entry.get("generation") == generation:
            return dict(entry)
    return None


def _resumes(
    worlds: Mapping[acc.World, Mapping[int, Sequence[Mapping[str, Any]]]],
    records: Mapping[int, Mapping[str, Any]],
    status: Mapping[str, Any],
    injected: Sequence[Mapping[str, Any]],
) -> tuple[list[dict[str, Any]], list[str]]:
    """Per world that restored: what each rank restored, what the operator pinned, and the
    problems (see the module docstring)."""
    bad = set(status.get("badSteps") or [])
    corrupted = _corrupted_at(injected)
    out, fallbacks = [], []
    for world, ranks in worlds.items():
        attempt, generation = world
        label = acc.world_label(world)
        logs = {r: acc.world_log(world, records_) for r, records_ in ranks.items()}
        restored = {r: (log.restored, log.restore_source, log.restore_time)
                    for r, log in logs.items() if log.restored is not None}  # fmt: skip
        if not restored:
            continue
        problems: list[str] = []
        steps = {s for s, _, _ in restored.values()}
        sources = {src for _, src, _ in restored.values()}
        if len(steps) > 1 or len(sources) > 1:
            problems.append(f"world {label}: the ranks restored different steps or tiers "
                            f"({ {r: v[:2] for r, v in sorted(restored.items())} })")  # fmt: skip
        step, source, when = restored[min(restored)]
        assert step is not None
        fast = source == acc.FAST_SOURCE
        record = records.get(attempt)
        if generation == 0:
            entry = None
            pinned = (record or {}).get("resumedFromStep")
            if fast:
                problems.append(f"world {label}: re-created pods resumed from a fast tier "
                                f"(step {step}), which they cannot hold")  # fmt: skip
        else:
            entry = _in_place_entry(record, generation)
            if entry is None:
                problems.append(f"world {label}: no inPlaceRestarts entry of attempt {attempt} "
                                f"has generation {generation}")  # fmt: skip
            pinned = (entry or {}).get("resumedFromFastStep" if fast else "resumedFromStep")
            if fast and pinned is None:
                problems.append(f"world {label}: resumed from fast-tier step {step}, but the "
                                "operator pinned no fast step")  # fmt: skip
            offered = (entry or {}).get("resumedFromFastStep")
            if offered is not None and not fast:
                skipped = [r for records_ in ranks.values() for r in records_
                           if r.get("event") == "restore"][:1]  # fmt: skip
                why = (skipped[0].get("skipped") or skipped[0].get("notes")) if skipped else None
                fallbacks.append(f"world {label}: fast-tier step {offered} pinned, resumed "
                                 f"from durable step {step} ({why or 'no reason'})")  # fmt: skip
        if step and pinned is not None and step != pinned:
            problems.append(f"world {label} resumed from {step} "
                            f"({source}), the operator pinned {pinned}")  # fmt: skip
        marked_before = step not in corrupted or when is None or corrupted[step] < when
        if step in bad and not fast and marked_before:
            problems.append(f"world {label} resumed from step {step}, marked bad")
        out.append({"world": label, "step": step, "source": source,
                    "pinned": pinned, "entry": entry, "problems": problems})  # fmt: skip
    return out, fallbacks


def _budget(status: Mapping[str, Any], max_restarts: int | None) -> list[str]:
    counts = {k: int(v) for k, v in (status.get("restarts") or {}).items()}
    spent = sum(counts.values())
    entries = [e for r in status.get("attempts") or [] for e in r.get("inPlaceRestarts") or []]
    fell_back = sum(e.get("outcome") == "FellBack" for e in entries)
    whole = max(int(status.get("attempt") or 0) - 1, 0)
    seen = len(entries) + whole - fell_back
    out = []
    if spent != seen:
        out.append(f"budget: status counts {spent} restarts ({counts}), the attempts show "
                   f"{seen} ({len(entries)} in place, {whole} whole world, {fell_back} of "
                   "them fallbacks of an in-place restart)")  # fmt: skip
    if max_restarts is not None and counts.get("infrastructure", 0) > max_restarts:
        out.append(f"budget: {counts['infrastructure']} infrastructure restarts, over "
                   f"maxRestarts {max_restarts}")  # fmt: skip
    generation = int(status.get("trainerGeneration") or 0)
    if generation != len(entries):
        out.append(f"trainerGeneration {generation}, but {len(entries)} in-place restarts "
                   "recorded")  # fmt: skip
    return out


def _with_preemptor(r: dict[str, Any], fault: Mapping[str, Any]) -> dict[str, Any]:
    """A preemption's recovery with the urgent workload's times: `evicted_seconds` (its
    arrival to its admission: Kueue evicting ours), `quota_held_seconds` (admission to its
    deletion) and `after_release_seconds` (its deletion to our next world's first step:
    re-admission, pods, restore)."""
    p = fault.get("preemptor")
    if not p:
        return r
    out = dict(r)
    admitted, released = p.get("admitted"), p.get("released")
    out["evicted_seconds"] = admitted - p["created"] if admitted is not None else None
    out["quota_held_seconds"] = released - admitted if admitted is not None else None
    first = r.get("seconds_to_first_step")
    out["after_release_seconds"] = (
        r["injected_at"] + first - released if first is not None and released else None
    )
    return out


def _preemptions(
    injected: Sequence[Mapping[str, Any]],
    recoveries: Sequence[Mapping[str, Any]],
    status: Mapping[str, Any],
) -> list[str]:
    """Each applied preemption evicted the job through Kueue and was recorded Preempted,
    and preempted attempts spend no infrastructure budget."""
    out = []
    for f, r in zip(injected, recoveries, strict=True):
        if f["kind"] != "preemption" or str(f["what"]).startswith("skipped"):
            continue
        p = f.get("preemptor") or {}
        if p.get("admitted") is None:
            out.append(f"preemption at +{f['scheduled']:.0f} s: Kueue never admitted the "
                       "urgent workload (nothing preempted)")  # fmt: skip
        elif r.get("failure_class") != "Preempted":
            out.append(f"preemption at +{f['scheduled']:.0f} s recorded as "
                       f"{r.get('failure_class')}, not Preempted")  # fmt: skip
        if p and p.get("gone") is None:
            out.append(f"preemption at +{f['scheduled']:.0f} s: the urgent workload "
                       f"{p.get('name')} was not gone within the timeout")  # fmt: skip
    records = list(status.get("attempts") or [])
    preempted = sum(r.get("failureCategory") == "preemption" for r in records)
    counted = int((status.get("restarts") or {}).get("preemption") or 0)
    # the status keeps the newest records only (32): with older ones gone, at least as many
    complete = not records or int(records[0].get("attempt") or 1) == 1
    if preempted != counted and (complete or preempted > counted):
        out.append(f"budget: {preempted} attempts ended by a preemption, the status counts "
                   f"{counted} preemption restarts")  # fmt: skip
    return out


def _seconds(later: Any, earlier: Any) -> float | None:
    if not later or not earlier:
        return None

    def when(v: Any) -> float:
        return v if isinstance(v, int | float) else datetime.fromisoformat(str(v)).timestamp()

    return when(later) - when(earlier)


def _with_record(r: dict[str, Any], records: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """A recovery with what the operator recorded of it: class, detection (the injection to
    the failure seen) and its own recovery (seen to the next world running: the next
    JobSet, or every pod running the new generation)."""
    record = records.get(int(r["attempt"])) or {}
    out = dict(r)
    if r["path"] == "in place":  # (possibly with the pods of a lost or faulty node replaced)
        entry = _in_place_entry(record, int(r["resumed_generation"])) or {}
        if entry.get("replaced"):
            out["path"] = f"in place, {len(entry['replaced'])} pod(s) replaced"
            out["replaced"] = list(entry["replaced"])
        out.update(
            failure_class=entry.get("failureClass"),
            detection_seconds=_seconds(entry.get("detectedAt"), r["injected_at"]),
            recovery_seconds=_seconds(entry.get("startedAt"), entry.get("detectedAt")),
            pinned_step=entry.get("resumedFromStep"),
            pinned_fast_step=entry.get("resumedFromFastStep"),
        )
        return out
    later = [e for e in record.get("inPlaceRestarts") or []
             if int(e.get("generation") or 0) > int(r["generation"])]  # fmt: skip
    if later and r["path"] is None:  # restarted in place, and no world trained after it
        out.update(
            path=f"in place ({len(later)} restarts), never trained again",
            failure_class=later[0].get("failureClass"),
            detection_seconds=_seconds(later[0].get("detectedAt"), r["injected_at"]),
            recovery_seconds=None,
            pinned_step=later[0].get("resumedFromStep"),
            pinned_fast_step=later[0].get("resumedFromFastStep"),
        )
        return out
    if later and later[0].get("outcome") == "FellBack":
        out["path"] = "in place, fell back to whole world"
    nxt = records.get(int(r["resumed_attempt"])) if r["resumed_attempt"] is not None else None
    out.update(
        failure_class=record.get("failureClass"),
        detection_seconds=record.get("detectionSeconds"),
        recovery_seconds=record.get("recoverySeconds"),
        pinned_step=(nxt or {}).get("resumedFromStep"),
        pinned_fast_step=None,
    )
    return out
