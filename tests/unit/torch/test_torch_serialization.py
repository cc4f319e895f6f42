"""Flattening, sharding, streaming into a StepWriter, safe loading, RNG capture."""

from __future__ import annotations

import hashlib
import io
import random
import threading
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pytest
import torch

from rtj_shim.checkpoint.manifest import FileEntry
from rtj_shim.torch import UnsafeStateError, rng
from rtj_shim.torch import serialization as ser


class MemoryWriter:
    """A StepWriter that keeps files in memory (and can fail after some bytes)."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.files: dict[str, bytes] = {}
        self.chunks: list[int] = []
        self.fail_after = fail_after
        self.threads: list[str] = []  # the thread each file was written from

    @property
    def step(self) -> int:
        return 1

    def write_file(self, path: str, chunks: Iterable[bytes]) -> FileEntry:
        data = bytearray()
        self.threads.append(threading.current_thread().name)
        for chunk in chunks:
            data += chunk
            self.chunks.append(len(chunk))
            if self.fail_after is not None and len(data) > self.fail_after:
                raise OSError("disk full")
        self.files[path] = bytes(data)
        sha = hashlib.sha256(data).hexdigest()
        return FileEntry(path=path, bytes=len(data), sha256=sha)

    def copy_file(self, path: str, source: Path) -> FileEntry:
        return self.write_file(path, [source.read_bytes()])

    def commit(self, manifest: bytes, committed: bytes) -> None:
        pass

    def abort(self) -> None:
        pass


def test_flatten_roundtrip_keeps_structure_and_module_metadata() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    state = {"m": model.state_dict(), "o": opt.state_dict(), "t": (1, [2.5, None, "x"])}
    tensors: list[torch.Tensor] = []
    skeleton = ser.flatten(state, tensors, "state", allow_unsafe=False)
    assert tensors and all(isinstance(t, torch.Tensor) for t in tensors)
    buf = io.BytesIO()
    torch.save(skeleton, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    back = ser.unflatten(loaded, dict(enumerate(tensors)))
    assert isinstance(back["m"], OrderedDict)
    assert back["m"]._metadata == state["m"]._metadata
    assert back["t"] == (1, [2.5, None, "x"])
    assert back["o"]["param_groups"] == state["o"]["param_groups"]
    for k, v in state["m"].items():
        assert torch.equal(back["m"][k], v)


def test_flatten_gives_tensors_viewing_the_same_data_one_reference() -> None:
    weight = torch.randn(4, 3)
    state = {
        "embed.weight": weight,
        "head.weight": weight.detach(),  # a tied weight, as state_dict() returns it
        "copy": weight.clone(),
        "row": weight[1],  # a view of part of it: not the same values
        "empty": [torch.empty(0), torch.empty(0)],
    }
    tensors: list[torch.Tensor] = []
    skeleton = ser.flatten(state, tensors, "m", allow_unsafe=False)
    refs = {k: v[ser.TENSOR_REF] for k, v in skeleton.items() if k != "empty"}
    assert refs["embed.weight"] == refs["head.weight"]
    assert len({refs["embed.weight"], refs["copy"], refs["row"]}) == 3
    assert len(tensors) == 5
    back = ser.unflatten(skeleton, dict(enumerate(tensors)))
    assert back["embed.weight"] is back["head.weight"]
    assert torch.equal(back["row"], weight[1])

    seen: dict[tuple[object, ...], int] = {}  # one reference across calls sharing the list
    shared: list[torch.Tensor] = []
    first = ser.flatten({"w": weight}, shared, "model", allow_unsafe=False, seen=seen)
    again = ser.flatten({"w": weight.detach()}, shared, "ema", allow_unsafe=False, seen=seen)
    assert first == again and len(shared) == 1


def test_flatten_refuses_objects_weights_only_cannot_load() -> None:
    class Custom:
        pass

    with pytest.raises(UnsafeStateError, match=r"state\.cfg.*weights_only=True"):
        ser.flatten({"cfg": Custom()}, [], "state", allow_unsafe=False)
    assert ser.flatten({"cfg": 1}, [], "state", allow_unsafe=False) == {"cfg": 1}


def test_plan_shards_balances_and_covers_everything() -> None:
    tensors = [torch.empty(n) for n in (1000, 10, 500, 500, 20, 990)]
    shards = ser.plan_shards(tensors, target_bytes=4000, max_shards=8)
    assert sorted(i for s in shards for i in s) == list(range(6))
    loads = [sum(ser.tensor_bytes(tensors[i]) for i in s) for s in shards]
    assert len(shards) == 4  # ceil(12080 bytes / 4000)
    assert max(loads) - min(loads) <= 4 * 1000
    assert ser.plan_shards(tensors, target_bytes=1 << 30, max_shards=8) == [list(range(6))]


def torch_save_without_crc32(state: object) -> bytes:
    expected = io.BytesIO()
    torch.serialization.set_crc32_options(False)
    try:
        torch.save(state, expected)
    finally:
        torch.serialization.set_crc32_options(True)
    return expected.getvalue()


def test_stream_to_store_writes_exactly_what_torch_save_writes_without_crc32() -> None:
    state = {"big": torch.arange(600_000, dtype=torch.float32), "small": torch.ones(3), "n": 7}
    writer = MemoryWriter()
    entry = ser.stream_to_store(state, writer, "common/shard-00000.pt")
    expected = io.BytesIO(torch_save_without_crc32(state))
    assert writer.files["common/shard-00000.pt"] == expected.getvalue()
    assert entry.bytes == len(expected.getvalue())
    assert max(writer.chunks) >= 2_000_000  # the tensor went through as one zero-copy chunk
    loaded = ser.load(writer.files["common/shard-00000.pt"], allow_unsafe=False)
    assert torch.equal(loaded["big"], state["big"]) and loaded["n"] == 7


def test_the_crc32_is_skipped_for_this_file_only() -> None:
    """The private pieces are there in this torch (else torch.save runs, slower); the
    process-wide option is untouched, so the training code's own saves keep their CRCs."""
    state = {"t": torch.arange(1000, dtype=torch.float64), "s": "x"}
    out = io.BytesIO()
    assert ser.save_without_crc32(state, out) is True
    assert torch.serialization.get_crc32_options() is True
    assert out.getvalue() == torch_save_without_crc32(state)
    with_crc = io.BytesIO()
    torch.save(state, with_crc)
    assert with_crc.getvalue() != out.getvalue()  # only the CRC fields differ
    assert len(with_crc.getvalue()) == len(out.getvalue())
    loaded = torch.load(io.BytesIO(out.getvalue()), weights_only=True)
    assert torch.equal(loaded["t"], state["t"]) and loaded["s"] == "x"


def test_a_small_file_is_written_whole_from_the_calling_thread() -> None:
    """A skeleton, an RNG state, a small model's shard: no consumer thread to start and
    join (that was most of a small fast save's writing time)."""
    state = {"t": torch.arange(1000, dtype=torch.float32), "rng": tuple(range(625))}
    writer = MemoryWriter()
    entry = ser.stream_to_store(state, writer, "ranks/rank-00000.pt")
    expected = torch_save_without_crc32(state)
    assert writer.files["ranks/rank-00000.pt"] == expected
    assert writer.chunks == [len(expected)] and entry.bytes == len(expected)
    assert writer.threads == [threading.current_thread().name]
    big = MemoryWriter()
    ser.stream_to_store({"big": torch.zeros(600_000)}, big, "x.pt")
    assert big.threads == ["rtj-write-x.pt"]  # a large one streams through a consumer


@pytest.mark.parametrize("elements", [100_000, 3_000_000], ids=["small", "streamed"])
def test_stream_to_store_raises_the_writers_error_and_never_returns_an_entry(
    elements: int,
) -> None:
    writer = MemoryWriter(fail_after=1000)
    with pytest.raises(OSError, match="disk full"):
        ser.stream_to_store({"t": torch.zeros(elements)}, writer, "x.pt")
    assert "x.pt" not in writer.files


def test_stream_to_store_propagates_serialization_errors() -> None:
    class Exploding:
        def __reduce__(self) -> tuple[object, ...]:
            raise RuntimeError("cannot pickle me")

    writer = MemoryWriter()
    with pytest.raises(RuntimeError, match="cannot pickle me"):
        ser.stream_to_store({"t": torch.zeros(10), "x": Exploding()}, writer, "x.pt")
    assert "x.pt" not in writer.files


def test_load_is_weights_only_unless_opted_in(tmp_path: Path) -> None:
    path = tmp_path / "obj.pt"
    torch.save({"fn": Path("/etc")}, path)  # an arbitrary class
    with pytest.raises(Exception, match="weights_only"):
        ser.load(path, allow_unsafe=False)
    with pytest.warns(UserWarning, match="arbitrary code"):
        assert ser.load(path, allow_unsafe=True)["fn"] == Path("/etc")


def test_rng_capture_restore_roundtrip_is_weights_only_loadable() -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    state = rng.capture()
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    random.seed(9)
    np.random.seed(9)
    torch.manual_seed(9)
    rng.restore(loaded)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_python_rng_state_is_one_tensor_and_keeps_a_pending_gauss() -> None:
    random.seed(5)
    random.gauss(0.0, 1.0)  # leaves the second normal of the pair pending (gauss_next)
    state = rng.capture()
    assert isinstance(state["python"]["internal"], torch.Tensor)
    assert state["python"]["internal"].shape == (625,)
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    expected = (random.gauss(0.0, 1.0), random.random())
    random.seed(9)
    rng.restore(loaded)
    assert (random.gauss(0.0, 1.0), random.random()) == expected


def test_python_rng_state_saved_as_a_tuple_by_earlier_versions_restores() -> None:
    random.seed(6)
    state = rng.capture()
    state["python"] = random.getstate()  # the form steps were saved in before
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    expected = random.random()
    random.seed(9)
    rng.restore(loaded)
    assert random.random() == expected


def test_rng_isolated_leaves_generators_untouched() -> None:
    torch.manual_seed(0)
    with rng.isolated():
        torch.rand(5)
        random.random()
    torch.manual_seed(0)
    a = torch.rand(1)
    torch.manual_seed(0)
    with rng.isolated():
        torch.rand(100)
    assert torch.equal(torch.rand(1), a)
