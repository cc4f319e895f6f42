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
import contextlib
import copy
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench import soak_accounting as acc
from bench import soak_judge, soak_report
from bench.cpu_account import CpuSampler
from bench.soak_schedule import DEFAULT_MIX, Fault, schedule
from e2e.cluster import faults as cluster_faults
from e2e.cluster.cluster import LocalCluster
from e2e.demo import drills, story
from e2e.operator_proc import REPO, wait_for
from e2e.podrunner.runner import descendants

JOB = "soak"
NODES = 6
RANKS = 2
# each takes a node out for good (quarantined, or powered off); one spare node stays
CAPS = {"gpu_xid": NODES - RANKS - 2, "node_lost": 1}
MAX_RESTARTS = 50
PREEMPTION_HOLD = 5.0
"""Seconds a preemption's urgent workload keeps the quota once admitted (`--preemption-hold`)."""
PREEMPTION_PRIORITY = 1000
"""Its WorkloadPriorityClass's value (the soak's job has none: 0)."""
CLUSTER_QUEUE = story.NAMESPACE
"""The platform's ClusterQueue (`story.start_platform` names it after the namespace)."""


@dataclass
class SoakOptions:
    steps: int = 3000
    save_every: int = 100
    step_sleep: float = 0.05
    mtbf: float = 60.0
    seed: int = 1
    hang_timeout: int = 15
    mix: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_MIX))
    work: Path = Path("/tmp/rtj-soak")
    expected_step_seconds: float = 0.09
    """For the schedule's horizon only (steps x this); faults past the end are dropped."""
    faults: list[Fault] | None = None
    """A fixed schedule instead of the seeded one (the smoke test's)."""
    in_place: bool = True
    """spec.recovery.inPlace (and the operator's --control-secret-file)."""
    fast_every: int = 10
    """spec.checkpoint.fastTier.everySteps (0: no fast tier; it needs in_place)."""
    in_place_deadline: int = 60
    """spec.recovery.inPlaceDeadlineSeconds."""
    preemption_hold: float = PREEMPTION_HOLD
    """How long a preemption's urgent workload keeps the quota once Kueue admitted it."""
    spares: int = 0
    """spec.spares (warm spares; they need in_place). The platform gets as many more nodes,
    and one per GPU fault or lost node (the pod its Job creates again is the new spare), so
    the faults have the nodes they have without spares."""
    preload: bool = False
    """spec.recovery.inPlacePreload (`drills.preloaded`: a warm standby interpreter per pod,
    the trainer under python directly instead of torchrun; it needs in_place)."""
    async_save: bool = False
    """The trainer's durable saves in the background (`save(blocking=False)`: staged, then
    written, hashed and committed by a thread) instead of blocking every `save_every` steps:
    the example's `--async-save`. Off: the durable save to S3 holds the step (~0.55 s for
    the soak's model on this machine, every 100 steps)."""
    drain_every: int = 0
    """spec.checkpoint.fastTier.drainEverySteps (0: no drain). With a drain the durable tier
    is fed by pod 0's progress sidecar publishing every `drain_every`-th fast step, off the
    training processes; the trainers' own durable save is then only their last step."""

    def __post_init__(self) -> None:
        if self.fast_every < 0 or (self.fast_every and not self.in_place):
            raise ValueError("the fast tier (fast_every > 0) needs in-place restarts")
        if self.spares < 0 or (self.spares and not self.in_place):
            raise ValueError("warm spares (spares > 0) need in-place restarts")
        if self.preload and not self.in_place:
            raise ValueError("a warm standby interpreter (preload) needs in-place restarts")
        if self.drain_every < 0 or (
            self.drain_every and (not self.fast_every or self.drain_every % self.fast_every)
        ):
            raise ValueError("a drain (drain_every > 0) needs the fast tier, every "
                             "fast_every-th step a multiple of it")  # fmt: skip

    def features(self) -> dict[str, Any]:
        return {"in_place": self.in_place, "fast_every": self.fast_every, "spares": self.spares,
                "preload": self.preload, "async_save": self.async_save,
                "drain_every": self.drain_every}  # fmt: skip

    def nodes(self) -> int:
        return NODES + (self.spares + sum(CAPS.values()) if self.spares else 0)

    def variant(self) -> str:
        """In words, for reports."""
        if not self.in_place:
            return "whole world only"
        tier = f"fast tier every {self.fast_every} steps" if self.fast_every else "no fast tier"
        spares = f", {self.spares} warm spare(s)" if self.spares else ""
        preload = ", warm interpreters (a fork server per pod)" if self.preload else ""
        background = ", background durable saves" if self.async_save else ""
        drain = f", drained to S3 every {self.drain_every} steps" if self.drain_every else ""
        return f"in place, {tier}{drain}{spares}{preload}{background}"

    def trainer_save_every(self) -> int:
        """The trainers' own durable interval: with a drain, only their last step."""
        return self.steps if self.drain_every else self.save_every


def _trainer_args(opts: SoakOptions) -> list[str]:
    return [
        f"--steps={opts.steps}",
        f"--save-every={opts.trainer_save_every()}",
        f"--step-sleep={opts.step_sleep}",
        *(["--async-save"] if opts.async_save else []),
    ]


def job_body(opts: SoakOptions) -> dict[str, Any]:
    body: dict[str, Any] = copy.deepcopy(yaml.safe_load(story.EXAMPLE.read_text()))
    body["metadata"]["name"] = JOB
    spec = body["spec"]
    spec["checkpoint"]["uri"] = f"s3://{story.BUCKET}/{JOB}"
    spec["failurePolicy"] = {"maxRestarts": MAX_RESTARTS,
                             "backoff": {"initialSeconds": 1, "maxSeconds": 5}}  # fmt: skip
    spec["progress"] = {"hangTimeoutSeconds": opts.hang_timeout}
    if opts.in_place:
        spec["recovery"] = {"inPlace": True, "inPlaceDeadlineSeconds": opts.in_place_deadline}
    if opts.fast_every:
        spec["checkpoint"]["fastTier"] = {"everySteps": opts.fast_every}
    if opts.drain_every:
        spec["checkpoint"]["fastTier"]["drainEverySteps"] = opts.drain_every
    if opts.spares:
        spec["spares"] = opts.spares
    container = spec["template"]["spec"]["containers"][0]
    keep = [a for a in container["command"] if not a.startswith(("--steps", "--save-every",
                                                                 "--step-sleep"))]  # fmt: skip
    container["command"] = [*keep, *_trainer_args(opts)]
    if opts.preload:
        drills.preloaded(body)
    return dict(body)


def no_fault_run(opts: SoakOptions) -> dict[int, dict[int, float]]:
    """The same training without faults (torchrun --standalone): rank -> step -> loss."""
    logs = opts.work / "baseline-logs"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RTJ_", "AWS_"))}
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         f"--nproc-per-node={RANKS}", "examples/ddp_train.py",
         f"--root=file://{opts.work / 'baseline-ckpt'}", f"--log-dir={logs}",
         *_trainer_args(opts), "--step-sleep=0"],
        cwd=REPO, env=env, check=True, timeout=1800, capture_output=True,
    )  # fmt: skip
    return {
        r: dict(acc.parse_attempt(0, (logs / f"rank-{r}.jsonl").read_text().splitlines()).losses)
        for r in range(RANKS)
    }


class Injector:
    """Applies one fault to the current attempt's world (pod-runner processes; for a
    preemption, Kueue)."""

    def __init__(
        self, opts: story.Options, kube: Any, api: Any, preemption_hold: float = PREEMPTION_HOLD
    ) -> None:
        self.opts, self.kube, self.api = opts, kube, api
        self.preemption_hold = preemption_hold
        self.preemptions: list[cluster_faults.Preemption] = []

    def _current(self, rank: int) -> dict[str, Any] | None:
        status = self.api.get_rtj(story.NAMESPACE, JOB).get("status") or {}
        attempt = status.get("attempt")
        pods = self.api.list_pods(
            story.NAMESPACE,
            f"training.resilient.dev/job={JOB},training.resilient.dev/attempt={attempt}",
        )
        index = "batch.kubernetes.io/job-completion-index"
        running = [p for p in pods if p["metadata"]["labels"].get(index) == str(rank)
                   and (p.get("status") or {}).get("phase") == "Running"]  # fmt: skip
        # a lost node's pod stays Running in the API beside its replacement (restart in
        # place replaces only the pods on a lost node): the one whose trainer is alive
        alive = [p for p in running if self._trainer(p) is not None]
        return next(iter(alive or running), None)

    def _trainer(self, pod: dict[str, Any]) -> int | None:
        """The rank's training process: not torchrun, nor the in-place supervisor, whose
        command lines name the script too."""
        pid_file = story._pod_dir(self.opts, pod) / "containers" / "trainer" / "pid"
        with contextlib.suppress(OSError, ValueError):
            for pid in descendants(int(pid_file.read_text())):
                if drills.is_trainer(pid):
                    return pid
        return None

    def apply(self, fault: Fault) -> str:
        """What was done (or why nothing was: no training world to hit)."""
        pod = self._current(fault.rank)
        pid = self._trainer(pod) if pod is not None else None
        if pod is None or pid is None:
            return "skipped: no running trainer for that rank"
        if fault.kind == "preemption":
            return self._preempt()
        node, name = pod["spec"]["nodeName"], pod["metadata"]["name"]
        if fault.kind == "hang":
            os.kill(pid, signal.SIGSTOP)
            return f"SIGSTOP rank {fault.rank} (pid {pid}, {name})"
        if fault.kind == "node_lost":
            off = self.opts.state / "runner" / "power-off" / node
            off.parent.mkdir(parents=True, exist_ok=True)
            off.touch()  # the runner's next heartbeat powers the node off
            return f"powered {node} off silently (rank {fault.rank}, {name})"
        if fault.kind == "eviction":
            self.kube.core.create_namespaced_pod_eviction(
                name, story.NAMESPACE, {"metadata": {"name": name}}
            )
            return f"evicted {name} (Eviction API)"
        if fault.kind == "gpu_xid":
            cluster_faults.gpu_xid(self.kube, node, story.XID)
        if fault.kind == "corrupt_newest":
            what = self._corrupt_newest()
            os.kill(pid, signal.SIGKILL)
            return f"{what}; SIGKILL rank {fault.rank}"
        os.kill(pid, signal.SIGKILL)
        return f"{'XID 79 on ' + node + '; ' if fault.kind == 'gpu_xid' else ''}SIGKILL " \
            f"rank {fault.rank} (pid {pid})"  # fmt: skip

    def _preempt(self) -> str:
        """Kueue preempts the job: an urgent workload needing the ClusterQueue's whole quota
        (`cluster_faults.kueue_preempt`), gone `preemption_hold` s after its admission."""
        p = cluster_faults.kueue_preempt(
            self.kube, story.NAMESPACE, story.QUEUE, CLUSTER_QUEUE,
            hold=self.preemption_hold, name=f"urgent-{len(self.preemptions) + 1}",
            priority=PREEMPTION_PRIORITY,
        )  # fmt: skip
        self.preemptions.append(p)
        return preemption_text(p)

    def _corrupt_newest(self) -> str:
        """Flip one byte of a data file of the newest committed step in the store (the
        checkpoint the next attempt will pin; its init containers must reject it)."""
        import base64

        import boto3

        secret = self.kube.core.read_namespaced_secret(story.SECRET, story.NAMESPACE)
        env = {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}
        s3 = boto3.client(
            "s3", endpoint_url=env["AWS_ENDPOINT_URL_S3"], region_name=env["AWS_DEFAULT_REGION"],
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        )  # fmt: skip
        keys: list[str] = []
        for page in s3.get_paginator("list_objects_v2").paginate(
            Bucket=story.BUCKET, Prefix=f"{JOB}/"
        ):
            keys += [o["Key"] for o in page.get("Contents", [])]
        committed = sorted(k.rsplit("/", 1)[0] for k in keys if k.endswith("/COMMITTED"))
        if not committed:
            return "no committed step yet: nothing corrupted"
        step = committed[-1]
        data = [k for k in keys if k.startswith(step + "/") and not k.endswith(
            ("/COMMITTED", "/manifest.json"))]  # fmt: skip
        if not data:
            return f"{step}: no data file"
        key = sorted(data)[0]
        body = bytearray(s3.get_object(Bucket=story.BUCKET, Key=key)["Body"].read())
        body[len(body) // 2] ^= 0xFF
        s3.put_object(Bucket=story.BUCKET, Key=key, Body=bytes(body))
        return f"flipped a byte of {key}"


def preemption_text(p: cluster_faults.Preemption) -> str:
    """A preemption in words, for the report's list of what was injected."""
    head = (f"Kueue: urgent Job {p.name} ({p.pods} pods x {p.gpus_per_pod} GPUs, the "
            f"ClusterQueue's whole quota, priority {p.priority})")  # fmt: skip
    if p.admitted is None:
        return f"{head} not admitted: nothing preempted"
    gone = f"{p.gone - p.released:.1f} s" if p.gone is not None else "not within the timeout"
    return (f"{head} admitted {p.admitted - p.created:.1f} s after it arrived (ours evicted), "
            f"held the quota {p.released - p.admitted:.1f} s, gone {gone} after its "
            "deletion")  # fmt: skip


def preemption_facts(p: cluster_faults.Preemption) -> dict[str, Any]:
    """What the injected record keeps of a preemption (Unix times)."""
    return {"preemptor": {"name": p.name, "created": p.created, "admitted": p.admitted,
                          "released": p.released, "gone": p.gone}}  # fmt: skip


def prepare_preemption(kube: Any, plan: list[Fault]) -> bool:
    """Let the ClusterQueue preempt (`withinClusterQueue: LowerPriority`) when the schedule
    holds a preemption. Only then: with one priority level it never preempts anything, but
    a schedule without one keeps the platform exactly as before."""
    if not any(f.kind == "preemption" for f in plan):
        return False
    cluster_faults.enable_kueue_preemption(kube, CLUSTER_QUEUE)
    return True


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
    cpu = CpuSampler()
    cpu.start()
    try:
        _, kube, api = story.start_platform(platform, display, state, operator_args=operator_args)
        prepare_preemption(kube, plan)
        created = time.time()
        api.create_rtj(story.NAMESPACE, job_body(opts))
        wait_for("the first step", lambda: _attempt_logs(platform), 600, 0.5)
        start = time.time()
        injector = Injector(platform, kube, api, opts.preemption_hold)
        for fault in plan:
            while time.time() < start + fault.at and not _finished(api):
                time.sleep(0.2)
            if _finished(api):
                break
            injected.append(inject(injector, fault))
        wait_for("the job to finish", lambda: _finished(api), 1800, 1.0)
        status = dict(api.get_rtj(story.NAMESPACE, JOB).get("status") or {})
        leaks = _leaks(api, kube, status)
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
    return facts


def inject(injector: Injector, fault: Fault) -> dict[str, Any]:
    """Apply `fault` now; its record. `at`: when it was done (a preemption, which takes its
    hold to apply: when the urgent workload arrived)."""
    before = len(injector.preemptions)
    what = injector.apply(fault)
    out = {"kind": fault.kind, "rank": fault.rank, "at": time.time(), "scheduled": fault.at,
           "what": what}  # fmt: skip
    if len(injector.preemptions) > before:
        p = injector.preemptions[-1]
        out.update(at=p.created, **preemption_facts(p))
    return out


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
"""The supervisor's line for each generation it starts (`rtj_shim.supervisor.Supervisor`)."""


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
    out = cluster_faults.kueue_preemptor_leaks(kube, story.NAMESPACE)
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


def settings(opts: SoakOptions) -> dict[str, Any]:
    return {"steps": opts.steps, "mean time between faults": f"{opts.mtbf:.0f} s",
            "seed": opts.seed, "hangTimeoutSeconds": opts.hang_timeout,
            "checkpoint every": (f"{opts.drain_every} steps, drained from the fast tier "
                                 "by pod 0's sidecar" if opts.drain_every else
                                 f"{opts.save_every} steps"
                                 + (" (in the background)" if opts.async_save else "")),
            "restart in place": (f"on (deadline {opts.in_place_deadline} s)"
                                 if opts.in_place else "off"),
            "fast tier": f"every {opts.fast_every} steps" if opts.fast_every else "off",
            **({"preemption hold": f"{opts.preemption_hold:g} s"}
               if may_preempt(opts) else {}),
            "workers": RANKS, "nodes": opts.nodes()}  # fmt: skip


def may_preempt(opts: SoakOptions) -> bool:
    """Whether the run's schedule may hold a preemption."""
    if opts.faults is not None:
        return any(f.kind == "preemption" for f in opts.faults)
    return opts.mix.get("preemption", 0) > 0


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
    p.add_argument("--preemption-hold", type=float, default=PREEMPTION_HOLD,
                   help="seconds a preemption's urgent workload keeps the quota once "
                   "admitted (%(default)s)")  # fmt: skip
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
                       drain_every=args.drain_every)  # fmt: skip
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
