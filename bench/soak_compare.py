"""The side-by-side report: (a) the operator's soak and (b) the JobSet baseline under the
same fault schedule (and any variants of (b), such as the schedule without node loss).
Pure but for `write` and `main`: the runs' facts in, markdown and a timeline per system out.

    python -m bench.soak_compare [--variant bench/results/goodput-baseline-without-node_lost.json]
        [--ablation bench/results/goodput.json --ablation bench/results/goodput-runs/X.json ...]

redraws bench/results/goodput-comparison.{md,svg} from goodput.json and goodput-baseline.json,
and with `--ablation` appends the operator's runs side by side, feature by feature and fault
rate by fault rate (`ablation`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench import soak_accounting as acc
from bench import soak_report
from bench.baseline_jobset import MAX_RESTARTS

HOW = (
    "How each fault reaches the baseline on the pod runner: **rank_killed**, **gpu_xid** "
    "(nothing reads the XID condition: the node stays schedulable) and **eviction** fail a "
    "pod, so its Job fails (`backoffLimit: 0`) and the JobSet deletes every Job (foreground) "
    "and creates them again; the trainers resume from the newest file. **hang** stops one "
    "rank: the other waits in a gloo collective for torch's default 30 minutes, longer than "
    "the cap, so nothing trains until another fault fails a pod. **node_lost** powers the "
    "node off (its processes killed, its Lease stale, its pods Running in the API): the "
    "surviving rank's collective fails and its pod fails; the Job controller deletes the "
    "lost node's pod, which stays Terminating since no kubelet confirms it, and Kubernetes "
    "1.35 marks the Job Failed only once all its pods are gone (`delayTerminalCondition`, "
    "JobPodReplacementPolicy), while JobSet v0.11.1 restarts on `JobFailed` alone: the "
    "JobSet waits until someone deletes that pod or the Node (a cloud provider deleting a "
    "vanished VM's Node would release it; a powered-off host that keeps its Node does not). "
    "**corrupt_newest** kills a rank, then flips one byte in the middle of the largest "
    "tensor of the newest `step-N.pt` (before the restart reads it): `torch.load` does not "
    "check the zip's CRC, the resume succeeds, and the model silently differs from the "
    "no-fault run from then on. **preemption** is Kueue's own, as for the operator (the "
    "JobSet is queued in the same ClusterQueue): an urgent workload of a higher priority "
    "needing the whole quota arrives, Kueue suspends the JobSet, whose Jobs delete their "
    "pods (the plain trainer saves nothing on SIGTERM); once it leaves, Kueue admits the "
    "JobSet again, its pods start over and resume from the newest file (counted as an "
    "attempt of their own). **sdc** flips one bit of one rank's weights (the trainer reads "
    "a file its pod is given): nothing in the plain trainer compares the replicas, so it "
    "trains on and saves the corrupted state; the run ends with a model that differs from "
    "the no-fault run. With the operator every rank refuses the state at the next save "
    "(the replicas differ bit for bit) and the world restarts from the step before. "
    "**bad_node** breaks the rank's node for good (its trainer and every trainer started "
    "there later killed within half a second; no XID, no condition): nothing in the JobSet "
    "knows the node, so every restart whose pod the scheduler puts there crashes again, until "
    "a draw leaves it out. The operator restarts in place, replaces the pod that failed first "
    "again, and the preflight node check (the platform's, failing there as `dcgmi diag` "
    "would) quarantines the node the moment a pod lands on it."
)


def settings(opts: Any, cap: float) -> dict[str, Any]:
    return {"steps": opts.steps, "mean time between faults": f"{opts.mtbf:.0f} s",
            "seed": opts.seed, "checkpoint every": f"{opts.save_every} steps",
            "baseline cap": f"{cap:.0f} s from the JobSet's creation"}  # fmt: skip


def _recovery(facts: Mapping[str, Any], scheduled: float) -> str:
    """'to first step s / recomputed steps' of the fault scheduled at `scheduled`."""
    injected = facts["injected"]
    for f, r in zip(injected, facts["recoveries"], strict=True):
        if abs(f["scheduled"] - scheduled) > 1e-6:
            continue
        if f["what"].startswith("skipped"):
            return "skipped (no running trainer)"
        if r["seconds_to_first_step"] is None:
            return "never trained again"
        lost = r["lost_steps"] if r["lost_steps"] is not None else "?"
        return f"{r['seconds_to_first_step']:.1f} s / {lost}"
    return "not reached"


def markdown(
    ours: Mapping[str, Any],
    base: Mapping[str, Any],
    settings: Mapping[str, Any],
    machine: str,
    variants: Sequence[Mapping[str, Any]] = (),
) -> str:
    runs = [ours, base, *variants]
    kinds = {f["scheduled"]: f["kind"] for run in runs for f in run["injected"]}
    scheduled = sorted(kinds.items())
    same = [(f["scheduled"], f["kind"], f["rank"]) for f in ours["injected"]]
    theirs = [(f["scheduled"], f["kind"], f["rank"]) for f in base["injected"]]
    n = min(len(same), len(theirs))
    warning = (
        [] if same[:n] == theirs[:n]
        else ["**The two runs had different schedules** (different settings): not comparable.",
              ""]
    )  # fmt: skip
    rows = [
        f"| +{at:.0f} s | {kind} | " + " | ".join(_recovery(run, at) for run in runs) + " |"
        for at, kind in scheduled
    ]
    names = [str(v.get("label", "variant")) for v in variants]
    status = "finished" if base.get("completed") == "Completed" else "did not finish"
    findings = list(base.get("findings") or []) or ["none"]
    return "\n".join(
        [
            "# Goodput soak, side by side: the operator and a plain JobSet",
            "",
            f"Machine: {machine}. Settings: "
            + ", ".join(f"{k} {v}" for k, v in settings.items())
            + ".",
            "",
            *warning,
            "| | goodput | productive s | wall s | checkpoint stalls s | attempts "
            "| faults injected |",
            "|---|---|---|---|---|---|---|",
            _summary(
                "(a) the operator (ResilientTrainingJob)"
                + (f": {variant_name(ours)}" if "features" in ours else ""),
                ours,
            ),
            _summary("(b) JobSet + RestartJobSet + plain torch.save", base),
            *(_summary(name, v) for name, v in zip(names, variants, strict=True)),
            "",
            "Per fault, as each system experienced it: seconds from the injection to the next "
            "attempt's first step / steps recomputed.",
            "",
            "| scheduled | fault | (a) operator | (b) JobSet baseline |"
            + "".join(f" {n.split(' ', 1)[0]} |" for n in names),
            "|---|---|---|---|" + "---|" * len(variants),
            *rows,
            "",
            f"(b) {status}: reached step {base.get('reached_step')}. Findings about the "
            "baseline (reported, not failures): " + "; ".join(findings) + ".",
            "",
            *(
                f"{n}: reached step {v.get('reached_step')}; findings: "
                + ("; ".join(v.get("findings") or []) or "none")
                + ".\n"
                for n, v in zip(names, variants, strict=True)
            ),
            "(a) invariants: "
            + ("; ".join(ours["problems"]) or "none failed: every invariant held")
            + ". (b) harness problems: "
            + ("; ".join(base["problems"]) or "none")
            + ".",
            "",
            *soak_report.cpu_section(
                {"(a)": ours.get("cpu_seconds") or {}, "(b)": base.get("cpu_seconds") or {}}
            ),
            "The baseline: a JobSet (one replicated job of 2 indexed pods, `backoffLimit: 0`, "
            f"`restartPolicy: Never`, `failurePolicy.maxRestarts: {MAX_RESTARTS}`, the default "
            "RestartJobSet action and Recreate strategy), torchrun with the static rendezvous "
            "(rank 0's hostname through the headless Service), the same trainer with "
            "`--plain-checkpoints`: rank 0 `torch.save`s model, optimizer, scheduler, sampler "
            "position, sample count and every rank's RNG to `step-N.pt` on a shared volume "
            "(temporary name, then rename), every rank resumes from the highest-numbered "
            "file with `torch.load(weights_only=True)`, nothing verified; torch's default "
            "process group (gloo, 30-minute collective timeout). Its goodput counts the same "
            "way over its own wall time, up to the cap when it does not finish.",
            "",
            HOW,
            "",
            "![timeline](goodput-comparison.svg)",
            "",
        ]
    )


def _summary(name: str, facts: Mapping[str, Any]) -> str:
    return (
        f"| {name} | **{facts['goodput'] * 100:.1f}%** | {facts['productive_seconds']:.1f} | "
        f"{facts['wall_seconds']:.1f} | {_stalls(facts)} | {facts['attempts']} | "
        f"{len(facts['injected'])} |"
    )


def _stalls(facts: Mapping[str, Any]) -> str:
    """Results from before the trainer logged its checkpoint stalls have none recorded."""
    return (
        f"{facts['checkpoint_stall_seconds']:.1f}" if "checkpoint_stall_seconds" in facts else "-"
    )


def timeline(
    ours: Mapping[str, Any], base: Mapping[str, Any], variants: Sequence[Mapping[str, Any]] = ()
) -> str:
    def lane(name: str, facts: Mapping[str, Any]) -> soak_report.Lane:
        steps = {str(a): {int(s): t for s, t in per.items()}
                 for a, per in facts["timeline"].items()}  # fmt: skip
        stalled = "completed" in facts and facts["completed"] != "Completed"
        return soak_report.Lane(
            f"{name}: goodput {facts['goodput'] * 100:.1f}%",
            facts["created"], steps, facts["injected"],
            facts["created"] + facts["wall_seconds"] if stalled else None,
            f"cap: not finished at step {facts.get('reached_step')}",
        )  # fmt: skip

    return soak_report.lanes_svg(
        [
            lane("(a) operator", ours),
            lane("(b) JobSet baseline", base),
            *(lane(str(v.get("label", "variant")), v) for v in variants),
        ],
        "the same fault schedule: the operator and a plain JobSet",
    )


def variant_name(facts: Mapping[str, Any]) -> str:
    """The operator run's features in words (runs from before the switches: whole world)."""
    if "label" in facts:
        return str(facts["label"])
    if "variant" in facts:
        return str(facts["variant"])
    features = facts.get("features") or {}
    if not features.get("in_place"):
        return "whole world only"
    every = features.get("fast_every") or 0
    return f"in place, fast tier every {every} steps" if every else "in place, no fast tier"


def _mtbf(facts: Mapping[str, Any]) -> str:
    return str((facts.get("settings") or {}).get("mean time between faults", "?"))


def ablation(runs: Sequence[Mapping[str, Any]], labels: Sequence[str] = ()) -> list[str]:
    """The operator's runs side by side (markdown lines): goodput, recomputed steps, mean
    recovery per fault kind, the paths taken, the machine's load; then, per fault time of
    each fault rate's schedule, how each variant recovered."""
    padded = [*labels, *[""] * (len(runs) - len(labels))]
    names = [lab or variant_name(r) for lab, r in zip(padded, runs, strict=True)]
    kinds = sorted({f["kind"] for r in runs for f in r["injected"]})
    out = [
        "| variant | MTBF | goodput | productive / wall s | faults | in place / whole world "
        "| recomputed steps | "
        + " | ".join(f"{k} s" for k in kinds)
        + " | load average at start; end | run s | invariants |",
        "|---|---|---|---|---|---|---|" + "---|" * len(kinds) + "---|---|---|",
    ]
    for name, r in zip(names, runs, strict=True):
        means = acc.mean_recovery_by_kind(r["recoveries"])
        paths = [_path(x) for x in r["recoveries"]]
        in_place = sum(p.startswith("in place") and "fell back" not in p for p in paths)
        whole = len(paths) - in_place - paths.count("")
        lost = sum(x["lost_steps"] or 0 for x in r["recoveries"])
        cells = [f"{means[k][0]:.1f} ({means[k][1]})" if k in means else "-" for k in kinds]
        load = str(r.get("machine") or "?").split("load average ", 1)[-1]
        load = load.split(" at the start", 1)[0] + f"; {r.get('load_end') or '?'}"
        run = f"{r['harness_seconds']:.0f}" if r.get("harness_seconds") else "?"
        problems = "held" if not r["problems"] else f"{len(r['problems'])} failed"
        goodput = f"**{r['goodput'] * 100:.1f}%**"
        if r.get("phase") not in (None, "Succeeded"):
            goodput = (f"job {r['phase']} at step {r.get('reached_step', '?')} "
                       f"({r['goodput'] * 100:.1f}% up to then)")  # fmt: skip
        out.append(
            f"| {name} | {_mtbf(r)} | {goodput} | "
            f"{r['productive_seconds']:.1f} / {r['wall_seconds']:.1f} | {len(r['injected'])} | "
            f"{in_place} / {whole} | {lost} | "
            + " | ".join(cells)
            + f" | {load} | {run} | {problems} |"
        )
    out += ["", "Mean recovery per fault kind: seconds from the injection to the next world's "
            "first step (how many faults of the kind), as `bench.soak_accounting."
            "mean_recovery_by_kind` counts it. Per fault:", ""]  # fmt: skip
    for mtbf in dict.fromkeys(_mtbf(r) for r in runs):
        same = [(n, r) for n, r in zip(names, runs, strict=True) if _mtbf(r) == mtbf]
        times = sorted({(f["scheduled"], f["kind"]) for _, r in same for f in r["injected"]})
        out += [
            f"MTBF {mtbf}: path, seconds to the first step / steps recomputed, resumed from "
            "(tier).",
            "",
            "| scheduled | fault | " + " | ".join(n for n, _ in same) + " |",
            "|---|---|" + "---|" * len(same),
        ]
        for at, kind in times:
            out.append(f"| +{at:.0f} s | {kind} | "
                       + " | ".join(_path_cell(r, at) for _, r in same) + " |")  # fmt: skip
        out.append("")
    return out


def _path(r: Mapping[str, Any]) -> str:
    """A recovery's path ("": nothing trained again); runs from before restart in place
    recorded none: the whole world."""
    if r.get("resumed_attempt") is None:
        return ""
    return str(r.get("path") or "whole world")


def _path_cell(facts: Mapping[str, Any], scheduled: float) -> str:
    for f, r in zip(facts["injected"], facts["recoveries"], strict=True):
        if abs(f["scheduled"] - scheduled) > 1e-6:
            continue
        if f["what"].startswith("skipped"):
            return "skipped (no running trainer)"
        if r["seconds_to_first_step"] is None:
            return str(r.get("path") or "never trained again")
        path = _path(r)
        tier = f", from {r['resumed_from']} ({r['tier']})" if r.get("tier") else ""
        return f"{path}: {r['seconds_to_first_step']:.1f} s / {r['lost_steps']}{tier}"
    return "not reached"


def write(
    out: Path,
    ours: Mapping[str, Any],
    base: Mapping[str, Any],
    variants: Sequence[Mapping[str, Any]] = (),
    runs: Sequence[Mapping[str, Any]] = (),
) -> None:
    settings, machine = base.get("settings") or {}, str(base.get("machine", "?"))
    text = markdown(ours, base, settings, machine, variants)
    if runs:
        head = ["", "## The operator's features, one at a time", ""]
        text = text.rstrip("\n") + "\n" + "\n".join([*head, *ablation(runs)]) + "\n"
    (out / "goodput-comparison.md").write_text(text)
    (out / "goodput-comparison.svg").write_text(timeline(ours, base, variants))


def main(argv: list[str] | None = None) -> int:
    results = Path(__file__).resolve().parent / "results"
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ours", type=Path, default=results / "goodput.json")
    p.add_argument("--baseline", type=Path, default=results / "goodput-baseline.json")
    p.add_argument("--variant", type=Path, action="append", default=[])
    p.add_argument("--ablation", type=Path, action="append", default=[],
                   help="an operator run's JSON (bench.goodput): the features table")  # fmt: skip
    p.add_argument("--out", type=Path, default=results)
    args = p.parse_args(argv)

    def load(path: Path) -> dict[str, Any]:
        facts: dict[str, Any] = json.loads(path.read_text())
        return facts

    variants = [load(v) for v in args.variant]
    runs = [load(r) for r in args.ablation]
    write(args.out, load(args.ours), load(args.baseline), variants, runs)
    sys.stdout.write(f"wrote {args.out / 'goodput-comparison.md'}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
