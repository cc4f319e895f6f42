"""Turning state into files and back: flatten, shard, stream into the store, load safely.

* ``flatten`` replaces every tensor of a nested state (dicts, lists, tuples) by a reference
  ``{"__rtj_tensor__": i}``, NumPy arrays and scalars by a marker holding a byte tensor
  (:mod:`rtj_shim.torch.plain`), and checks that every other leaf is a plain value, so the
  skeleton and the shards load with ``torch.load(weights_only=True)``. A leaf that would
  need arbitrary unpickling is refused at *save* time, not discovered at resume time.
  Tensors that view the same data (tied weights: one parameter under two names) get one
  reference, so they are staged, written and loaded once, and share storage again.
* ``plan_shards`` splits the tensors into a few similarly sized shards, so several ranks
  (replicated state) or threads write and hash them in parallel.
* ``stream_to_store`` runs ``torch.save`` straight into ``StepWriter.write_file``: the
  bytes go from torch's writer to the store through a one-slot rendezvous (zero copies for
  tensor data, no second buffer of the whole state). The zip records carry no CRC32
  (:func:`save_without_crc32`): the store's SHA-256 covers every byte and ``torch.load``
  never checks a CRC, so computing one was 0.17 CPU-s per GiB for nothing.
* ``load`` is ``torch.load(weights_only=True)`` unless the caller opted into unsafe
  unpickling (which warns).
"""

from __future__ import annotations

import contextlib
import io
import pickle
import queue
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any, cast

import numpy as np
import torch

from rtj_shim.checkpoint.manifest import FileEntry
from rtj_shim.checkpoint.storage.base import StepWriter
from rtj_shim.torch.plain import (
    PLAIN_LEAVES,
    all_plain_leaves,
    decode_array,
    encode_array,
    is_array_marker,
)
from rtj_shim.torch.plain import UnsafeStateError as UnsafeStateError  # re-exported

TENSOR_REF = "__rtj_tensor__"
_COALESCE_BELOW = 1 << 20
_COALESCE_TARGET = 8 << 20
_STALL_POLL_S = 0.5


class _WriterStopped(OSError):
    """The store writer stopped reading; its own error is the one to report."""


# --------------------------------------------------------------------- flatten / unflatten


def view_key(tensor: torch.Tensor) -> tuple[Any, ...] | None:
    """What a tensor views: tensors with one key hold the same values in the same memory.
    None where that cannot be told (no dense storage, or no elements)."""
    if tensor.layout != torch.strided or tensor.numel() == 0:
        return None
    try:  # the first element's address: the storage's plus the offset (no storage object)
        address = tensor.data_ptr()
    except (RuntimeError, NotImplementedError):  # tensors without a storage of their own
        return None
    if address == 0:
        return None
    return (tensor.device, tensor.dtype, address, tuple(tensor.shape), tensor.stride())


def flatten(
    state: Any,
    tensors: list[torch.Tensor],
    where: str,
    allow_unsafe: bool,
    seen: dict[tuple[Any, ...], int] | None = None,
) -> Any:
    """Skeleton of ``state`` with tensors moved to ``tensors`` (appended in walk order).

    A tensor viewing the same data as one already in ``tensors`` reuses its reference;
    ``seen`` (view key -> index) carries that across calls that share ``tensors``.
    """
    seen = {} if seen is None else seen

    def reference(tensor: torch.Tensor) -> Any:
        key = view_key(tensor)
        if key is not None and key in seen:
            return {TENSOR_REF: seen[key]}
        tensors.append(tensor)
        if key is not None:
            seen[key] = len(tensors) - 1
        return {TENSOR_REF: len(tensors) - 1}

    return _walk(state, where, allow_unsafe, reference)


def encode(state: Any, where: str, allow_unsafe: bool, *, clone: bool = False) -> Any:
    """``state`` as ``torch.load(weights_only=True)`` loads it, tensors left in place (or
    ``clone``d: a copy the owner's later changes do not reach, in the same one walk);
    :func:`unflatten` with no tensors turns it back (rank-local state is saved this way)."""
    return _walk(state, where, allow_unsafe, _cloned if clone else _same)


def _same(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _cloned(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.clone()


def _walk(
    state: Any, where: str, allow_unsafe: bool, on_tensor: Callable[[torch.Tensor], Any]
) -> Any:
    """The walk behind `flatten` and `encode`. On the training thread of every save: plain
    leaves (most of an optimizer's state) return first and are not descended into, and a
    container's path for error messages is formatted only for what is walked further."""
    if type(state) in PLAIN_LEAVES:
        return state
    if isinstance(state, torch.Tensor):
        return on_tensor(state.detach() if state.requires_grad else state)
    if isinstance(state, np.ndarray | np.generic):
        return _walk(encode_array(state, where), where, allow_unsafe, on_tensor)
    if type(state) in _DICTS or isinstance(state, Mapping):
        items = [
            (k, v if type(v) in PLAIN_LEAVES else _walk(v, f"{where}.{k}", allow_unsafe, on_tensor))
            for k, v in state.items()
        ]  # fmt: skip
        out: dict[Any, Any] = OrderedDict(items) if isinstance(state, OrderedDict) else dict(items)
        metadata = getattr(state, "_metadata", None)
        if metadata is not None:  # nn.Module version info used by _load_from_state_dict
            out._metadata = metadata  # type: ignore[attr-defined]
        return out
    if isinstance(state, list):
        if all_plain_leaves(state):
            return list(state)
        return [_walk(v, f"{where}[{i}]", allow_unsafe, on_tensor) for i, v in enumerate(state)]
    if isinstance(state, tuple) and not hasattr(state, "_fields"):
        if all_plain_leaves(state):
            return tuple(state)
        return tuple(
            _walk(v, f"{where}[{i}]", allow_unsafe, on_tensor) for i, v in enumerate(state)
        )
    if allow_unsafe:
        return state
    raise UnsafeStateError(
        f"{where}: a {type(state).__module__}.{type(state).__qualname__} cannot be loaded with "
        "weights_only=True; use tensors, NumPy arrays, plain values (exactly bool, int, float, "
        "str, bytes, None) and dicts, lists and tuples of them, or pass "
        "Checkpointer(..., allow_unsafe_pickle=True) to both save and restore"
    )


_DICTS = frozenset({dict, OrderedDict})


def unflatten(skeleton: Any, tensors: Mapping[int, torch.Tensor]) -> Any:
    if isinstance(skeleton, Mapping):
        if len(skeleton) == 1 and TENSOR_REF in skeleton:
            return tensors[int(skeleton[TENSOR_REF])]
        items = [(k, unflatten(v, tensors)) for k, v in skeleton.items()]
        if is_array_marker(skeleton):
            return decode_array(dict(items))
        out: dict[Any, Any] = (
            OrderedDict(items) if isinstance(skeleton, OrderedDict) else dict(items)
        )
        metadata = getattr(skeleton, "_metadata", None)
        if metadata is not None:
            out._metadata = metadata  # type: ignore[attr-defined]
        return out
    if isinstance(skeleton, list):
        return [unflatten(v, tensors) for v in skeleton]
    if isinstance(skeleton, tuple):
        return tuple(unflatten(v, tensors) for v in skeleton)
    return skeleton


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def plan_shards(tensors: list[torch.Tensor], target_bytes: int, max_shards: int) -> list[list[int]]:
    """Indices of ``tensors`` per shard: greedy, largest first, onto the lightest shard."""
    sizes = [tensor_bytes(t) for t in tensors]
    total = sum(sizes)
    count = max(1, min(max_shards, -(-total // max(1, target_bytes)), len(tensors)))
    shards: list[list[int]] = [[] for _ in range(count)]
    loads = [0] * count
    for i in sorted(range(len(tensors)), key=lambda i: -sizes[i]):
        lightest = loads.index(min(loads))
        shards[lightest].append(i)
        loads[lightest] += sizes[i]
    for shard in shards:
        shard.sort()
    return shards


# --------------------------------------------------------------------- streaming save


class _Rendezvous(io.RawIOBase):
    """File-like ``torch.save`` writes into; each large write is handed to the consumer
    and the call returns only after the consumer is done with it (no copy, no lifetime
    question about torch's buffer). Small writes are coalesced into 8 MiB chunks.

    ``on_first_chunk`` runs before the first hand-over (it starts the consumer), so a file
    that never fills a chunk never needs one: :meth:`small_file` returns its bytes whole."""

    def __init__(self, on_first_chunk: Callable[[], None]) -> None:
        super().__init__()
        self._on_first_chunk: Callable[[], None] | None = on_first_chunk
        self._slot: queue.Queue[Any] = queue.Queue(maxsize=1)
        self._ack = threading.Semaphore(0)
        self._buffer = bytearray()
        self._consumer_failed = threading.Event()
        self._position = 0

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        size = view.nbytes
        self._position += size
        if size < _COALESCE_BELOW:
            self._buffer += view
            if len(self._buffer) >= _COALESCE_TARGET:
                self._flush_buffer()
            return size
        self._flush_buffer()
        self._hand_over(view)
        return size

    def _flush_buffer(self) -> None:
        if self._buffer:
            chunk, self._buffer = bytes(self._buffer), bytearray()
            self._hand_over(chunk)

    def _hand_over(self, chunk: Any) -> None:
        if self._on_first_chunk is not None:
            start, self._on_first_chunk = self._on_first_chunk, None
            start()
        self._put(chunk)
        while not self._ack.acquire(timeout=_STALL_POLL_S):
            if self._consumer_failed.is_set():
                raise _WriterStopped("the store writer stopped reading")

    def _put(self, item: Any) -> None:
        while True:
            if self._consumer_failed.is_set():
                raise _WriterStopped("the store writer stopped reading")
            try:
                self._slot.put(item, timeout=_STALL_POLL_S)
                return
            except queue.Full:
                continue

    def small_file(self) -> bytes | None:
        """The whole file, when nothing was handed over (no consumer was started)."""
        if self._on_first_chunk is None:
            return None
        return bytes(self._buffer)

    def finish(self) -> None:
        self._flush_buffer()
        self._put(None)

    def fail(self, exc: BaseException) -> None:
        with contextlib.suppress(queue.Full):
            self._slot.put_nowait(exc)

    def chunks(self) -> Iterator[bytes]:
        try:
            while True:
                item = self._slot.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise OSError(f"serialization failed: {item}") from item
                yield item
                self._ack.release()
        finally:
            self._consumer_failed.set()


def save_without_crc32(obj: Any, buffer: IO[bytes]) -> bool:
    """``torch.save(obj, buffer)`` with the CRC32 of its zip records left at 0; returns
    False where this torch lacks the (private) pieces and plain ``torch.save`` ran instead.

    torch's own switch (``torch.serialization.set_crc32_options``) is process-wide, so it
    would change the files the training code saves meanwhile; this builds the writer
    ``torch.save`` builds, with the flag off for this file only. ``torch.load`` reads the
    result as any other file (it does not check CRCs; ``unzip -t`` would complain)."""
    writer_type: Any = getattr(torch._C, "PyTorchFileWriter", None)
    save: Any = getattr(torch.serialization, "_save", None)
    alignment: Any = getattr(torch.serialization, "_get_storage_alignment", None)
    writer: Any = None
    if writer_type is not None and save is not None and alignment is not None:
        with contextlib.suppress(TypeError):  # a writer without the CRC32 flag
            writer = writer_type(buffer, False, alignment())
    if writer is None:
        torch.save(obj, buffer)
        return False
    save(obj, writer, pickle, torch.serialization.DEFAULT_PROTOCOL, False)
    writer.write_end_of_file()
    buffer.flush()
    return True


def stream_to_store(obj: Any, writer: StepWriter, path: str) -> FileEntry:
    """``torch.save(obj)`` into ``path`` of the in-progress step, hashed while written.

    A file smaller than one coalesced chunk (8 MiB: a skeleton, a rank's RNG state, a small
    model's shard) is written from the calling thread in one piece; a larger one streams
    through a consumer thread started at its first chunk. Starting and joining that thread
    was most of a small fast save's writing time, all of it holding the GIL the training
    thread needs."""
    result: dict[str, Any] = {}
    thread: threading.Thread | None = None

    def consume() -> None:
        try:
            result["entry"] = writer.write_file(path, pipe.chunks())
        except BaseException as exc:
            result["error"] = exc
            pipe._consumer_failed.set()

    def start() -> None:
        nonlocal thread
        thread = threading.Thread(target=consume, name=f"rtj-write-{path}", daemon=True)
        thread.start()

    pipe = _Rendezvous(start)
    try:
        save_without_crc32(obj, cast(IO[bytes], pipe))
        whole = pipe.small_file()
        if whole is not None:
            return writer.write_file(path, [whole])
        pipe.finish()
    except BaseException as exc:
        if thread is None:
            raise
        pipe.fail(exc)  # the writer sees an error and never returns an entry
        thread.join()
        if isinstance(exc, _WriterStopped) and "error" in result:
            raise result["error"] from None
        raise
    assert thread is not None
    thread.join()
    if "error" in result:
        raise result["error"]
    entry = result["entry"]
    assert isinstance(entry, FileEntry)
    return entry


# --------------------------------------------------------------------- loading


def load(source: Path | bytes, allow_unsafe: bool, mmap: bool = True) -> Any:
    """``torch.load`` with ``weights_only=True`` unless unsafe unpickling was opted into."""
    if allow_unsafe:
        warnings.warn(
            "rtj_shim.torch: loading a checkpoint with weights_only=False (allow_unsafe_pickle="
            "True): a checkpoint from an untrusted writer can run arbitrary code",
            stacklevel=3,
        )
    if isinstance(source, bytes):
        return torch.load(io.BytesIO(source), weights_only=not allow_unsafe, map_location="cpu")
    return torch.load(source, weights_only=not allow_unsafe, map_location="cpu", mmap=mmap)
