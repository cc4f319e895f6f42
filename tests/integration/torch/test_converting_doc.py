"""docs/converting.md runs as written: each marked "after" block (plain PyTorch, DCP,
Lightning with the RNG mixin, the Hugging Face Trainer, Accelerate, DeepSpeed, Orbax;
Megatron's and Ray's are compiled only) runs
in a fresh process on a tiny CPU model with the checkpoint root in ``RTJ_CHECKPOINT_URI`` (as the
operator sets it), then runs again, longer, and resumes from the step the first run
published, saying so in one line on stderr. The "before" blocks are checked to be Python
too.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from rtj_shim.checkpoint.resolver import describe_steps
from rtj_shim.checkpoint.storage import open_store
from rtj_shim.checkpoint.verification import Depth

WORKER = Path(__file__).with_name("converting_doc_worker.py")
NAMES = {"plain", "dcp", "lightning", "lightning-rng", "hf", "accelerate", "deepspeed", "orbax",
         "megatron", "ray"}  # fmt: skip
"""Every marked block; all but Megatron's and Ray's also run (EXAMPLES): Megatron's save needs
two torch.cuda calls replaced on CPU, a Ray cluster starts in tens of seconds, and their
integration tests make the same calls."""


def load_worker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("converting_doc_worker", WORKER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def before_code(body: str) -> str:
    """What a diff had before: its context and ``-`` lines."""
    return "\n".join(line[1:] for line in body.splitlines() if not line.startswith("+")) + "\n"


def test_every_example_is_marked_and_compiles_before_and_after() -> None:
    worker = load_worker()
    found = worker.blocks(worker.DOC.read_text())
    assert set(found) == NAMES
    for name, (lang, body) in found.items():
        after = worker.after_code(lang, body)
        compile(after, f"{name} (after)", "exec")
        assert "ckpt_uri" not in after, name  # the root is RTJ_CHECKPOINT_URI, not a guess
        if lang == "diff":
            compile(before_code(body), f"{name} (before)", "exec")
    assert worker.NCCL in found["plain"][1]  # the one substitution the worker makes on CPU


@dataclass(frozen=True)
class Example:
    totals: tuple[int, int]  # total_steps (max_epochs for Lightning) of run 1, run 2
    saved: list[int]  # published after run 1; the newest is the resumed step
    after: list[int]  # published after run 2
    fresh_line: str  # printed by run 1
    resume_line: str  # printed by run 2; {root} and {step:012d} filled in


TORCH_FRESH = "rtj_shim.torch: no verified checkpoint under {root}: starting fresh at step 0"
TORCH_RESUME = "rtj_shim.torch: restored step {step} from {root}/steps/step-{step:012d} "
INTEGRATION_RESUME = "rtj_shim: resuming step {step} from {root}/steps/step-{step:012d} "
RESUME_LINES = ("rtj_shim.torch: restored", "rtj_shim: resuming")
EXAMPLES = {
    "plain": Example((1000, 1008), [1000], [1000], TORCH_FRESH, TORCH_RESUME),
    "dcp": Example((500, 504), [500], [500], TORCH_FRESH, TORCH_RESUME),
    "lightning": Example((2, 3), [2, 4], [2, 4, 6], "", INTEGRATION_RESUME),  # 2 steps/epoch
    "hf": Example((8, 12), [8], [8, 12], "", INTEGRATION_RESUME),  # a final save at the end
    "accelerate": Example((8, 12), [8], [8, 12], "", INTEGRATION_RESUME),  # a final save too
    "deepspeed": Example((8, 12), [8], [8, 12], "", INTEGRATION_RESUME),  # a final save too
    "orbax": Example((8, 12), [8], [8, 12], "", INTEGRATION_RESUME),  # a final save too
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def environment(name: str, root: str, tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RTJ_", "TORCHELASTIC_"))}
    env.update(
        RTJ_CHECKPOINT_URI=root,
        RTJ_RESUME_FILE=str(tmp / "absent-resume.json"),
        CUDA_VISIBLE_DEVICES="",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PYTHONWARNINGS="ignore",
    )
    if name in ("plain", "deepspeed"):  # torchrun's variables, one process
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0",
                   WORLD_SIZE="1", LOCAL_RANK="0")  # fmt: skip
    return env


def run(name: str, total: int, root: str, tmp: Path) -> tuple[dict[str, object], str]:
    result = tmp / f"result-{total}.json"
    proc = subprocess.run(
        [sys.executable, str(WORKER), name, str(total), str(result)],
        cwd=tmp,
        env=environment(name, root, tmp),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    loaded = json.loads(result.read_text())
    assert isinstance(loaded, dict)
    return loaded, proc.stderr


def published(root: str) -> list[int]:
    listing = describe_steps(open_store(root), Depth.DEEP)
    steps = [s.entry.name.step for s in listing if s.state.verified]
    return sorted(steps)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_the_after_block_runs_and_resumes_from_the_step_it_saved(name: str, tmp_path: Path) -> None:
    example = EXAMPLES[name]
    root = f"file://{tmp_path}/ckpt"
    first, err = run(name, example.totals[0], root, tmp_path)
    assert first["final"] == example.totals[0] * (2 if name == "lightning" else 1)
    assert first.get("restored", 0) == 0
    assert example.fresh_line.format(root=root) in err
    assert not [x for x in err.splitlines() if x.startswith(RESUME_LINES)]  # a fresh start
    assert published(root) == example.saved

    step = example.saved[-1]
    second, err = run(name, example.totals[1], root, tmp_path)
    line = example.resume_line.format(root=root, step=step)
    assert line in err, err[-4000:]
    assert len([x for x in err.splitlines() if x.startswith(line)]) == 1  # one line
    assert second.get("restored", step) == step
    assert second["final"] == example.totals[1] * (2 if name == "lightning" else 1)
    assert published(root) == example.after
    if name == "lightning":  # the doc's RngState mixin restored this process's RNGs
        assert (first["rng_restored"], second["rng_restored"]) == ([], [True])
