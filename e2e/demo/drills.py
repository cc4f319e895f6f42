"""What the drills and benchmarks on real training share: the running platform, the example
job renamed and tuned, the current pods of an attempt, a rank's training process, the job's
status."""

from __future__ import annotations

import copy
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from e2e.cluster.cluster import LocalCluster
from e2e.demo import story
from e2e.operator_proc import REPO, SINGLE_REPLICA_LEASE, wait_for
from e2e.podrunner.pod import kill_tree
from e2e.podrunner.runner import descendants
from rtj_operator.api import keys
from rtj_operator.api.ledger import LedgerPhase, RecoveryRecord
from rtj_operator.policy.ledger import PHASE_FIELDS, phase_seconds, wall_seconds
from rtj_shim.wire.control import STATE_FILE

RANK_LABEL = "batch.kubernetes.io/job-completion-index"


def job(name: str, *args: str, **spec: Any) -> dict[str, Any]:
    """The example job, renamed, with its own store prefix, extra trainer arguments."""
    body: dict[str, Any] = copy.deepcopy(yaml.safe_load(story.EXAMPLE.read_text()))
    body["metadata"]["name"] = name
    body["spec"]["checkpoint"]["uri"] = f"s3://{story.BUCKET}/{name}"
    container = body["spec"]["template"]["spec"]["containers"][0]
    container["command"] = [
        *(a for a in container["command"] if not a.startswith("--steps")),
        "--steps=100000",  # never finishes on its own: the drill deletes it
        *args,
    ]
    body["spec"].update(spec)
    return body


PRELOAD = ("torch", "rtj_shim.torch")
"""What the example trainer's warm standby imports (spec.recovery.inPlacePreload)."""


def preloaded(body: dict[str, Any]) -> dict[str, Any]:
    """The job with a warm standby interpreter per pod: its trainer run by ``python``
    directly (one rank per pod, from the operator's RANK/WORLD_SIZE/MASTER_* as torchrun
    would set them), not under torchrun, which a standby cannot run."""
    container = body["spec"]["template"]["spec"]["containers"][0]
    command = container["command"]
    if command[:2] != ["torchrun", "--nproc-per-node=1"]:
        raise ValueError(f"preloaded: expected the example's torchrun command, got {command}")
    container["command"] = ["python", *command[2:]]
    recovery = body["spec"].setdefault("recovery", {})
    recovery["inPlacePreload"] = list(PRELOAD)
    return body


def supervisor_report(opts: story.Options, pod: dict[str, Any]) -> dict[str, Any]:
    """What the pod's `rtj-shim supervise` reports (its control volume's state file; {}:
    none yet)."""
    path = story._pod_dir(opts, pod) / "volumes" / keys.CONTROL_VOLUME / STATE_FILE
    try:
        report: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return report


def container_pid(opts: story.Options, pod: dict[str, Any], container: str = "trainer") -> int:
    """The main process of a container of a pod run by the pod runner."""
    return int((story._pod_dir(opts, pod) / "containers" / container / "pid").read_text())


def trainer_pid(opts: story.Options, pod: dict[str, Any]) -> int:
    """The training process (torchrun's child) of a pod run by the pod runner."""
    (child,) = [p for p in descendants(container_pid(opts, pod)) if is_trainer(p)]
    return child


def freeze_pod(opts: story.Options, pod: dict[str, Any]) -> None:
    """Stop every process of the pod's containers now (SIGSTOP), as the pod runner does for
    a node cut off with ``freeze``, but at once rather than at the runner's next pass (up to
    a second later, 20 training steps of the example): a drill that freezes a node at a
    chosen step does this first, then writes the cut-off file (the runner stops the same
    processes again and continues them when contact is back)."""
    for pid_file in (story._pod_dir(opts, pod) / "containers").glob("*/pid"):
        kill_tree(int(pid_file.read_text()), signal.SIGSTOP)


def cut_off(opts: story.Options, victims: list[dict[str, Any]]) -> list[Path]:
    """Freeze every victim pod's processes at once (`freeze_pod`), then cut their nodes off
    from the API server with their processes frozen (the pod runner's cut-off files); the
    files to remove when done (contact back: the runner ends what is left there)."""
    for victim in victims:
        freeze_pod(opts, victim)
    cuts = []
    for victim in victims:
        cut = opts.state / "runner" / "cut-off" / victim["spec"]["nodeName"]
        cut.parent.mkdir(parents=True, exist_ok=True)
        cut.write_text("freeze")
        cuts.append(cut)
    return cuts


def is_trainer(pid: int) -> bool:
    """A rank of the example trainer or its TorchFT twin (not torchrun, nor NVRx's
    ft_launcher or the rank monitor it forks, nor a supervisor, nor a warm standby still
    waiting for its generation, naming the script)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    launchers = (b"torchrun", b"torch.distributed.run", b"ft_launcher", b"supervise")
    launcher = any(word in cmdline for word in launchers)
    script = b"ddp_train.py" in cmdline or b"torchft_train.py" in cmdline
    return script and not launcher and not waiting_standby(pid, cmdline)


def waiting_standby(pid: int, cmdline: bytes) -> bool:
    """A `rtj_shim.agent.preload` standby reads its generation from a pipe on stdin; once handed
    over, its stdin is /dev/null (and it is the trainer). `cmdline`: its /proc cmdline."""
    if b"rtj_shim.agent.preload" not in cmdline:
        return False
    try:
        return os.readlink(f"/proc/{pid}/fd/0").startswith("pipe:")
    except OSError:
        return False


def in_place_job(name: str, save_every: int, steps: int, deadline: int = 120) -> dict[str, Any]:
    """The example job with restart in place (``inPlaceDeadlineSeconds``: `deadline`), a
    durable save every `save_every` steps, ending after `steps` (its model is compared with
    a no-fault run of as many steps)."""
    body = job(
        name, f"--save-every={save_every}",
        recovery={"inPlace": True, "inPlaceDeadlineSeconds": deadline},
    )  # fmt: skip
    container = body["spec"]["template"]["spec"]["containers"][0]
    container["command"] = [
        f"--steps={steps}" if a == "--steps=100000" else a for a in container["command"]
    ]
    return body


def rank_log(opts: story.Options, pod: dict[str, Any], rank: int) -> Path:
    """Rank `rank`'s log in `pod` (the example trainer's ``--log-dir`` volume)."""
    return story._pod_dir(opts, pod) / "volumes" / "train-logs" / f"rank-{rank}.jsonl"


def jobset(api: Any, name: str) -> dict[str, Any] | None:
    """The job's JobSet now (None: there is none)."""
    found = [js for js in api.list_jobsets(story.NAMESPACE)
             if js["metadata"]["labels"].get(keys.JOB_LABEL) == name]  # fmt: skip
    return found[0] if found else None


def pods(api: Any, name: str, attempt: int) -> list[dict[str, Any]]:
    selector = f"training.resilient.dev/job={name},training.resilient.dev/attempt={attempt}"
    pods: list[dict[str, Any]] = api.list_pods(story.NAMESPACE, selector)
    return pods


def scheduled(api: Any, name: str, count: int, attempt: int = 1) -> list[dict[str, Any]]:
    """The attempt's pods, once `count` of them are bound to nodes."""
    wait_for(f"{count} pods of {name} scheduled", lambda: (
        len(ps := pods(api, name, attempt)) == count
        and all(p["spec"].get("nodeName") for p in ps)
    ), 300, 0.5)  # fmt: skip
    return pods(api, name, attempt)


def trained(log: Path) -> int:
    """The newest step a rank's log shows (0 before it has one)."""
    return max(losses(log.read_text().splitlines()), default=0) if log.exists() else 0


def rank_pod(pods: list[dict[str, Any]], rank: int) -> dict[str, Any]:
    return next(p for p in pods if p["metadata"]["labels"][RANK_LABEL] == str(rank))


def status(api: Any, name: str) -> dict[str, Any]:
    return dict(api.get_rtj(story.NAMESPACE, name).get("status") or {})


@dataclass
class Platform:
    """The demo's platform, running (see `running_platform`)."""

    opts: story.Options
    kubeconfig: Path
    kube: Any
    api: Any
    lines: list[str]


@contextmanager
def running_platform(
    work: Path, name: str, nodes: int, *operator_args: str, timeout: float = 240
) -> Iterator[Platform]:
    """The local control plane, S3 server, pod runner (`nodes` nodes) and operator for one
    drill or benchmark, under `work`; stopped at the end, with everything it started (what
    is left running fails the caller: `LeftRunning`). The narration is in `.lines`. Its one
    operator has the operator's own lease defaults (`SINGLE_REPLICA_LEASE`): under the
    harness's fail-over lease a renewal late by 3 s on a loaded CI machine made the only
    replica step down mid-drill (the rank drill, stop 25; the GPU-fault drill before)."""
    opts = story.Options(
        out=work / "out", state=work / "state", cluster_name=f"{name}-{os.getpid()}",
        nodes=nodes, timeout=timeout,
    )  # fmt: skip
    (opts.state / "logs").mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    display = story.Display(lines.append)
    state: dict[str, Any] = {"pids": {}}
    try:
        kubeconfig, kube, api = story.start_platform(
            opts, display, state, operator_args=(*SINGLE_REPLICA_LEASE, *operator_args)
        )
        yield Platform(opts, kubeconfig, kube, api, lines)
    finally:
        left = story.down(opts, display)
        shutil.rmtree(LocalCluster(opts.cluster_name).dir, ignore_errors=True)
        sys.stdout.write("\n".join(lines) + "\n")
    if left:
        raise LeftRunning(f"down left {left}")


def controlling_platform(
    work: Path, name: str, nodes: int, *operator_args: str
) -> AbstractContextManager[Platform]:
    """`running_platform` with an operator that can order restarts in place (a control
    secret) and reads progress every second."""
    secret = work / "control-secret"
    secret.write_text(secrets.token_hex(32))
    return running_platform(
        work, name, nodes, "--progress-poll-seconds", "1", "--control-secret-file", str(secret),
        *operator_args,
    )  # fmt: skip


class LeftRunning(AssertionError):
    """A platform's processes survived its teardown."""


def losses(lines: list[str]) -> dict[int, float]:
    """Step -> loss from a rank's log lines (the example trainer's JSON lines; a step
    trained again after a restart: the last one wins)."""
    out: dict[int, float] = {}
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # the line a killed or frozen rank was writing
        if "loss" in record and "event" not in record:
            out[int(record["step"])] = float(record["loss"])
    return out


_NO_FAULT: dict[tuple[int, int, int, tuple[str, ...]], dict[int, dict[int, float]]] = {}


def no_fault_losses(
    work: Path, steps: int, save_every: int, ranks: int = 2, extra: tuple[str, ...] = ()
) -> dict[int, dict[int, float]]:
    """The same training without faults (torchrun --standalone, `ranks` ranks, the
    example's `extra` arguments): rank -> losses. The training is deterministic, so one run
    per (steps, save interval, ranks, extra) serves every drill of the session."""
    key = (steps, save_every, ranks, extra)
    if key not in _NO_FAULT:
        _NO_FAULT[key] = _run_no_fault(work, steps, save_every, ranks, extra)
    return {rank: dict(steps_) for rank, steps_ in _NO_FAULT[key].items()}


def _run_no_fault(
    work: Path, steps: int, save_every: int, ranks: int, extra: tuple[str, ...]
) -> dict[int, dict[int, float]]:
    logs = work / "clean-logs"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RTJ_", "AWS_"))}
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
         "examples/ddp_train.py", f"--root=file://{work / 'clean-ckpt'}", f"--log-dir={logs}",
         f"--steps={steps}", f"--save-every={save_every}", *extra],
        cwd=REPO, env=env, check=True, timeout=900, capture_output=True,
    )  # fmt: skip
    return {r: losses((logs / f"rank-{r}.jsonl").read_text().splitlines()) for r in range(ranks)}


def first_restart(api: Any, name: str) -> dict[str, Any] | None:
    """The attempt's first in-place restart once it has an outcome."""
    record = (status(api, name).get("attempts") or [{}])[0]
    entries = record.get("inPlaceRestarts") or []
    return entries[0] if entries and entries[0].get("outcome") else None


def first_restart_after(
    api: Any, name: str, since: float, what: str, timeout: float = 240
) -> dict[str, Any]:
    """Wait for the first in-place restart's outcome (`what` names the wait) and print how
    long it took from `since` (a ``time.monotonic()`` reading: the fault)."""
    entry = wait_for(what, lambda: first_restart(api, name), timeout, 0.2)
    took = time.monotonic() - since
    sys.stdout.write(f"\nfreeze -> every pod runs generation 1: {took:.1f} s ({entry})\n")
    return entry


def assert_ledger_sums(ledger: dict[str, Any]) -> list[tuple[LedgerPhase, float]]:
    """A completed recovery record (status.recoveries): its phases end in order and sum to
    its onset-to-first-step time (`policy.ledger`). Returns the phases."""
    record = RecoveryRecord.model_validate(ledger)
    assert record.complete, ledger
    phases = phase_seconds(record)
    ends = [getattr(record, PHASE_FIELDS[p]) for p, _ in phases]
    assert ends == sorted(ends), ledger
    wall = wall_seconds(record)
    assert wall is not None and abs(sum(s for _, s in phases) - wall) < 1e-6, (phases, wall)
    return phases


def first_step_time(log: Path, generation: int) -> float | None:
    """When a rank's trainer logged its first step in `generation` (its log's own clock)."""
    for line in log.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if "loss" in record and "event" not in record and record.get("generation") == generation:
            return float(record["time"])
    return None
