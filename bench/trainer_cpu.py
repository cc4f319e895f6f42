"""What the shim costs a trainer's CPU, feature by feature (issue 48's no-tax lead: in the
fault-free soak the operator's trainers burned 49% more CPU than the JobSet baseline's for
the same steps, `bench/results/no-tax.md`).

The example trainer (examples/ddp_train.py, 2 ranks under torchrun --standalone, gloo on
CPU, the soak's model and step sleep) runs the same steps in each configuration, one after
the other, twice each in ABBA order; what is measured is the CPU seconds of the whole
process tree (torchrun and both ranks, their threads included: `RUSAGE_CHILDREN`), per
step, and the wall time:

- ``plain``: `--plain-checkpoints` (torch.save), the JobSet baseline's trainer;
- ``checkpointer``: the shim's Checkpointer to a file:// root, nothing from the operator;
- ``+progress``: and ``RTJ_PROGRESS_DIR`` (the progress record, its pulse thread, the
  milestones and save costs);
- ``+fast``: and the fast tier every 50 steps (``RTJ_FAST_TIER_DIR``), as the soak's
  operator run has it.

The durable interval is the run's last step in every configuration (the soak's drain does
the durable saves beside the trainers), so what differs is only the per-step machinery.
CPU seconds are counted by the kernel, so the figure is robust to other load; wall time is
not (the report gives the load average).

    python -m bench.trainer_cpu [--steps 1500] [--json FILE] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import loadavg_text, med

REPO = Path(__file__).resolve().parent.parent
RANKS = 2
CONFIGS = ("plain", "checkpointer", "+progress", "+fast")
FAST_EVERY = 50


def _command(config: str, work: Path, steps: int) -> list[str]:
    store = (
        [f"--plain-checkpoints={work / 'plain'}"]
        if config == "plain"
        else [f"--root=file://{work / 'ckpt'}"]
    )
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={RANKS}", str(REPO / "examples" / "ddp_train.py"), *store,
        f"--log-dir={work / 'logs'}", f"--steps={steps}", f"--save-every={steps}",
        "--step-sleep=0.05",
    ]  # fmt: skip


def _env(config: str, work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RTJ_")}
    env["RTJ_RESUME_FILE"] = str(work / "absent-resume.json")
    env["OMP_NUM_THREADS"] = "1"
    if config in ("+progress", "+fast"):
        env["RTJ_PROGRESS_DIR"] = str(work / "progress")
    if config == "+fast":
        env["RTJ_FAST_TIER_DIR"] = str(work / "fast")
        env["RTJ_FAST_EVERY_STEPS"] = str(FAST_EVERY)
        env["RTJ_FAST_KEEP"] = "2"
    return env


def run_once(config: str, steps: int) -> dict[str, float]:
    """One run of `config`: CPU seconds of its process tree and wall seconds."""
    work = Path(tempfile.mkdtemp(prefix=f"rtj-trainer-cpu-{config.strip('+')}-"))
    try:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        subprocess.run(
            _command(config, work, steps), env=_env(config, work), cwd=REPO, check=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        wall = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    user = after.ru_utime - before.ru_utime
    system = after.ru_stime - before.ru_stime
    return {"cpu_s": user + system, "user_s": user, "system_s": system, "wall_s": wall}


def measure(steps: int, repeats: int) -> dict[str, Any]:
    order = [*CONFIGS, *reversed(CONFIGS)] * repeats  # ABBA: drift hits every config alike
    runs: dict[str, list[dict[str, float]]] = {c: [] for c in CONFIGS}
    for config in order:
        runs[config].append(run_once(config, steps))
        sys.stderr.write(f"{config}: {runs[config][-1]}\n")
    summary = {}
    for config, got in runs.items():
        cpu = med([r["cpu_s"] for r in got])
        summary[config] = {
            "cpu_s": cpu,
            "cpu_ms_per_rank_step": 1000 * cpu / (RANKS * steps),
            "wall_s": med([r["wall_s"] for r in got]),
            "runs": got,
        }
    base = summary["plain"]["cpu_s"]
    for config in CONFIGS:
        summary[config]["cpu_ratio_to_plain"] = summary[config]["cpu_s"] / base
    return {"steps": steps, "ranks": RANKS, "fast_every": FAST_EVERY, "load": loadavg_text(),
            "configs": summary}  # fmt: skip


def markdown(result: dict[str, Any]) -> str:
    rows = [
        f"Trainer CPU by feature: examples/ddp_train.py, {result['ranks']} ranks, "
        f"{result['steps']} steps, medians of ABBA runs (load {result['load']}).",
        "",
        "| configuration | CPU s (tree) | its runs | CPU ms per rank-step | / plain | wall s |",
        "|---|---|---|---|---|---|",
    ]
    for config, row in result["configs"].items():
        runs = " / ".join(f"{r['cpu_s']:.1f}" for r in row.get("runs", ()))
        rows.append(
            f"| {config} | {row['cpu_s']:.1f} | {runs} | {row['cpu_ms_per_rank_step']:.2f} | "
            f"{row['cpu_ratio_to_plain']:.3f} | {row['wall_s']:.1f} |"
        )
    rows += ["", "The spread of one configuration's runs (drift over the ABBA order) is the noise "
             "floor: a difference inside it is none."]  # fmt: skip
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--repeats", type=int, default=1, help="ABBA rounds")
    p.add_argument("--json", type=Path)
    p.add_argument("--markdown", type=Path)
    args = p.parse_args(argv)
    result = measure(args.steps, args.repeats)
    text = markdown(result)
    sys.stdout.write(text)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if args.markdown is not None:
        args.markdown.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
