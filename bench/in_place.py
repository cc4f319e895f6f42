"""Recovery paths side by side (issue 15): the same fault on the same platform, recovered by
re-creating the whole world and by restarting in place (with the fast tier, or with the
broken node's pod replaced).

    python -m bench.in_place [--trials 3] [--faults rank,gpu] [--workers 2]
                             [--paths whole,inplace,...] [--markdown bench/results/in-place.md]

One local platform (control plane, S3 server, pod runner, operator with a control secret);
per trial a job of the example trainer (`--workers` pods, one rank each) trains past step
90 (durable saves every 40), then the fault hits rank 1:

- `rank`: its training process is SIGKILLed (nothing implicates a node). Paths: the whole
  world re-created (`inPlace` off), in place, in place with the fast tier (every 5 steps),
  in place with a warm standby interpreter per pod (`+ preload`: `inPlacePreload` torch and
  rtj_shim.torch, the trainer under python instead of torchrun; the fault waits until every
  pod's standby reports ready, the steady state of a fault long after the last start).
- `gpu`: an XID 79 condition on its node, then its training process SIGKILLed (as
  `e2e/demo/test_in_place_drill.py` does). Paths: the whole world re-created (`inPlace` off),
  in place with only that pod replaced (`inPlace` on, `inPlaceMaxReplacedPods` 1: its Job
  creates it again), and the same with a warm spare (`spares: 1`) taking its rank, without
  and with the fast tier (its peer replica gives the spare the rank's fast step), and with a
  warm standby interpreter in every pod, the spare's included (`+ preload`). The node
  is quarantined by the job and then cordoned by the bench, so every trial's fault hits a
  fresh node: the platform runs `--workers` + one node per GPU-fault trial + 2 nodes (the
  spare's, and one for a pod its Job creates again).

Both faults also run the path a user has without the operator, `JobSet RestartJobSet`
(`bench.in_place_jobset`: a JobSet restarting every Job on any failure, torchrun, plain
`torch.save` every 40 steps to a shared volume, resume from the newest file; it knows
nothing of node health, so its new pods may land on the GPU-faulted node again).

Recovery = from the fault to the first training step completed after the resume (the
trainers' own logs, wall clock), as the issue defines it; also the steps recomputed (the
fault's step minus the resumed one) and the pods created for the recovery. The paths
alternate within each round, so a machine's drift hits them alike.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from bench import in_place_jobset, rank0_logs
from e2e.cluster import faults
from e2e.demo import drills, story
from e2e.operator_proc import REPO, wait_for

FAST_EVERY = 5
XID = 79
FAULTS = ("rank", "gpu")
FAULT_TITLES = {
    "rank": "Rank killed (its training process SIGKILLed)",
    "gpu": f"GPU fault (XID {XID} on the rank's node, its training process SIGKILLed)",
}
# per fault: path -> (job name slug, spec.recovery, spec.checkpoint.fastTier)
PATHS: dict[str, dict[str, tuple[str, dict[str, Any], dict[str, Any] | None]]] = {
    "rank": {
        "whole world": ("whole", {"inPlace": False}, None),
        "in place": ("inplace", {"inPlace": True}, None),
        "in place + fast tier": ("fast", {"inPlace": True}, {"everySteps": FAST_EVERY}),
        "in place + preload": ("warm", {"inPlace": True}, None),
        "JobSet RestartJobSet": ("jobset", {}, None),
    },
    "gpu": {
        "whole world": ("whole", {"inPlace": False}, None),
        "in place, pod replaced": ("replaced", {"inPlace": True}, None),
        "in place, warm spare": ("spare", {"inPlace": True}, None),
        "in place, warm spare + fast tier": (
            "sparefast",
            {"inPlace": True},
            {"everySteps": FAST_EVERY},
        ),
        "in place, warm spare + preload": ("sparewarm", {"inPlace": True}, None),
        "JobSet RestartJobSet": ("jobset", {}, None),
    },
}
JOBSET_PATH = "JobSet RestartJobSet"
"""Without the operator: `bench.in_place_jobset` (a JobSet with RestartJobSet, torchrun, plain
torch.save every 40 steps, resume from the newest file)."""
SPARE_PATHS = frozenset(
    {"in place, warm spare", "in place, warm spare + fast tier", "in place, warm spare + preload"}
)
"""Paths run with `spec.spares: 1` (a warm spare takes the replaced pod's rank)."""
PRELOAD_PATHS = frozenset({"in place + preload", "in place, warm spare + preload"})
"""Paths run with a warm standby interpreter per pod (`drills.preloaded`: the trainer under
`python`, not torchrun, `spec.recovery.inPlacePreload` torch and rtj_shim.torch)."""
BASELINE = "whole world"
# kept as history: the same bench before the in-place path's own latencies were cut
HISTORY = [
    "Before the in-place path's own latencies were cut (rank killed, same bench, same "
    "machine, 2026-11-30 19:09): whole world 10.7 s, in place **12.5 s** (1.17x). Then in "
    "place spent up to one poll period to see the supervisor's report, 3 s of SIGTERM grace "
    "for an emergency save the broken world cannot make, and another poll period before the "
    "start order went out. Now an ordered stop SIGKILLs after 1 s, the poller starts a round "
    "as soon as the plan moves the restart on, and rounds follow every 0.25 s while orders "
    "are out. After that cut (19:13, 3 trials each): whole world 9.2 s, in place 7.7 s "
    "(0.84x), 12 steps recomputed by both.",
    "",
    "What was left then is the trainer's own restart (a new Python process: importing "
    "torch, gloo's rendezvous, the restore; ~5 s here), which every path without a warm "
    "standby interpreter (`+ preload`) pays. On this harness a pod "
    "costs nothing to create (no scheduling delay, no image pull, no CUDA initialisation, no "
    "Kueue wait), so re-creating the world is cheap; on a real cluster those are the minutes "
    "in-place restart saves, and the job keeps its Kueue admission. Detection of a trainer's "
    "exit in place waits for the next poll (1 s here; `progressPollSeconds`, 5 s by "
    "default), where a pod's termination is seen from the watch at once.",
]


@dataclass
class Trial:
    fault: str
    path: str
    recovery: float
    restored: int
    killed_at_step: int
    pods_created: int
    source: str = ""
    attempt: int = 1
    failure_class: str = ""
    replaced: int = 0
    load: float = 0.0


def _records(opts: story.Options, job: str) -> list[dict[str, Any]]:
    """Rank 0's log records of every pod of the job (any attempt), in time order."""
    root = opts.state / "runner" / "pods" / story.NAMESPACE
    return rank0_logs.records(root, f"{job}-a*-worker-0-0-*/volumes/train-logs/rank-0.jsonl")


def _last_step(opts: story.Options, job: str) -> int:
    return rank0_logs.last_step(_records(opts, job))


def _resumed(opts: story.Options, job: str, after: float) -> tuple[int, float, str] | None:
    return rank0_logs.resumed(_records(opts, job), after)


def _failure(status: dict[str, Any]) -> tuple[str, int] | None:
    """(the first attempt's failure class, pods replaced), as recorded: the in-place entry's
    for a restart in place, else the attempt's."""
    record = (status.get("attempts") or [{}])[0]
    entries = record.get("inPlaceRestarts") or []
    if entries and entries[0].get("outcome"):
        return str(entries[0].get("failureClass")), len(entries[0].get("replaced") or [])
    if record.get("failureClass"):
        return str(record["failureClass"]), 0
    return None


def _evidence(work: Path, job: str, status: dict[str, Any]) -> Path:
    path = work / f"{job}-status.json"
    path.write_text(json.dumps(status, indent=2, sort_keys=True))
    return path


def trial(platform: drills.Platform, fault: str, path: str, n: int, workers: int,
          work: Path) -> Trial:  # fmt: skip
    if path == JOBSET_PATH:
        t = in_place_jobset.trial(platform, fault, n, workers, XID)
        return Trial(fault, path, t.recovery, t.restored, t.killed_at_step, t.pods_created,
                     t.source, t.restarts + 1, "-", 0, os.getloadavg()[0])  # fmt: skip
    api, opts = platform.api, platform.opts
    slug, recovery, fast = PATHS[fault][path]
    job = f"{fault}-{slug}-{n}"
    body = drills.job(job, replicas=workers, recovery=dict(recovery))
    if fast is not None:
        body["spec"]["checkpoint"]["fastTier"] = dict(fast)
    if path in SPARE_PATHS:
        body["spec"]["spares"] = 1
    if path in PRELOAD_PATHS:
        drills.preloaded(body)
    api.create_rtj(story.NAMESPACE, body)
    wait_for(f"{job} past step 90", lambda: _last_step(opts, job) >= 90, 600, 0.2)
    if path in PRELOAD_PATHS:  # the steady state: a fault long after the last start
        wait_for(f"{job}'s warm standbys ready", lambda: all(
            drills.supervisor_report(opts, p).get("standby") == "ready"
            for p in drills.pods(api, job, 1)
        ), 120, 0.2)  # fmt: skip
    before = {p["metadata"]["uid"] for p in drills.pods(api, job, 1)}
    victim = drills.rank_pod(drills.pods(api, job, 1), 1)
    node = victim["spec"]["nodeName"]
    pid = drills.trainer_pid(opts, victim)
    step = _last_step(opts, job)
    if fault == "gpu":
        faults.gpu_xid(platform.kube, node, XID)
    hit = time.time()
    os.kill(pid, signal.SIGKILL)
    try:
        restored, first, source = wait_for(f"{job}'s first step after the resume",
                                           lambda: _resumed(opts, job, hit), 240, 0.1)  # fmt: skip
        failure = wait_for(f"{job}'s failure recorded",
                           lambda: _failure(drills.status(api, job)), 60, 0.5)  # fmt: skip
    except TimeoutError:
        if fault == "gpu":
            platform.kube.core.patch_node(node, {"spec": {"unschedulable": True}})
        saved = _evidence(work, job, drills.status(api, job))
        sys.stdout.write(f"{job}: no recovery; status in {saved}, operator log under "
                         f"{opts.state / 'logs'}\n")  # fmt: skip
        raise
    status = drills.status(api, job)
    _evidence(work, job, status)
    after = {p["metadata"]["uid"] for a in range(1, status["attempt"] + 1)
             for p in drills.pods(api, job, a)}  # fmt: skip
    if fault == "gpu":  # keep the node out of later trials (its XID condition stays)
        platform.kube.core.patch_node(node, {"spec": {"unschedulable": True}})
    api.delete_rtj(story.NAMESPACE, job)
    wait_for(f"{job}'s pods gone",
             lambda: not any(drills.pods(api, job, a) for a in range(1, status["attempt"] + 1)),
             120, 0.5)  # fmt: skip
    return Trial(fault, path, first - hit, restored, step, len(after - before), source,
                 int(status["attempt"]), failure[0], failure[1], os.getloadavg()[0])  # fmt: skip


def _drop(platform: drills.Platform, job: str) -> None:
    """Delete a job whose trial failed, so the next trial starts clean."""
    try:
        platform.api.delete_rtj(story.NAMESPACE, job)
    except Exception as exc:  # reported; the next trial goes on
        sys.stdout.write(f"{job}: delete failed: {exc}\n")


def _cell(values: list[float], unit: str = " s") -> str:
    med = statistics.median(values)
    return f"**{med:.1f}{unit}** ({min(values):.1f}-{max(values):.1f})"


def _joined(values: list[Any]) -> str:
    return ", ".join(map(str, sorted(set(values))))


def fault_table(fault: str, trials: list[Trial]) -> list[str]:
    out = [
        f"## {FAULT_TITLES[fault]}",
        "",
        "| path | trials | recovery median (min-max) | steps recomputed (median) | restored from "
        "| pods created | attempts | failure class |",
        "|---|---|---|---|---|---|---|---|",
    ]
    medians: dict[str, float] = {}
    for path in PATHS[fault]:
        mine = [t for t in trials if t.fault == fault and t.path == path]
        if not mine:
            continue
        medians[path] = statistics.median(t.recovery for t in mine)
        lost = statistics.median(t.killed_at_step - t.restored for t in mine)
        out.append(
            f"| {path} | {len(mine)} | {_cell([t.recovery for t in mine])} | {lost:.0f} "
            f"| {_joined([t.source for t in mine])} | {_joined([t.pods_created for t in mine])} "
            f"| {_joined([t.attempt for t in mine])} | {_joined([t.failure_class for t in mine])} |"
        )
    if BASELINE in medians:
        ratios = [f"{path} / {BASELINE}: **{medians[path] / medians[BASELINE]:.2f}x**"
                  for path in medians if path != BASELINE]  # fmt: skip
        if ratios:
            out += ["", "Recovery time, " + "; ".join(ratios) + "."]
    return out


def markdown(trials: list[Trial], workers: int, nodes: int, argv: list[str],
             load: tuple[float, float], minutes: float) -> str:  # fmt: skip
    out = [
        "# Recovery paths side by side (issue 15)",
        "",
        f"Generated by `python -m bench.in_place {' '.join(argv)}` on {os.uname().nodename} "
        f"({os.cpu_count()} CPUs), {datetime.now():%Y-%m-%d %H:%M}, "
        f"{minutes:.0f} min; load average (1 min) {load[0]:.1f} at the start, {load[1]:.1f} "
        "at the end (other sessions may share the machine: the per-trial load is below).",
        "",
        f"The example trainer, {workers} pods of one rank each, on {nodes} pod-runner nodes "
        "(one pod per node), durable saves every 40 steps; the fault hits rank 1 after step "
        "90. Recovery: the fault to the first step completed after the resume (rank 0's own "
        "log). Steps recomputed: the step rank 0 had completed at the fault minus the step "
        "resumed from. Pods created: pods of the job that did not exist before the fault, "
        "counted at that first step (the pod a Job creates again for a rank a warm spare "
        "took comes after the Job's 10 s back-off, usually later: 0 then). With `+ preload` "
        "the fault waits, past step 90, until every pod's warm standby reports ready. The "
        "paths alternate within each round.",
        "",
    ]
    for fault in FAULTS:
        if any(t.fault == fault for t in trials):
            out += [*fault_table(fault, trials), ""]
    out += [
        "Per trial:",
        "",
        "| fault | path | recovery s | fault after step | resumed from | source | pods created "
        "| attempt | class | load |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    out += [f"| {t.fault} | {t.path} | {t.recovery:.2f} | {t.killed_at_step} | {t.restored} "
            f"| {t.source} | {t.pods_created} | {t.attempt} | {t.failure_class} "
            f"| {t.load:.1f} |" for t in trials]  # fmt: skip
    out += ["", *HISTORY]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--faults", default=",".join(FAULTS), help="comma-separated: rank, gpu")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument(
        "--paths", default="", help="comma-separated path slugs, e.g. whole,spare (default: all)"
    )
    p.add_argument("--work", type=Path, default=Path("/tmp/rtj-in-place"))
    p.add_argument("--markdown", type=Path, default=REPO / "bench" / "results" / "in-place.md")
    args = p.parse_args(argv)
    chosen = [f.strip() for f in args.faults.split(",") if f.strip()]
    only = {w.strip() for w in args.paths.split(",") if w.strip()}
    known = {slug for paths in PATHS.values() for slug, _, _ in paths.values()} | {"jobset"}
    if only - known:
        p.error(f"--paths: unknown {sorted(only - known)}; choose from {sorted(known)}")
    if not chosen or any(f not in FAULTS for f in chosen):
        p.error(f"--faults: choose from {', '.join(FAULTS)}")
    shutil.rmtree(args.work, ignore_errors=True)
    secret = args.work / "control-secret"
    secret.parent.mkdir(parents=True, exist_ok=True)
    secret.write_text(secrets.token_hex(32))
    # a GPU fault's node is quarantined and then cordoned: one fresh node per such trial
    gpu_paths = [path for path, (slug, _, _) in PATHS["gpu"].items() if not only or slug in only]
    gpu_trials = args.trials * len(gpu_paths) if "gpu" in chosen else 0
    nodes = args.workers + gpu_trials + 2
    before = os.getloadavg()[0]
    started = time.monotonic()
    trials: list[Trial] = []
    failed: list[str] = []
    with drills.running_platform(
        args.work, "rtj-inplace-bench", nodes,
        "--progress-poll-seconds", "1", "--control-secret-file", str(secret),
        timeout=300,
    ) as platform:  # fmt: skip
        for n in range(args.trials):
            for fault in (f for f in FAULTS if f in chosen):
                for path, (slug, _, _) in PATHS[fault].items():
                    if only and slug not in only:
                        continue
                    try:
                        trials.append(trial(platform, fault, path, n, args.workers, args.work))
                    except TimeoutError as exc:  # reported, with its status saved
                        failed.append(f"{fault}, {path}, round {n}: {exc}")
                        if path != JOBSET_PATH:  # a JobSet trial deletes its own
                            _drop(platform, f"{fault}-{PATHS[fault][path][0]}-{n}")
                        continue
                    sys.stdout.write(f"{trials[-1]}\n")
                    sys.stdout.flush()
    shown = ["--trials", str(args.trials), "--faults", ",".join(chosen),
             "--workers", str(args.workers),
             *(["--paths", ",".join(sorted(only))] if only else [])]  # fmt: skip
    text = markdown(trials, args.workers, nodes, shown, (before, os.getloadavg()[0]),
                    (time.monotonic() - started) / 60)  # fmt: skip
    if failed:
        text += "\nTrials that did not recover (status JSON under `--work`):\n\n"
        text += "".join(f"- {f}\n" for f in failed)
    args.markdown.parent.mkdir(parents=True, exist_ok=True)
    args.markdown.write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
