"""The goodput soak: real training through the operator under a seeded fault schedule.

    python -m bench.goodput [--mtbf 60] [--seed 1] [--steps 3000] [--out bench/results]
        [--in-place/--no-in-place] [--fast-every K] [--preemption-hold S] [--name goodput]

One local cluster with pod-runner nodes, the S3 server and the operator (the demo's
platform, `e2e/demo/story.py`); the example trainer (examples/ddp_train.py under torchrun,
2 workers) through a ResilientTrainingJob for a fixed number of steps; faults injected from
`bench.soak_schedule` (exponential inter-arrival, mean `--mtbf` seconds) while it trains.
Then, from the trainer's own logs (`bench.soak_accounting`, `bench.soak_judge`): goodput
(time on the steps that survive into the final model / wall time), each fault's cost and
recovery path, and the invariants, any of which failing fails the run:

- the final model equals a no-fault run of the same steps bit for bit (every surviving
  step's loss on every rank);
- never two worlds training at once (per attempt and trainer generation: a world's first
  step after every step of every earlier world);
- every resume from a step the operator pinned (the attempt's, or the in-place restart's
  durable or fast-tier step), never one it marked bad;
- budgets respected; nothing leaked at the end (JobSets and pods of earlier attempts,
  taints the job does not record).

Every feature is on by default (the operator as shipped): restart in place
(`spec.recovery.inPlace`, the operator given a control secret) and the fast checkpoint tier
every `--fast-every` steps (`spec.checkpoint.fastTier`). `--no-in-place --fast-every 0` is
the whole-world path alone (the fast tier needs in-place restarts).

Not injected yet (say so in every report): Kueue preemption (the KWOK drills cover it).
The same schedule against a plain JobSet, side by side: `bench.goodput_baseline`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from bench import soak_judge, soak_report
from bench.cpu_account import CpuSampler
from bench.soak_faults import Injector as Injector
from bench.soak_faults import inject as inject
from bench.soak_faults import preemption_text as preemption_text
from bench.soak_faults import prepare_preemption as prepare_preemption
from bench.soak_schedule import DEFAULT_MIX, KINDS, schedule
from bench.soak_training import BAD_NODES
from bench.soak_training import CAPS as CAPS
from bench.soak_training import CLUSTER_QUEUE as CLUSTER_QUEUE
from bench.soak_training import JOB as JOB
from bench.soak_training import MAX_RESTARTS as MAX_RESTARTS
from bench.soak_training import NODES as NODES
from bench.soak_training import PREEMPTION_HOLD as PREEMPTION_HOLD
from bench.soak_training import PREEMPTION_PRIORITY as PREEMPTION_PRIORITY
from bench.soak_training import RANKS as RANKS
from bench.soak_training import SoakOptions as SoakOptions
from bench.soak_training import job_body as job_body
from bench.soak_training import no_fault_run as no_fault_run
from bench.soak_training import platform_config as platform_config
from bench.soak_training import settings as settings
from e2e.cluster import kueue_preemption
from e2e.cluster.cluster import LocalCluster
from e2e.demo import story
from e2e.operator_proc import REPO, wait_for


def run(opts: SoakOptions) -> dict[str, Any]:
    """One soak; returns the report's facts (raises if an invariant fails)."""
    shutil.rmtree(opts.work, ignore_errors=True)
    opts.work.mkdir(parents=True)
    platform = story.Options(
        out=opts.work / "out", state=opts.work / "state",
        cluster_name=f"rtj-soak-{os.getpid()}", nodes=opts.nodes(), timeout=600,
    )  # fmt: skip
    (platform.state / "logs").mkdir(parents=True)
    lines: list[str] = []
    display = story.Display(lines.append)
    state: dict[str, Any] = {"pids": {}}
    plan = opts.faults if opts.faults is not None else schedule(
        opts.seed, opts.steps * opts.expected_step_seconds, opts.mtbf,
        ranks=RANKS, mix=opts.mix, caps=CAPS,
    )  # fmt: skip
    injected: list[dict[str, Any]] = []
    operator_args: tuple[str, ...] = ("--progress-poll-seconds", "1")
    if opts.in_place:  # the orders to the pods' supervisors are signed with it
        secret = opts.work / "control-secret"
        secret.write_text(secrets.token_hex(32))
        operator_args += ("--control-secret-file", str(secret))
    platform_yaml = platform_config(opts)  # the interval prior, the preflight: if needed
    if platform_yaml is not None:
        platform_file = opts.work / "platform.yaml"
        platform_file.write_text(yaml.safe_dump(platform_yaml))
        operator_args += ("--platform-config", str(platform_file))
    cpu = CpuSampler()
    cpu.start()
    try:
        _, kube, api = story.start_platform(platform, display, state, operator_args=operator_args)
        prepare_preemption(kube, plan)
        created = time.time()
        api.create_rtj(story.NAMESPACE, job_body(opts))
        wait_for("the first step", lambda: _attempt_logs(platform), 600, 0.5)
        start = time.time()
        injector = Injector(platform, kube, api, opts.preemption_hold, opts.work / BAD_NODES)
        with injector.bad_nodes:
            for fault in plan:
                while time.time() < start + fault.at and not _finished(api):
                    time.sleep(0.2)
                if _finished(api):
                    break
                injected.append(inject(injector, fault))
            wait_for("the job to finish", lambda: _finished(api), 1800, 1.0)
        status = dict(api.get_rtj(story.NAMESPACE, JOB).get("status") or {})
        leaks = _leaks(api, kube, status)
        facts_extra = {"bad_node_kills": injector.bad_nodes.kills}
    finally:
        cpu_seconds = cpu.stop()
        left = story.down(platform, display)
        shutil.rmtree(LocalCluster(platform.cluster_name).dir, ignore_errors=True)
    logs = _attempt_logs(platform)
    baseline = no_fault_run(opts)
    facts = judge(created, status, logs, injected, baseline, leaks + left)
    facts["features"] = opts.features()
    facts["variant"] = opts.variant()
    facts["mix"] = dict(opts.mix) if opts.faults is None else None  # the baseline re-seeds
    facts["generation_starts"] = generation_starts(platform)
    facts["cpu_seconds"] = cpu_seconds
    facts.update(facts_extra)
    return facts


def _finished(api: Any) -> bool:
    phase = (api.get_rtj(story.NAMESPACE, JOB).get("status") or {}).get("phase")
    return phase in ("Succeeded", "Failed")


def _attempt_logs(platform: story.Options) -> dict[int, dict[int, list[str]]]:
    """attempt -> rank -> JSON lines, from the runner's per-pod directories: the workers' and
    the warm spares' (a spare that took a rank logs under it)."""
    root = platform.state / "runner" / "pods" / story.NAMESPACE
    out: dict[int, dict[int, list[str]]] = {}
    for f in sorted(root.glob(f"{JOB}-a*-*/volumes/train-logs/rank-*.jsonl")):
        attempt = int(f.parts[-4].split("-a")[1].split("-")[0])
        rank = int(f.stem.split("-")[1])
        out.setdefault(attempt, {}).setdefault(rank, []).extend(f.read_text().splitlines())
    return out


STARTED = re.compile(
    r"rtj-shim supervise: generation (\d+): started \S+ "
    r"(from its warm standby|from the pod's fork server|cold)"
)
"""The supervisor's line for each generation it starts (`rtj_shim.agent.supervisor.Supervisor`)."""


def generation_starts(platform: story.Options) -> list[dict[str, Any]]:
    """Every trainer generation the pods' supervisors started, and whether warm (forked from
    the pod's fork server or handed to a standby: `spec.recovery.inPlacePreload`) or cold,
    from the containers' logs."""
    root = platform.state / "runner" / "pods" / story.NAMESPACE
    out = []
    for f in sorted(root.glob(f"{JOB}-a*-*/containers/trainer/log")):
        for m in STARTED.finditer(f.read_text(errors="replace")):
            out.append({"pod": f.parts[-4], "generation": int(m[1]), "warm": m[2] != "cold",
                        "forked": m[2].endswith("fork server")})  # fmt: skip
    return out


def _leaks(api: Any, kube: Any, status: dict[str, Any]) -> list[str]:
    """JobSets and pods of earlier attempts, taints the job does not record, and what a
    preemption's urgent workload left."""
    final = status.get("attempt")
    out = kueue_preemption.kueue_preemptor_leaks(kube, story.NAMESPACE)
    for js in api.list_jobsets(story.NAMESPACE):
        if js["metadata"]["labels"].get("training.resilient.dev/attempt") != str(final):
            out.append(f"JobSet {js['metadata']['name']}")
    for pod in api.list_pods(story.NAMESPACE, f"training.resilient.dev/job={JOB}"):
        if pod["metadata"]["labels"].get("training.resilient.dev/attempt") != str(final):
            out.append(f"pod {pod['metadata']['name']}")
    recorded = {q["node"] for q in status.get("quarantinedNodes") or []}
    for node in kube.core.list_node().items:
        name = node.metadata.name
        for taint in node.spec.taints or []:
            if taint.key.startswith("training.resilient.dev/") and name not in recorded:
                out.append(f"taint {taint.key} on {name}")
    return out


def judge(
    created: float,
    status: dict[str, Any],
    logs: dict[int, dict[int, list[str]]],
    injected: list[dict[str, Any]],
    baseline: dict[int, dict[int, float]],
    leaks: list[str],
) -> dict[str, Any]:
    """The run's facts and problems (`bench.soak_judge`)."""
    return soak_judge.judge(created, status, logs, injected, baseline, leaks, MAX_RESTARTS)


def code_version() -> str:
    """The commit the operator, shim and trainer ran from, and whether their files had
    changes not yet committed (every process of the run loads them from this tree)."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True,
                              check=False).stdout.strip()  # fmt: skip

    dirty = git("status", "--porcelain", "--", "operator", "trainer-shim", "examples")
    return git("rev-parse", "--short", "HEAD") + (" (with uncommitted changes)" if dirty else "")


def load_average() -> str:
    load = os.getloadavg()
    return f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}"


def machine() -> str:
    return f"{os.cpu_count()} CPUs, load average {load_average()}"


def write_report(
    out: Path,
    facts: dict[str, Any],
    opts: SoakOptions,
    where: str,
    name: str = "goodput",
    command: str | None = None,
) -> None:
    """`<name>.md`, `<name>-timeline.svg` and `<name>.json` under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    facts.setdefault("settings", settings(opts))
    facts.setdefault("machine", where)
    text = soak_report.markdown(facts, facts["settings"], where, f"{name}-timeline.svg", command)
    (out / f"{name}.md").write_text(text)
    svg = soak_report.timeline_svg(
        facts["created"], facts["timeline"], facts["injected"],
        f"soak ({opts.variant()}): {len(facts['injected'])} faults, "
        f"goodput {facts['goodput'] * 100:.1f}%",
    )  # fmt: skip
    (out / f"{name}-timeline.svg").write_text(svg)
    (out / f"{name}.json").write_text(json.dumps(facts, indent=2, default=str) + "\n")


def parse_mix(text: str) -> dict[str, float]:
    """``KIND=WEIGHT,...`` as a mix (argparse's type: a bad one is its error)."""
    mix: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        kind, _, weight = part.partition("=")
        if kind not in KINDS:
            raise argparse.ArgumentTypeError(f"{kind!r}: expected one of {', '.join(KINDS)}")
        try:
            mix[kind] = float(weight or "1")
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r}: expected KIND=WEIGHT") from None
        if mix[kind] < 0:
            raise argparse.ArgumentTypeError(f"{part!r}: expected a weight of 0 or more")
    if not any(mix.values()):
        raise argparse.ArgumentTypeError(f"{text!r}: expected at least one positive weight")
    return mix


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mtbf", type=float, default=60.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--in-place", action=argparse.BooleanOptionalAction, default=True,
                   help="spec.recovery.inPlace (default: on)")  # fmt: skip
    p.add_argument("--fast-every", type=int, default=SoakOptions.fast_every,
                   help="spec.checkpoint.fastTier.everySteps, 0: off (%(default)s)")  # fmt: skip
    p.add_argument("--spares", type=int, default=0,
                   help="spec.spares: warm spares (needs --in-place; %(default)s)")  # fmt: skip
    p.add_argument("--preload", action="store_true",
                   help="spec.recovery.inPlacePreload: a warm standby interpreter per pod, "
                   "the trainer under python, not torchrun (needs --in-place)")  # fmt: skip
    p.add_argument(
        "--async-save",
        action="store_true",
        help="the trainer's durable saves in the background (save(blocking=False))",
    )
    p.add_argument("--drain-every", type=int, default=0,
                   help="spec.checkpoint.fastTier.drainEverySteps: the durable tier fed by "
                   "the sidecar from the fast tier, the trainers saving only their last "
                   "step (a multiple of --fast-every; 0: off)")  # fmt: skip
    p.add_argument(
        "--save-every",
        type=int,
        default=SoakOptions.save_every,
        help="the trainers' durable interval in steps (%(default)s)",
    )
    p.add_argument("--auto-interval", action="store_true",
                   help="plannedIntervalSeconds: auto, the trainers saving by the operator's "
                   "interval (--save-seconds=auto); no drain")  # fmt: skip
    p.add_argument("--preemption-hold", type=float, default=PREEMPTION_HOLD,
                   help="seconds a preemption's urgent workload keeps the quota once "
                   "admitted (%(default)s)")  # fmt: skip
    p.add_argument("--mix", type=parse_mix, default=None,
                   help="the fault mix, KIND=WEIGHT,... (default: every kind but sdc and bad_node, "
                   "bench.soak_schedule.DEFAULT_MIX)")  # fmt: skip
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    p.add_argument("--name", default="goodput", help="the report's file names")
    p.add_argument("--work", type=Path, default=SoakOptions.work)
    args = p.parse_args(argv)
    if args.fast_every and not args.in_place:
        p.error("--fast-every needs --in-place (give --fast-every 0 with --no-in-place)")
    if args.spares and not args.in_place:
        p.error("--spares needs --in-place")
    if args.preload and not args.in_place:
        p.error("--preload needs --in-place")
    opts = SoakOptions(mtbf=args.mtbf, seed=args.seed, steps=args.steps, work=args.work,
                       in_place=args.in_place, fast_every=args.fast_every,
                       preemption_hold=args.preemption_hold, spares=args.spares,
                       preload=args.preload, async_save=args.async_save,
                       drain_every=args.drain_every, save_every=args.save_every,
                       auto_interval=args.auto_interval,
                       mix=args.mix or dict(DEFAULT_MIX))  # fmt: skip
    command = "python -m bench.goodput " + " ".join(
        sys.argv[1:] if argv is None else argv
    )  # fmt: skip
    before, began, code = machine(), time.time(), code_version()
    facts = run(opts)
    facts["harness_seconds"] = time.time() - began
    facts["code"] = code if code == code_version() else f"{code}, then {code_version()}"
    facts["load_end"] = load_average()
    facts["command"] = command
    where = f"{before} at the start, {facts['load_end']} at the end"
    write_report(args.out, facts, opts, where, args.name, command)
    sys.stdout.write(f"goodput {facts['goodput'] * 100:.1f}%; problems: {facts['problems']}\n")
    return 1 if facts["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
