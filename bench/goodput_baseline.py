"""The goodput soak's side-by-side baseline: the same training, fault schedule and cluster
without the operator (issue 18 b).

    python -m bench.goodput_baseline [--mtbf 60] [--seed 1] [--steps 3000] [--cap S]
        [--against bench/results/goodput.json] [--preemption-hold S] [--out bench/results]

What a user builds without us (`bench.baseline_jobset`): a JobSet with RestartJobSet
(`maxRestarts` 1000), torchrun with the static rendezvous, examples/ddp_train.py with
`--plain-checkpoints` (rank 0 `torch.save`s the whole state every `--save-every` steps to a
shared volume, every rank resumes from the highest-numbered file, nothing verified; torch's
default process group: a hang waits out gloo's 30-minute timeout). The same seeded schedule
is injected into the JobSet's current pods (`Injector` below): rank_killed, gpu_xid and
eviction fail a pod, so the JobSet restarts (nothing quarantines the XID node); node_lost
powers the node off and the JobSet waits for whatever Kubernetes does; hang SIGSTOPs a
rank; corrupt_newest kills a rank, then flips a byte in the largest tensor of the newest step
file (before the restart reads it); preemption is Kueue's own, as for the operator (the
baseline's JobSet is queued in the same ClusterQueue): Kueue suspends the JobSet, its Jobs'
pods are deleted, and once the urgent workload leaves, the JobSet is admitted again and its
trainers resume from the newest file (`split_restarts` tells the resumed pods' world from
the suspended one's).

It runs until the JobSet completes or a wall-clock cap (default 1.5x the operator's run,
`--against`), and its goodput is over that wall time (`bench.baseline_judge`). A final model
that differs from the no-fault run is a finding, reported; only harness errors fail it.
Writes goodput-baseline.json, and with `--against` the side-by-side goodput-comparison.md
and goodput-comparison.svg (`bench.soak_compare`, which also redraws them from the JSON
files). `--drop node_lost` runs the same schedule without that kind (the rest at the same
times) into goodput-baseline-without-node_lost.json: a variant the comparison can show too.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from kubernetes.client.exceptions import ApiException

from bench import baseline_jobset as bj
from bench import baseline_judge, goodput, soak_compare
from bench import soak_accounting as acc
from bench.cpu_account import CpuSampler
from bench.soak_schedule import DEFAULT_MIX, KINDS, Fault, schedule
from bench.soak_training import BAD_NODES, fault_args
from e2e.cluster.cluster import LocalCluster
from e2e.cluster.kueue_preemption import kueue_preemptor_leaks
from e2e.demo import story
from e2e.operator_proc import REPO, wait_for

NVRX_VERSION = "0.4.1"
"""nvidia-resiliency-ext as pyproject.toml pins it (the newest pip installs on glibc 2.36)."""
CAP_FACTOR = 1.5
FINISH_WAIT = 30.0
"""How long a baseline whose model is trained waits for its JobSet's completion."""
STARTUP_WAIT = 60.0
"""How long a fault due during a world's start waits for that world's first step."""


class Injector(goodput.Injector):
    """The soak's injector, aimed at the JobSet's current pods and the plain files."""

    def __init__(
        self,
        opts: story.Options,
        kube: Any,
        api: Any,
        claim_dir: Path,
        preemption_hold: float = goodput.PREEMPTION_HOLD,
        bad_nodes: Path | None = None,
    ) -> None:
        super().__init__(opts, kube, api, preemption_hold, bad_nodes)
        self.claim_dir = claim_dir
        self._newest = newest_plain_step_function()  # imports torch: not while a fault waits

    def apply(self, fault: Fault) -> str:
        if fault.kind != "corrupt_newest":
            return super().apply(fault)
        pod = self._current(fault.rank)
        pid = self._trainer(pod) if pod is not None else None
        if pod is None or pid is None:
            return "skipped: no running trainer for that rank"
        # the kill first, so no newer file can follow the corrupted one; a save whose
        # rename was under way lands within the second, the restart reads files much later
        os.kill(pid, signal.SIGKILL)
        time.sleep(1.0)
        return f"SIGKILL rank {fault.rank} (pid {pid}); then {self._corrupt_newest()}"

    def _current(self, rank: int) -> dict[str, Any] | None:
        """The rank's pod of the JobSet's current world, once that world trains: a fault
        due while it still starts waits (up to `STARTUP_WAIT`) for the rank's first step. A
        kill during the interpreter's start left a world without a log line, invisible to
        the judge (CI, stop 25: two worlds counted for two kills)."""
        deadline = time.monotonic() + STARTUP_WAIT
        while True:
            pod = self._world_pod(rank)
            if pod is None or self._trains(pod, rank) or time.monotonic() >= deadline:
                return pod
            time.sleep(0.5)

    def _world_pod(self, rank: int) -> dict[str, Any] | None:
        restarts = (self.kube.jobset_get(bj.NAME, story.NAMESPACE).get("status") or {}).get(
            "restarts", 0
        )
        pods = self.api.list_pods(story.NAMESPACE, f"{bj.JOBSET_LABEL}={bj.NAME}")
        return bj.current_pod(pods, int(restarts), rank)

    def _trains(self, pod: dict[str, Any], rank: int) -> bool:
        """The pod's trainer has logged a step of its world (under NVRx's elastic
        rendezvous a pod's rank need not be its index: any rank's log of the pod)."""
        restarts = pod["metadata"]["labels"][bj.RESTARTS_LABEL]
        logs = story._pod_dir(self.opts, pod) / "volumes" / "train-logs" / f"restart-{restarts}"
        with contextlib.suppress(OSError):
            return any('"loss"' in log.read_text() for log in logs.glob("rank-*.jsonl"))
        return False

    def _corrupt_newest(self) -> str:
        step = self._newest([p.name for p in self.claim_dir.glob("step-*.pt")])
        if step is None:
            return "no step file yet: nothing corrupted"
        path = self.claim_dir / f"step-{step}.pt"
        body = bytearray(path.read_bytes())
        record, at = bj.largest_tensor_middle(bytes(body))
        body[at] ^= 0xFF
        path.write_bytes(bytes(body))
        return f"flipped a byte of {path.name} ({record.split('/', 1)[-1]}, the largest tensor)"


def newest_plain_step_function() -> Callable[[list[str]], int | None]:
    """The trainer's own choice of the file to resume from (examples/plain_checkpoints.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "plain_checkpoints", REPO / "examples" / "plain_checkpoints.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # its dataclasses look themselves up
    spec.loader.exec_module(module)
    newest: Callable[[list[str]], int | None] = module.newest_plain_step
    return newest


def _attempt_logs(platform: story.Options) -> dict[int, dict[int, list[str]]]:
    """attempt -> rank -> JSON lines, from the runner's per-pod directories
    (`split_restarts`)."""
    root = platform.state / "runner" / "pods" / story.NAMESPACE
    pattern = f"{bj.NAME}-{bj.RJOB}-0-*/volumes/train-logs/restart-*/rank-*.jsonl"
    return split_restarts(
        (int(f.parent.name.split("-")[1]), int(f.stem.split("-")[1]), world)
        for f in sorted(root.glob(pattern))
        for world in by_restore(f.read_text().splitlines())
    )


def by_restore(lines: list[str]) -> list[list[str]]:
    """A rank log's lines cut before each restore record: one piece per trainer process
    that wrote to it (NVRx's in-job restarts start the rank again in the same pod, with the
    same log; a torchrun pod's log has one)."""
    pieces: list[list[str]] = []
    for line in lines:
        record = acc.parse_record(line)
        if not pieces or (record is not None and record.get("event") == "restore"):
            pieces.append([])
        pieces[-1].append(line)
    return pieces


def split_restarts(
    files: Iterable[tuple[int, int, list[str]]],
) -> dict[int, dict[int, list[str]]]:
    """Each pod's log `(restart attempt, rank, lines)` -> attempt -> rank -> lines.

    The attempt is the JobSet's restart attempt, but for one case: a Kueue preemption
    suspends the JobSet, whose Jobs delete their pods, and the re-admitted JobSet resumes the
    same Jobs, whose new pods carry the same restart attempt. Those are worlds of their own
    (their trainers resume from a file again), told apart by time: the pods of one world
    train together, a later world starts after the earlier one's last record. A restart
    attempt with several worlds numbers them on, and every later attempt moves up as many
    (with none, the attempts are the restart attempts, as before)."""
    by_restart: dict[int, list[tuple[float, float, int, list[str]]]] = {}
    for restart, rank, lines in files:
        times = [float(r["time"]) for r in acc.parse_records(lines) if "time" in r]
        first, last = (min(times), max(times)) if times else (float("inf"), float("-inf"))
        by_restart.setdefault(restart, []).append((first, last, rank, lines))
    out: dict[int, dict[int, list[str]]] = {}
    shift = 0
    for restart in sorted(by_restart):
        groups: list[dict[int, list[str]]] = []
        end = float("-inf")
        for first, last, rank, lines in sorted(by_restart[restart], key=lambda e: e[0]):
            if not groups or (first > end and first != float("inf")):
                groups.append({})
            groups[-1].setdefault(rank, []).extend(lines)
            end = max(end, last)
        for k, group in enumerate(groups):
            out[restart + shift + k] = group
        shift += len(groups) - 1
    return out


_ERROR = re.compile(r"^(\[rank\d+\]: )?[\w.]*(Error|Exception)\b.*")


def _last_errors(platform: story.Options, pods: list[dict[str, Any]]) -> dict[str, str]:
    out = {}
    for pod in pods:
        log = story._pod_dir(platform, pod) / "containers" / "trainer" / "log"
        with contextlib.suppress(OSError):
            lines = log.read_text(errors="replace").splitlines()[-200:]
            errors = [m.group(0) for line in lines if (m := _ERROR.match(line.strip()))]
            if errors:
                out[pod["metadata"]["name"]] = errors[-1][:200]
    return out


@dataclasses.dataclass(frozen=True)
class Flavour:
    """What differs between the baselines' runs: the JobSet, how the injector finds a
    rank's pod, the trainers' logs, and the judge."""

    body: Callable[[list[str]], dict[str, Any]]  # the trainer's arguments -> the JobSet
    injector: type[Injector]
    logs: Callable[[story.Options], Any]  # truthy once a step was logged
    last_step: Callable[[Any], tuple[float, int] | None]  # (time, step) of the newest
    judge: Callable[..., dict[str, Any]]  # (created, stopped, completed, logs, injected,
    # stall, opts)
    trained_out: Callable[[story.Options], bool] = lambda platform: False  # the model is
    # trained (asked every 0.2 s while the faults wait: a cheap look, not a read of the logs)


def flavour(launcher: str) -> Flavour:
    """The JobSet baselines (b, d: `bench.baseline_jobset`), or TorchFT's (c)."""
    if launcher == "torchft":
        from bench import goodput_torchft

        return goodput_torchft.FLAVOUR
    bj.launcher_command(launcher, goodput.RANKS)  # an unknown launcher fails here
    return Flavour(
        lambda args: bj.jobset(story.NAMESPACE, story.QUEUE, goodput.RANKS, args,
                               launcher=launcher),
        Injector, _attempt_logs, _last_step, _judge,
    )  # fmt: skip


def _last_step(logs: dict[int, dict[int, list[str]]]) -> tuple[float, int] | None:
    times = [(t, s) for ranks in logs.values()
             for s, t in acc.parse_attempt(0, ranks.get(0, [])).steps.items()]  # fmt: skip
    return max(times, default=None)


def _judge(
    created: float, stopped: float, completed: str | None, logs: dict[int, dict[int, list[str]]],
    injected: list[dict[str, Any]], stall: str | None, opts: goodput.SoakOptions,
) -> dict[str, Any]:  # fmt: skip
    reference = goodput.no_fault_run(opts)
    return baseline_judge.judge(
        created, stopped, completed, logs, injected, reference, stall, opts.steps
    )


def run(opts: goodput.SoakOptions, cap: float, launcher: str = "torchrun") -> dict[str, Any]:
    """One baseline soak, `cap` seconds at most from the JobSet's creation; each pod's
    trainer under `launcher` (`bench.baseline_jobset.launcher_command`, or `torchft`)."""
    kind = flavour(launcher)
    shutil.rmtree(opts.work, ignore_errors=True)
    platform = story.Options(
        out=opts.work / "out", state=opts.work / "state",
        cluster_name=f"rtj-base-{os.getpid()}", nodes=goodput.NODES, timeout=600,
    )  # fmt: skip
    (platform.state / "logs").mkdir(parents=True)
    lines: list[str] = []
    display = story.Display(lines.append)
    state: dict[str, Any] = {"pids": {}}
    plan = opts.faults if opts.faults is not None else seeded(opts)
    injected: list[dict[str, Any]] = []
    claim_dir = platform.state / "runner" / "claims" / story.NAMESPACE / bj.CLAIM
    stall: str | None = None
    cpu = CpuSampler()
    cpu.start()
    try:  # the operator starts with the platform and stays idle: no RTJ is created
        _, kube, api = story.start_platform(platform, display, state)
        pv, pvc = bj.shared_volume(story.NAMESPACE)
        core: Any = kube.core  # the bodies are plain dicts
        core.create_persistent_volume(pv)
        core.create_namespaced_persistent_volume_claim(story.NAMESPACE, pvc)
        wait_for("the checkpoint claim to bind", lambda: _bound(kube), 60, 0.5)
        goodput.prepare_preemption(kube, plan)
        trainer = [f"--steps={opts.steps}", f"--save-every={opts.save_every}",
                   f"--step-sleep={opts.step_sleep}", *fault_args(opts)]  # fmt: skip
        created = time.time()
        kube.jobset_create(kind.body(trainer), story.NAMESPACE)
        deadline = created + cap
        # built first: it imports torch, which took 20 s on a loaded machine, and the
        # schedule's times count from `start` (both faults then came at once, in one world)
        injector = kind.injector(
            platform, kube, api, claim_dir, opts.preemption_hold, opts.work / BAD_NODES
        )
        wait_for("the first step", lambda: kind.logs(platform), 600, 0.5)
        start = time.time()

        def done() -> bool:
            if time.time() >= deadline or _finished(kube) is not None:
                return True
            return kind.trained_out(platform)

        with injector.bad_nodes:  # a bad node kills what trains on it to the end
            for fault in plan:
                while time.time() < start + fault.at and not done():
                    time.sleep(0.2)
                if done():
                    break
                injected.append(goodput.inject(injector, fault))
            while not done():
                time.sleep(1.0)
        stopped = time.time()
        # trained out: the other groups' ends and the JobSet's completion follow within
        # seconds, unless a group never ends (hung)
        if kind.trained_out(platform):
            with contextlib.suppress(TimeoutError):
                wait_for("the JobSet to complete", lambda: _finished(kube), FINISH_WAIT, 1.0)
        bad_node_kills = injector.bad_nodes.kills
        completed = _finished(kube)
        if completed != "Completed":
            stall = _stall(platform, kube, api, stopped, kind)
        leaks = kueue_preemptor_leaks(kube, story.NAMESPACE)
    finally:
        cpu_seconds = cpu.stop()
        left = story.down(platform, display)
        shutil.rmtree(LocalCluster(platform.cluster_name).dir, ignore_errors=True)
    facts = kind.judge(created, stopped, completed, kind.logs(platform), injected, stall, opts)
    facts["problems"] += [f"left running: {what}" for what in left]
    facts["problems"] += [f"leaked: {what}" for what in leaks]
    facts["cap_seconds"] = cap
    facts["cpu_seconds"] = cpu_seconds
    facts["bad_node_kills"] = bad_node_kills
    return facts


def _bound(kube: Any) -> bool:
    claim = kube.core.read_namespaced_persistent_volume_claim(bj.CLAIM, story.NAMESPACE)
    return bool(claim.status and claim.status.phase == "Bound")


def _finished(kube: Any) -> str | None:
    try:
        return bj.finished(kube.jobset_get(bj.NAME, story.NAMESPACE))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _stall(platform: story.Options, kube: Any, api: Any, stopped: float, kind: Flavour) -> str:
    pods = api.list_pods(story.NAMESPACE, f"{bj.JOBSET_LABEL}={bj.NAME}")
    last = kind.last_step(kind.logs(platform))
    return bj.stall_summary(
        kube.jobset_get(bj.NAME, story.NAMESPACE), pods,
        last[1] if last else None, stopped - last[0] if last else None,
        _last_errors(platform, pods),
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mtbf", type=float, default=60.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--cap", type=float, help="seconds from the JobSet's creation")
    p.add_argument("--against", type=Path, help="the operator's run: goodput.json")
    p.add_argument(
        "--drop",
        action="append",
        default=[],
        choices=KINDS,
        help="leave this kind out of the seeded schedule (the rest keep their times)",
    )
    p.add_argument("--preemption-hold", type=float, default=goodput.PREEMPTION_HOLD,
                   help="seconds a preemption's urgent workload keeps the quota once "
                   "admitted (%(default)s)")  # fmt: skip
    p.add_argument("--launcher", choices=(*bj.LAUNCHERS, "torchft"), default="torchrun",
                   help="torchrun (b), NVRx's ft_launcher, its in-job restarts (d), or "
                   "TorchFT's replica groups and lighthouse (c)")  # fmt: skip
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = p.parse_args(argv)
    opts = goodput.SoakOptions(
        mtbf=args.mtbf, seed=args.seed, steps=args.steps, work=Path("/tmp/rtj-soak-baseline"),
        preemption_hold=args.preemption_hold,
    )  # fmt: skip
    ours = json.loads(args.against.read_text()) if args.against else None
    if ours is not None:
        opts.mix = mix_of(ours, opts)
    if args.drop:
        opts.faults = [f for f in seeded(opts) if f.kind not in args.drop]
    cap = args.cap or (
        CAP_FACTOR * ours["wall_seconds"] if ours else opts.steps * opts.expected_step_seconds * 2
    )
    before = goodput.machine()
    facts = run(opts, cap, args.launcher)
    facts["settings"] = soak_compare.settings(opts, cap)
    if opts.mix != dict(DEFAULT_MIX):
        facts["settings"]["fault mix"] = ", ".join(f"{k} {w:g}" for k, w in opts.mix.items())
    facts["machine"] = f"{before} at the start"
    name = "goodput-baseline"
    if args.launcher == "nvrx":
        facts["label"] = f"(d) NVRx {NVRX_VERSION} ft_launcher in-job restart + plain torch.save"
        facts["settings"]["launcher"] = " ".join(bj.launcher_command("nvrx", goodput.RANKS))
        name += "-nvrx"
    if args.launcher == "torchft":
        from bench import baseline_torchft as btf

        facts["label"] = f"(c) TorchFT {btf.TORCHFT_VERSION}: replica groups of one, lighthouse"
        facts["settings"]["lighthouse"] = " ".join(btf.LIGHTHOUSE_COMMAND)
        name += "-torchft"
    if args.drop:
        facts["label"] = f"(b') the same, without {', '.join(args.drop)}"
        name += "-without-" + "-".join(args.drop)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.json").write_text(json.dumps(facts, indent=2, default=str) + "\n")
    if ours is not None and not args.drop and args.launcher == "torchrun":
        soak_compare.write(args.out, ours, facts)
    sys.stdout.write(f"baseline goodput {facts['goodput'] * 100:.1f}%; findings: "
                     f"{facts['findings']}; problems: {facts['problems']}\n")  # fmt: skip
    return 1 if facts["problems"] else 0


LEGACY_MIX = {k: w for k, w in DEFAULT_MIX.items() if k != "preemption"}
"""The default fault mix before the preemption kind (issue 18): the runs of that time
record no mix."""


def mix_of(ours: Mapping[str, Any], opts: goodput.SoakOptions) -> dict[str, float]:
    """The fault mix the operator's run drew its schedule from, so the same seed draws the
    same schedule here (later faults included, which the operator's run may not have
    reached): the one it records, else the default mix of today or of before the preemption
    kind, whichever draws the faults it injected (today's when neither: the comparison
    then says the schedules differ)."""
    if ours.get("mix"):
        return dict(ours["mix"])
    done = [(float(f["scheduled"]), str(f["kind"]), int(f["rank"])) for f in ours["injected"]]
    for mix in (dict(DEFAULT_MIX), LEGACY_MIX):
        plan = seeded(dataclasses.replace(opts, mix=mix))
        if [(f.at, f.kind, f.rank) for f in plan[: len(done)]] == done:
            return mix
    return dict(DEFAULT_MIX)


def seeded(opts: goodput.SoakOptions) -> list[Fault]:
    """The soak's seeded schedule for these options (the same as bench.goodput's)."""
    return schedule(
        opts.seed, opts.steps * opts.expected_step_seconds, opts.mtbf,
        ranks=goodput.RANKS, mix=opts.mix, caps=goodput.CAPS,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
