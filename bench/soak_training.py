"""What the goodput soak trains: its settings (`SoakOptions`), its ResilientTrainingJob, and
the same training without faults that its final model must equal bit for bit."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench import soak_accounting as acc
from bench.soak_schedule import DEFAULT_MIX, Fault
from e2e.demo import drills, story
from e2e.operator_proc import REPO

JOB = "soak"
NODES = 6
RANKS = 2
# each takes a node out for good (quarantined, or powered off); one spare node stays
CAPS = {"gpu_xid": NODES - RANKS - 2, "node_lost": 1, "bad_node": 1}
MAX_RESTARTS = 50
PREEMPTION_HOLD = 5.0
"""Seconds a preemption's urgent workload keeps the quota once admitted (`--preemption-hold`)."""
PREEMPTION_PRIORITY = 1000
"""Its WorkloadPriorityClass's value (the soak's job has none: 0)."""
FLIP_NAME = "flip"
FLIP_FILE = f"/var/log/train/{FLIP_NAME}"
"""The file an `sdc` fault gives the rank's pod (its train-logs volume; the example trainer's
``--fault-flip-file``), in the operator's pods and the JobSet baseline's alike."""
BAD_NODES = "bad-nodes"
"""The folder under the soak's work directory holding a file per node a `bad_node` fault
broke: the platform's preflight node check fails where one exists (`preflight_config`)."""
PREFLIGHT_IMAGE = "registry.example/rtj-preflight:soak"
"""The platform's preflight image (the pod runner runs its command on the host)."""
DCGM_FAILURE = "dcgmi diag: GPU 0 failed the memory test (errors detected)"
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

    auto_interval: bool = False
    """spec.checkpoint.plannedIntervalSeconds: auto, the trainers saving by the operator's
    interval (`--save-seconds=auto`, no step-count saves): `save_every` is unused. The
    operator's prior is the schedule's own rate (`platform_config`)."""

    def __post_init__(self) -> None:
        if self.auto_interval and self.drain_every:
            raise ValueError("auto intervals (auto_interval) leave the durable saves to the "
                             "trainers: no drain")  # fmt: skip
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
                "drain_every": self.drain_every, "auto_interval": self.auto_interval}  # fmt: skip

    def nodes(self) -> int:
        """With spares, one more node per fault that may take one out for good."""
        taken = sum(n for kind, n in CAPS.items() if may_hold(self, kind))
        return NODES + (self.spares + taken if self.spares else 0)

    def variant(self) -> str:
        """In words, for reports."""
        if not self.in_place:
            return "whole world only"
        tier = f"fast tier every {self.fast_every} steps" if self.fast_every else "no fast tier"
        spares = f", {self.spares} warm spare(s)" if self.spares else ""
        preload = ", warm interpreters (a fork server per pod)" if self.preload else ""
        background = ", background durable saves" if self.async_save else ""
        drain = f", drained to S3 every {self.drain_every} steps" if self.drain_every else ""
        auto = ", durable interval auto" if self.auto_interval else ""
        return f"in place, {tier}{drain}{spares}{preload}{background}{auto}"

    def trainer_save_every(self) -> int:
        """The trainers' own durable interval: with a drain, only their last step."""
        return self.steps if self.drain_every else self.save_every


def trainer_args(opts: SoakOptions) -> list[str]:
    saves = (
        ["--save-every=0", "--save-seconds=auto"]
        if opts.auto_interval
        else [f"--save-every={opts.trainer_save_every()}"]
    )
    return [
        f"--steps={opts.steps}",
        *saves,
        f"--step-sleep={opts.step_sleep}",
        *(["--async-save"] if opts.async_save else []),
        *fault_args(opts),
    ]


def fault_args(opts: SoakOptions) -> list[str]:
    """The trainer's side of the faults the schedule may hold (an `sdc`: the flip file)."""
    return [f"--fault-flip-file={FLIP_FILE}"] if may_hold(opts, "sdc") else []


def job_body(opts: SoakOptions) -> dict[str, Any]:
    body: dict[str, Any] = copy.deepcopy(yaml.safe_load(story.EXAMPLE.read_text()))
    body["metadata"]["name"] = JOB
    spec = body["spec"]
    spec["checkpoint"]["uri"] = f"s3://{story.BUCKET}/{JOB}"
    spec["failurePolicy"] = {"maxRestarts": MAX_RESTARTS,
                             "silentDataCorruptionRestarts": MAX_RESTARTS,
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
    if opts.auto_interval:
        spec["checkpoint"]["plannedIntervalSeconds"] = "auto"
    container = spec["template"]["spec"]["containers"][0]
    keep = [a for a in container["command"] if not a.startswith(("--steps", "--save-every",
                                                                 "--step-sleep"))]  # fmt: skip
    container["command"] = [*keep, *trainer_args(opts)]
    if opts.preload:
        drills.preloaded(body)
    return dict(body)


def platform_config(opts: SoakOptions) -> dict[str, Any] | None:
    """The operator's platform configuration, None when the run needs none: for
    `auto_interval`, a prior at the schedule's own rate per node (a platform that knows its
    fleet) worth a quarter of an hour; for a `bad_node` fault, a preflight whose node check
    fails on a node the fault broke (`preflight_config`)."""
    out: dict[str, Any] = {}
    if opts.auto_interval:
        out["checkpointIntervals"] = {
            "priorFailuresPerNodeHour": float(f"{3600.0 / opts.mtbf / RANKS:.6g}"),
            "priorWeightHours": 0.25, "minSeconds": 5, "maxSeconds": 3600,
        }  # fmt: skip
    if may_hold(opts, "bad_node"):
        out["preflight"] = preflight_config(opts.work / BAD_NODES)
    return out or None


def preflight_config(bad_nodes: Path) -> dict[str, Any]:
    """The platform's preflight: its node check fails, as `dcgmi diag -r 1` does on a GPU
    with memory errors (exit 226, its report), on a node with a file in `bad_nodes`. Only a
    run that may hold a `bad_node` gets a preflight: the published runs' pods stay as they
    were (the demo platform names no preflight image)."""
    script = (f'if [ -e "{bad_nodes}/$RTJ_NODE_NAME" ]; then echo "{DCGM_FAILURE}" >&2; '
              "exit 226; fi")  # fmt: skip
    return {"image": PREFLIGHT_IMAGE, "nodeCommand": ["sh", "-c", script]}


def no_fault_run(opts: SoakOptions) -> dict[int, dict[int, float]]:
    """The same training without faults (torchrun --standalone): rank -> step -> loss."""
    logs = opts.work / "baseline-logs"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RTJ_", "AWS_"))}
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         f"--nproc-per-node={RANKS}", "examples/ddp_train.py",
         f"--root=file://{opts.work / 'baseline-ckpt'}", f"--log-dir={logs}",
         *trainer_args(opts), "--step-sleep=0"],
        cwd=REPO, env=env, check=True, timeout=1800, capture_output=True,
    )  # fmt: skip
    return {
        r: dict(acc.parse_attempt(0, (logs / f"rank-{r}.jsonl").read_text().splitlines()).losses)
        for r in range(RANKS)
    }


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
    return may_hold(opts, "preemption")


def may_hold(opts: SoakOptions, kind: str) -> bool:
    """Whether the run's schedule may hold a fault of `kind`."""
    if opts.faults is not None:
        return any(f.kind == kind for f in opts.faults)
    return opts.mix.get(kind, 0) > 0
