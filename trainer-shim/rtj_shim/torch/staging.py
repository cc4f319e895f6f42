"""Staging: the copies a save writes from while training goes on.

A background save must not write tensors the training thread is changing. Before
``save()`` returns, :meth:`Staging.stage_unfenced` copies into reused CPU buffers every
tensor this rank writes that does not belong to an optimizer, and clones the small
rank-local state. Tensors an optimizer owns (parameters, moments) change only in
``optimizer.step()``: the background thread stages them (:meth:`Staging.stage_fenced`)
while the next forward and backward run, and an optimizer pre-step hook (the *fence*)
holds the next ``step()`` until that is done. Sharded state is staged by DCP onto local
disk (:meth:`Staging.stage_sharded`), for blocking and background saves alike.

A fast save does less on the training thread (:meth:`Staging.freeze`): it reads every
object's state there, copies only what the next forward and backward may change (module
tensors no optimizer owns, plain values, the rank's own state), and leaves the walk, the
plan and every other copy to its writer thread, which the fence holds the next
``optimizer.step()`` for.

Host memory is bounded by one staging copy of this rank's share: buffers are reused from
one save to the next and dropped when a tensor is no longer written by this rank.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch

from rtj_shim.torch import _dist, fsdp
from rtj_shim.torch import serialization as ser
from rtj_shim.torch.capture import Reading, SaveJob, clone_tensors
from rtj_shim.torch.plain import PLAIN_LEAVES
from rtj_shim.torch.state import COMMON, Entry, optimizer_param_ptrs
from rtj_shim.torch.validation import nonfinite_problem

K = TypeVar("K")


class Staged(Protocol):
    """What a fence waits on: a save whose optimizer-owned tensors may not be copied yet."""

    staged: threading.Event
    stall: float  # the fence's waits add to it


class Staging:
    """Reused CPU buffers, the optimizer fences, and local DCP staging of one Checkpointer."""

    def __init__(self, staging_dir: str | os.PathLike[str] | None, *, check_finite: bool) -> None:
        self.staging_dir = staging_dir
        self.check_finite = check_finite
        # The background save whose fenced tensors may not be staged yet (read by fences).
        self.inflight: Staged | None = None
        self._buffers: dict[int, torch.Tensor] = {}
        self._volatile: dict[tuple[str, str], torch.Tensor] = {}  # freeze()'s module tensors
        self._hooked: dict[int, Any] = {}

    def _buffer(self, index: int, tensor: torch.Tensor) -> torch.Tensor:
        return _reused(self._buffers, index, tensor)

    def stage_unfenced(self, job: SaveJob, *, rank_state: bool = True) -> None:
        """Copy what the training thread may change before the next optimizer step (and,
        with ``rank_state``, clone the rank's own state: freeze() did for a fast save)."""
        wanted = {i for s in job.mine for i in job.shards[s]}
        keep = set(wanted)
        for i in sorted(wanted - job.fenced):
            job.tensors[i] = self._buffer(i, job.tensors[i]).copy_(job.tensors[i])
        for stale in set(self._buffers) - keep:
            del self._buffers[stale]
        if rank_state:
            job.rank_state = clone_tensors(job.rank_state)

    def freeze(self, reading: Reading, entries: list[Entry], allow_unsafe: bool) -> None:
        """Training thread, for a save planned on another thread while training goes on:
        copy in ``reading`` what may change before the next ``optimizer.step()`` (the fence
        holds that one until the writer has copied the rest). A module's tensors no
        optimizer owns (buffers: running statistics move in the forward) go into reused
        buffers; every replicated object but modules and optimizers (schedulers, samplers,
        plain values, Stateful objects) is encoded with its tensors cloned (small; a plain
        value may be mutated in place), as the rank's own state was when it was read. An
        optimizer's state (its ``state_dict()`` copied the param groups; its tensors and
        per-parameter dicts change only in ``step()``) is left to the writer behind the
        fence."""
        owned = optimizer_param_ptrs(entries, state=False)  # a module holds no optimizer state
        copies: dict[tuple[Any, ...], torch.Tensor] = {}  # tied tensors stay one tensor
        used: set[tuple[str, str]] = set()
        for entry in entries:
            if entry.placement != COMMON or entry.kind == "optimizer":
                continue
            state = reading.common[entry.name]
            if entry.kind != "module" or not isinstance(state, dict):
                reading.common[entry.name] = ser.encode(state, entry.name, allow_unsafe, clone=True)
                continue
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    if value.data_ptr() not in owned:
                        view = ser.view_key(value)
                        copy = copies.get(view) if view is not None else None
                        if copy is None:
                            copy = self._volatile_copy((entry.name, key), value.detach())
                            used.add((entry.name, key))
                            if view is not None:
                                copies[view] = copy
                        state[key] = copy
                elif type(value) not in PLAIN_LEAVES:  # a module's extra state
                    state[key] = ser.encode(value, f"{entry.name}.{key}", allow_unsafe, clone=True)
        for stale in set(self._volatile) - used:
            del self._volatile[stale]

    def _volatile_copy(self, key: tuple[str, str], tensor: torch.Tensor) -> torch.Tensor:
        return _reused(self._volatile, key, tensor).copy_(tensor)

    def stage_fenced(self, job: SaveJob) -> None:
        """Background thread: copy the optimizer-owned tensors (the fence holds step())."""
        for i in sorted(job.fenced):
            job.tensors[i] = self._buffer(i, job.tensors[i]).copy_(job.tensors[i])

    def install_fences(self, entries: list[Entry]) -> None:
        fence = _make_fence(weakref.ref(self))
        for entry in entries:
            if entry.kind == "optimizer" and id(entry.obj) not in self._hooked:
                self._hooked[id(entry.obj)] = entry.obj.register_step_pre_hook(fence)

    def remove_fences(self) -> None:
        for handle in self._hooked.values():
            handle.remove()
        self._hooked.clear()

    def stage_sharded(self, job: SaveJob, coord: _dist.Coordinator) -> None:
        """Collective, on the calling thread: DCP writes this rank's shards to local disk
        (the staging copy of sharded state, for blocking and background saves alike)."""
        if self.check_finite and job.problem is None:
            job.problem = nonfinite_problem(
                (f"{key}.{k}", v)
                for key, value in job.sharded.items()
                if key.startswith("model.")
                for k, v in value.items()
                if isinstance(v, torch.Tensor)
            )
        job.stage_dir = Path(tempfile.mkdtemp(prefix=f"rtj-dcp-{job.step}-", dir=self.staging_dir))
        try:
            files = fsdp.save_local(job.sharded, job.stage_dir, coord.group)
        except BaseException:
            shutil.rmtree(job.stage_dir, ignore_errors=True)
            raise
        # .metadata first: on rank 0 the committing writer then owns the dcp/ directory
        job.sharded_files = sorted(files, key=lambda f: (not f[0].endswith(".metadata"), f[0]))
        job.sharded = {}


def _reused(buffers: dict[K, torch.Tensor], key: K, tensor: torch.Tensor) -> torch.Tensor:
    """The CPU buffer kept under ``key`` for a tensor of this shape and dtype (a new one
    when it has none or the tensor changed)."""
    buf = buffers.get(key)
    if buf is None or buf.shape != tensor.shape or buf.dtype != tensor.dtype:
        buf = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu")
        buffers[key] = buf
    return buf


def mark_staged(job: Staged) -> None:
    """Background thread: the fenced tensors are copied (or failed to be); release the
    fence and hand the GIL to the training thread it may be holding at once. Otherwise this
    thread keeps the GIL, serializing, until the interpreter's switch interval (5 ms) makes
    it let go: up to that much stall in the next ``optimizer.step()``."""
    job.staged.set()
    time.sleep(0)


def _make_fence(ref: weakref.ReferenceType[Staging]) -> Any:
    """Optimizer pre-step hook: wait until a background save has staged the parameters."""

    def fence(_opt: Any, _args: Any, _kwargs: Any) -> None:
        staging = ref()
        job = None if staging is None else staging.inflight
        if job is not None and not job.staged.is_set():
            t0 = time.perf_counter()
            job.staged.wait()
            job.stall += time.perf_counter() - t0

    return fence
