"""Silent data corruption with real PyTorch (DDP on gloo, 3 ranks by torchrun): a bit
flipped in one rank's parameters, a loss far outside its recent values on one rank, and a
gradient scaled on one rank before DDP's all-reduce, are each caught at the next save,
which publishes nothing and names the rank on every rank; the clean run publishes both
steps. Each run is compared with the clean one, side by side."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rtj_shim.fast import fast_tier
from rtj_shim.wire.suspect_verdict import SUFFIX, SuspectKind, SuspectVerdict

WORKER = Path(__file__).with_name("sdc_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(root: Path, mode: str) -> dict[str, Any]:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3",
        "--master-addr", "127.0.0.1", "--master-port", str(_free_port()),
        str(WORKER), str(root), mode, str(_fast_dir(root)),
    ]  # fmt: skip
    env = {**os.environ, "RTJ_RESUME_FILE": str(_resume_file(root)), "NODE_RANK": "5"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _fast_dir(root: Path) -> Path:
    return root.with_name(f"{root.name}-fast")


def _resume_file(root: Path) -> Path:
    return root.with_name(f"{root.name}-resume.json")


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _run(tmp_path_factory.mktemp("clean"), "clean")


@pytest.mark.parametrize(
    ("mode", "named", "kind", "rank"),
    [
        ("flip", "'model' on rank 2", "diverged", 2),  # the exact checksum: one bit flipped
        ("spike", "rank 1: loss", "anomaly", 1),  # the anomaly guard on the rank that saw it
        # every rank's norm after the all-reduce is off; rank 1's own, before it, first
        ("scaled", "rank 1: local_grad_norm", "anomaly", 1),
        # the same with a fast tier every 2 steps: its save of step 8 is refused first
        ("scaled-fast", "rank 1: local_grad_norm", "anomaly", 1),
        ("between", "'model' on rank 2", "diverged", 2),  # integrity_every_steps: no save
    ],
)
def test_a_suspect_state_is_never_published_and_every_rank_names_the_culprit(
    tmp_path: Path, mode: str, named: str, kind: str, rank: int, clean_run: dict[str, Any]
) -> None:
    assert clean_run == {"published": [4, 8], "errors": [None, None, None]}
    faulty = _run(tmp_path / mode, mode)
    assert faulty["published"] == [4], "the state before the symptom stays the newest"
    errors = faulty["errors"]
    assert len(set(errors)) == 1, "every rank raises the same verdict"
    verdict = {
        "between": "step 6 failed its integrity check",
        "scaled-fast": "step 8 not kept in the fast tier",
    }.get(mode, "step 8 not published")
    assert errors[0].startswith(f"SuspectState: {verdict}"), errors[0]
    assert named in errors[0], errors[0]
    # the verdict, typed, in the message (a termination message carries it) and beside the
    # resume file (an in-place restart's supervisor reports it): the rank and its pod
    # (NODE_RANK, as the operator numbers the pods)
    step = 6 if mode == "between" else 8
    want = SuspectVerdict(step, SuspectKind(kind), (rank,), (5,))
    assert SuspectVerdict.find(errors[0]) == want, errors[0]
    written = _resume_file(tmp_path / mode).with_name(f"{mode}-resume.json{SUFFIX}")
    assert SuspectVerdict.parse(written.read_text()) == want
    if mode == "scaled-fast":  # fast steps before the symptom kept, 8 never (a fast save
        # while the previous one still writes is skipped: which of 2, 4, 6 is load's choice)
        held = fast_tier.holdings(_fast_dir(tmp_path / mode))
        assert held and set(held) <= {2, 4, 6}, held


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_every_single_bit_flip_changes_the_checksum(dtype: str) -> None:
    import torch
    from torch import nn

    from rtj_shim.torch import replica_check
    from rtj_shim.torch.state import classify

    model = nn.Linear(64, 64).to(getattr(torch, dtype))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 64, dtype=model.weight.dtype)).sum().backward()
    opt.step()
    entries = classify({"model": model, "opt": opt})
    clean = replica_check.checksums(entries)
    assert set(clean) == {"model", "opt"} and clean == replica_check.checksums(entries)
    width = model.weight.element_size() * 8
    as_int = {16: torch.int16, 32: torch.int32, 64: torch.int64}[width]
    for target, name in ((model.weight, "model"), (opt.state[model.weight]["exp_avg"], "opt")):
        bits = target.detach().view(-1).view(as_int)
        for bit in range(width):
            flip = torch.tensor(1, dtype=as_int) << bit
            with torch.no_grad():
                bits[17] ^= flip
            assert replica_check.checksums(entries)[name] != clean[name], (name, bit)
            with torch.no_grad():
                bits[17] ^= flip
        assert replica_check.checksums(entries) == clean


def test_a_bad_check_interval_names_the_argument() -> None:
    from rtj_shim.torch.integrity_watch import IntegrityWatch

    for bad in (0, -3, True):
        with pytest.raises(ValueError, match=r"Checkpointer\(integrity_every_steps="):
            IntegrityWatch(None, bad)
