"""Checks that a restored state is the state that was saved, beyond matching checksums.

* A *probe* is a user function returning a loss for a fixed batch. At save time it runs
  once (modules in eval mode, every RNG untouched, gradients put back) and its loss and
  gradient norm go into the manifest; after restore it runs again and both must agree
  within a tolerance.
* Optimizer *moments*: the global norm of every floating state tensor (``exp_avg``,
  ``exp_avg_sq``, ...) per optimizer, recorded at save time and compared after restore.
* The non-finite guard: a loss or parameter that is NaN or Inf refuses the save.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn

from rtj_shim.torch import rng
from rtj_shim.torch._dist import Coordinator
from rtj_shim.torch.state import Entry

Probe = Callable[[], torch.Tensor]


class RestoreValidationError(RuntimeError):
    """The restored state does not reproduce what was recorded at save time."""


def _local(t: torch.Tensor) -> torch.Tensor:
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t  # DTensor -> this rank's shard


def nonfinite_problem(tensors: Iterable[tuple[str, torch.Tensor]]) -> str | None:
    """First floating tensor with a NaN or Inf, as a message; None when all are finite."""
    for name, tensor in tensors:
        t = _local(tensor)
        if not t.is_floating_point() or t.numel() == 0:
            continue
        # One reduction first (cheap, no allocation); exact check only when it is not finite
        # (or the sum overflowed). CPU tensors go through NumPy: a single-threaded SIMD sum
        # that leaves torch's OpenMP pool (and its spin-waiting) out of a save's hashing.
        if math.isfinite(_fast_sum(t.detach())):
            continue
        bad = int((~torch.isfinite(t.detach())).sum())
        if bad:
            return f"{name} has {bad} non-finite value(s) (NaN/Inf)"
    return None


def _fast_sum(t: torch.Tensor) -> float:
    if t.device.type == "cpu" and t.dtype in (torch.float16, torch.float32, torch.float64):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # overflow -> inf, checked exactly
            return float(t.contiguous().numpy().sum())
    return float(t.sum())


def loss_problem(loss: float | torch.Tensor | None) -> str | None:
    if loss is None:
        return None
    value = float(loss.detach()) if isinstance(loss, torch.Tensor) else float(loss)
    return None if math.isfinite(value) else f"loss is {value}"


@contextlib.contextmanager
def _probe_context(modules: list[nn.Module]) -> Iterator[list[nn.Parameter]]:
    params = [p for m in modules for p in m.parameters() if p.requires_grad]
    grads = [p.grad for p in params]
    modes = [(m, m.training) for mod in modules for m in mod.modules()]
    for p in params:
        p.grad = None
    for mod in modules:
        mod.eval()
    try:
        with rng.isolated():
            yield params
    finally:
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        for m, training in modes:
            m.training = training


def run_probe(
    probe: Probe, entries: list[Entry], coord: Coordinator, sharded: bool
) -> dict[str, float]:
    """Loss (mean over ranks) and global gradient norm of one forward/backward."""
    modules = [e.obj for e in entries if e.kind == "module"]
    with _probe_context(modules) as params:
        loss = probe()
        torch.autograd.backward(loss)
        value = float(loss.detach())
        sq = sum(
            float(_local(p.grad).detach().double().pow(2).sum())
            for p in params
            if p.grad is not None
        )
    rows = coord.all_gather((value, sq))
    loss_mean = sum(r[0] for r in rows) / len(rows)
    grad_sq = sum(r[1] for r in rows) if sharded else rows[0][1]
    return {"loss": loss_mean, "grad_norm": math.sqrt(grad_sq)}


def optimizer_moments(
    entries: list[Entry], coord: Coordinator, sharded: bool
) -> dict[str, dict[str, float]]:
    """Per optimizer and state key, the global L2 norm over all parameters."""
    local: dict[str, dict[str, float]] = {}
    for entry in entries:
        if entry.kind != "optimizer":
            continue
        sums: dict[str, float] = {}
        for state in entry.obj.state.values():
            for key, value in state.items():
                if (
                    isinstance(value, torch.Tensor)
                    and value.is_floating_point()
                    and value.dim() > 0
                ):
                    t = _local(value).detach()
                    sums[key] = sums.get(key, 0.0) + float(t.double().pow(2).sum())
        local[entry.name] = sums
    if sharded:
        gathered = coord.all_gather(local)
        total: dict[str, dict[str, float]] = {}
        for row in gathered:
            for opt, sums in row.items():
                for key, val in sums.items():
                    total.setdefault(opt, {})
                    total[opt][key] = total[opt].get(key, 0.0) + val
        local = total
    return {opt: {k: math.sqrt(v) for k, v in sums.items()} for opt, sums in local.items()}


def compare(
    recorded: dict[str, Any], observed: dict[str, Any], rtol: float, atol: float
) -> list[str]:
    """Differences beyond tolerance, as human-readable lines (empty: all agree)."""
    problems: list[str] = []

    def close(a: float, b: float) -> bool:
        return abs(a - b) <= atol + rtol * abs(a)

    for key in ("loss", "grad_norm"):
        if key in recorded and key in observed and not close(recorded[key], observed[key]):
            problems.append(
                f"probe {key}: {observed[key]!r} after restore, {recorded[key]!r} at save time"
            )
    rec_m: dict[str, dict[str, float]] = recorded.get("moments", {})
    obs_m: dict[str, dict[str, float]] = observed.get("moments", {})
    for opt, sums in rec_m.items():
        for key, value in sums.items():
            got = obs_m.get(opt, {}).get(key)
            if got is None:
                problems.append(f"optimizer {opt!r}: state {key!r} is missing after restore")
            elif not close(value, got):
                problems.append(
                    f"optimizer {opt!r}: norm of {key!r} is {got!r} after restore, "
                    f"{value!r} at save time"
                )
    return problems
