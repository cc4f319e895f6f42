"""A small Ray Train run with ``PublishingReporter``, driven by test_ray_integration.py:
one local Ray cluster (2 CPUs), then one ``TorchTrainer`` fit (2 workers, DDP over gloo on
CPU) per entry of the plan, in order.

    ray_worker.py PLAN_JSON

Each plan entry: ``root`` (the checkpoint root), ``out`` (a directory), ``storage`` (Ray's
run storage), ``kill_at`` (0: train to the end). A fit trains an MLP with dropout by AdamW
under an LR schedule, 16 steps, reporting a checkpoint every 4 (rank 0 writes the state
file), ``keep_last=2``; every step draws its batch and dropout masks from the step and
the rank (Ray saves no RNG state). With ``kill_at=N`` every worker writes its pid into
``out/at-kill-<rank>`` after step N and sleeps, for the test to SIGKILL the whole session.
At the end each worker writes ``out/rank-<r>.json`` (the step restored, the steps
skipped, each step's loss) and ``out/final-<r>.pt`` (its model's parameters).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

for key, value in {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_TRAIN_METRICS_ENABLED": "0",
    "RAY_DEDUP_LOGS": "0",
    "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    "RAY_AUTH_MODE": "disabled",
}.items():
    os.environ.setdefault(key, value)

import ray  # noqa: E402
import ray.train  # noqa: E402
import torch  # noqa: E402
from ray.train import FailureConfig, RunConfig, ScalingConfig  # noqa: E402
from ray.train.torch import TorchTrainer, prepare_model  # noqa: E402

TOTAL, SAVE_EVERY = 16, 4


def train(plan: dict[str, Any]) -> None:
    from rtj_shim.integrations.ray import PublishingReporter

    torch.set_num_threads(1)
    rank = ray.train.get_context().get_world_rank()
    out = Path(plan["out"])
    ckpts = PublishingReporter(plan["root"], keep_last=2)
    step, directory = ckpts.restore()
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1)
    )
    state = None
    if directory is not None:
        state = torch.load(directory / "state.pt", weights_only=True)
        net.load_state_dict(state["model"])
    model = prepare_model(net)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + 0.1 * s))
    if state is not None:
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
    losses: dict[int, float] = {}
    while step < TOTAL:
        step += 1
        torch.manual_seed(1000 * step + rank)  # this step's dropout masks
        g = torch.Generator().manual_seed(1000 * step + rank)  # this step's rows
        x = torch.randn(16, 8, generator=g)
        y = torch.sin(x.sum(dim=1, keepdim=True))
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses[step] = loss.item()
        if step % SAVE_EVERY == 0:
            with tempfile.TemporaryDirectory() as d:
                if rank == 0:
                    torch.save({"model": net.state_dict(), "optimizer": opt.state_dict(),
                                "scheduler": sched.state_dict()}, f"{d}/state.pt")  # fmt: skip
                ckpts.report({"loss": losses[step]}, step, d if rank == 0 else None)
        if step == plan["kill_at"]:
            (out / f"at-kill-{rank}").write_text(str(os.getpid()))
            time.sleep(600)
    resumed = ckpts.resumed
    report = {
        "restored": 0 if resumed is None else resumed.step,
        "skipped": [] if resumed is None else [list(s) for s in resumed.skipped],
        "losses": losses,
    }
    (out / f"rank-{rank}.json").write_text(json.dumps(report))
    torch.save(net.state_dict(), out / f"final-{rank}.pt")


def main(plans: list[dict[str, Any]]) -> int:
    scratch = tempfile.mkdtemp(prefix="rtjray-", dir="/tmp")  # Ray's socket paths are short
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=True,
             object_store_memory=80 << 20, _temp_dir=scratch)  # fmt: skip
    try:
        for plan in plans:
            Path(plan["out"]).mkdir(parents=True, exist_ok=True)
            trainer = TorchTrainer(
                train,
                train_loop_config=plan,
                scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
                run_config=RunConfig(
                    storage_path=plan["storage"], name="run",
                    failure_config=FailureConfig(max_failures=0),
                ),
            )  # fmt: skip
            result = trainer.fit()
            if result.error is not None:
                raise result.error
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
