"""Real torch: a Checkpointer whose pod sets RTJ_MAX_WRITE_BYTES_PER_SECOND paces its
durable save (the bucket holds the writers for the bytes over one second's worth) and the
published step restores bit for bit; without the variable nothing is paced."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from rtj_shim.checkpoint.storage.throttle import ThrottledStore
from rtj_shim.torch import Checkpointer

MiB = 1 << 20


def test_a_paced_save_publishes_the_same_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RTJ_MAX_WRITE_BYTES_PER_SECOND", str(4 * MiB))
    torch.manual_seed(0)
    model = nn.Linear(1024, 1536)  # 6 MiB of float32 weights
    ckpt = Checkpointer(f"file://{tmp_path}/root")
    assert isinstance(ckpt.store, ThrottledStore)
    ckpt.save(1, {"model": model})
    # ~6 MiB at 4 MiB/s with 4 MiB of credit: about half a second held
    assert ckpt.store.bucket.waited > 0.3, ckpt.store.bucket.waited
    fresh = nn.Linear(1024, 1536)
    assert Checkpointer(f"file://{tmp_path}/root").restore({"model": fresh}) == 1
    assert torch.equal(fresh.weight, model.weight) and torch.equal(fresh.bias, model.bias)
    ckpt.close()


def test_without_a_limit_nothing_is_paced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RTJ_MAX_WRITE_BYTES_PER_SECOND", raising=False)
    ckpt = Checkpointer(f"file://{tmp_path}/root")
    assert not isinstance(ckpt.store, ThrottledStore)
    monkeypatch.setenv("RTJ_MAX_WRITE_BYTES_PER_SECOND", "lots")
    with pytest.raises(ValueError, match="RTJ_MAX_WRITE_BYTES_PER_SECOND='lots'"):
        Checkpointer(f"file://{tmp_path}/root")
    ckpt.close()
