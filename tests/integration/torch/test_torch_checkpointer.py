"""Checkpointer in one process: exact resume, async save, guards, safe loading, resume.json."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from rtj_shim.checkpoint.layout import step_key
from rtj_shim.checkpoint.resolver import resolve
from rtj_shim.checkpoint.storage import open_store
from rtj_shim.checkpoint.verification import Depth
from rtj_shim.fast.fast_tier import FastTierConfig
from rtj_shim.torch import (
    Checkpointer,
    CheckpointError,
    NonFiniteStateError,
    RestoreValidationError,
    ResumableSampler,
    UnsafeStateError,
)
from rtj_shim.torch.options import IoOptions, ResumeOptions


class Job:
    """A tiny job with every kind of state: dropout, AdamW, LambdaLR, sampler, RNGs."""

    def __init__(self, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.model = nn.Sequential(nn.Linear(8, 32), nn.Dropout(0.2), nn.Linear(32, 1))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda i: 1.0 / (1 + 0.1 * i))
        self.sampler = ResumableSampler(range(40), num_replicas=1, rank=0, seed=3)  # type: ignore[arg-type]
        self._it: Iterator[int] | None = None

    @property
    def objects(self) -> dict[str, Any]:
        return {"model": self.model, "opt": self.opt, "sched": self.sched, "data": self.sampler}

    def next_index(self) -> int:
        while True:
            if self._it is None:
                self._it = iter(self.sampler)
            try:
                return next(self._it)
            except StopIteration:
                self.sampler.set_epoch(self.sampler.epoch + 1)
                self._it = None

    def train(self, steps: int) -> list[tuple[float, float, int, float, float]]:
        out = []
        for _ in range(steps):
            idx = self.next_index()
            x = torch.randn(4, 8) + idx
            loss = self.model(x).pow(2).mean()
            loss.backward()
            self.opt.step()
            self.opt.zero_grad()
            lr = self.sched.get_last_lr()[0]
            self.sched.step()
            out.append((loss.item(), lr, idx, random.random(), float(np.random.rand())))
        return out


def params(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def published(root: Path) -> list[int]:
    steps = root / "steps"
    if not steps.exists():
        return []
    return sorted(int(p.name[5:]) for p in steps.iterdir() if ".tmp-" not in p.name)


@pytest.fixture(autouse=True)
def _no_resume_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RTJ_RESUME_FILE", str(tmp_path / "absent-resume.json"))
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)


@pytest.mark.parametrize("blocking", [True, False])
def test_resume_continues_bit_for_bit(tmp_path: Path, blocking: bool) -> None:
    job = Job()
    ckpt = Checkpointer(tmp_path)
    assert ckpt.restore(job.objects) == 0
    job.train(57)  # crosses an epoch boundary of the 40-sample dataset
    ckpt.save(57, job.objects, blocking=blocking)
    expected = job.train(30)  # training continues while a background save runs
    ckpt.wait()

    resumed = Job(seed=99)
    random.seed(5)
    np.random.seed(5)
    torch.manual_seed(5)
    fresh = Checkpointer(tmp_path)
    assert fresh.restore(resumed.objects) == 57
    assert resumed.train(30) == expected


def test_async_save_publishes_the_state_at_the_call_not_later(tmp_path: Path) -> None:
    job = Job()
    ckpt = Checkpointer(tmp_path, io=IoOptions(shard_bytes=1024))  # several shards
    job.train(3)
    at_save = params(job.model)
    ckpt.save(3, job.objects, blocking=False)
    job.train(5)  # optimizer.step() waits for staging, then changes the parameters
    ckpt.wait()
    report = ckpt.last_save
    assert report is not None and report.step == 3 and not report.blocking
    assert report.stall_seconds <= report.seconds
    other = Job(seed=1)
    assert Checkpointer(tmp_path).restore(other.objects) == 3
    for a, b in zip(at_save, params(other.model), strict=True):
        assert torch.equal(a, b)


def test_a_fast_save_keeps_the_state_at_its_boundary_not_later(tmp_path: Path) -> None:
    """The fast tier stages as a background save does (the optimizer's tensors behind the
    fence), and an in-place restart's resume file (``fast_step``) brings back the state of
    that boundary, not of the steps trained while it was written."""
    job, resume = Job(), tmp_path / "resume.json"
    settings: dict[str, Any] = dict(
        resume=ResumeOptions(resume_file=resume),
        fast_tier=FastTierConfig(tmp_path / "fast", every_steps=3),
    )
    ckpt = Checkpointer(tmp_path / "durable", **settings)
    job.train(3)
    at_save = params(job.model)
    ckpt.step_boundary(3, job.objects)
    job.train(5)  # optimizer.step() waits for the staging, then changes the parameters
    ckpt.close()
    resume.write_text(json.dumps({"fast_step": 3}))
    other = Job(seed=1)
    fresh = Checkpointer(tmp_path / "durable", **settings)
    assert fresh.restore(other.objects) == 3
    assert fresh.last_restore is not None and fresh.last_restore.source == "fast-tier"
    for a, b in zip(at_save, params(other.model), strict=True):
        assert torch.equal(a, b)


def test_a_fast_save_keeps_what_the_next_forward_changes_as_it_was_at_the_boundary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fast save copies on the training thread only what may change before the next
    ``optimizer.step()`` (a BatchNorm's running statistics, a plain value mutated in place,
    the sampler, every RNG) and plans the rest on its writer thread, behind the fence. The
    writer is held here until the next forward has moved all of them; the fast step still
    restores each as it was at the boundary."""
    import rtj_shim.torch.fast_save as fast_save

    planned = fast_save.capture
    forward_done = threading.Event()

    def capture_after_the_forward(*args: Any, **kwargs: Any) -> Any:
        assert forward_done.wait(30)
        return planned(*args, **kwargs)

    monkeypatch.setattr(fast_save, "capture", capture_after_the_forward)

    def job(seed: int) -> dict[str, Any]:
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 1))
        sampler = ResumableSampler(range(40), num_replicas=1, rank=0, seed=3)  # type: ignore[arg-type]
        return {
            "model": model,
            "opt": torch.optim.AdamW(model.parameters(), lr=1e-2),
            "data": sampler,
            "history": {"losses": [float(seed)]},
        }

    def train(objects: dict[str, Any], data: Iterator[int]) -> None:
        loss = objects["model"](torch.randn(4, 8) + next(data)).pow(2).mean()
        loss.backward()
        objects["opt"].step()
        objects["opt"].zero_grad()
        objects["history"]["losses"].append(loss.item())

    resume = tmp_path / "resume.json"
    settings: dict[str, Any] = dict(
        resume=ResumeOptions(resume_file=resume),
        fast_tier=FastTierConfig(tmp_path / "fast", every_steps=2),
    )
    objects = job(0)
    data = iter(objects["data"])
    ckpt = Checkpointer(tmp_path / "durable", **settings)
    for step in (1, 2):
        train(objects, data)
        ckpt.step_boundary(step, objects)
    at_boundary = {k: v.clone() for k, v in objects["model"].state_dict().items()}
    losses, sampler = list(objects["history"]["losses"]), objects["data"].state_dict()
    rng_state = torch.get_rng_state()
    objects["history"]["losses"].append(99.0)  # mutated in place
    objects["model"](torch.randn(4, 8) + next(data))  # running statistics, RNG, sampler move
    assert not torch.equal(objects["model"][1].running_mean, at_boundary["1.running_mean"])
    forward_done.set()
    train(objects, data)  # its optimizer.step() waits at the fence for the writer
    ckpt.close()

    resume.write_text(json.dumps({"fast_step": 2}))
    fresh = job(1)
    restored = Checkpointer(tmp_path / "durable", **settings)
    assert restored.restore(fresh) == 2
    assert restored.last_restore is not None and restored.last_restore.source == "fast-tier"
    for key, value in fresh["model"].state_dict().items():
        assert torch.equal(value, at_boundary[key]), key
    assert fresh["history"] == {"losses": losses}
    assert fresh["data"].state_dict() == sampler
    assert torch.equal(torch.get_rng_state(), rng_state)


class TiedLM(nn.Module):
    """Embedding and output layer share one weight (as in most language models)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(64, 32)
        self.mid = nn.Linear(32, 32)
        self.head = nn.Linear(32, 64, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.mid(self.embed(ids))))


def shards(root: Path, step: int) -> tuple[int, int]:
    """File bytes of the replicated shards, and the tensor bytes they hold."""
    manifest = json.loads((root / step_key(step, "manifest.json")).read_text())
    paths = [f["path"] for f in manifest["files"] if f["path"].startswith("common/shard-")]
    files = sum(f["bytes"] for f in manifest["files"] if f["path"] in paths)
    payload = 0
    for path in paths:  # a storage two tensors of one file share is in that file once
        part = torch.load(root / step_key(step, path), weights_only=True)
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage() for t in part.values()}
        payload += sum(storage.nbytes() for storage in storages.values())
    return files, payload


@pytest.mark.parametrize("shard_kib", [1, 64])  # the tied pair in different shards, or in one
def test_tied_weights_are_saved_once_by_blocking_and_background_saves(
    tmp_path: Path, shard_kib: int
) -> None:
    torch.manual_seed(0)
    model = TiedLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randint(0, 64, (4, 8))).pow(2).mean().backward()
    opt.step()
    objects = {"model": model, "opt": opt}
    blocking, background = tmp_path / "blocking", tmp_path / "background"
    Checkpointer(blocking, io=IoOptions(shard_bytes=shard_kib * 1024)).save(1, objects)
    ckpt = Checkpointer(background, io=IoOptions(shard_bytes=shard_kib * 1024))
    ckpt.save(1, objects, blocking=False)
    ckpt.wait()
    moments = [t for per_param in opt.state_dict()["state"].values() for t in per_param.values()]
    distinct = {
        t.data_ptr(): t.numel() * t.element_size() for t in [*model.state_dict().values(), *moments]
    }
    assert shards(background, 1) == shards(blocking, 1)
    assert shards(blocking, 1)[1] == sum(distinct.values())  # the shared weight once

    restored = TiedLM()
    again = {"model": restored, "opt": torch.optim.AdamW(restored.parameters(), lr=1e-2)}
    assert Checkpointer(background).restore(again) == 1
    assert restored.head.weight is restored.embed.weight
    for name, value in model.state_dict().items():
        assert torch.equal(value, restored.state_dict()[name]), name


def test_manifest_records_framework_topology_and_layout(tmp_path: Path) -> None:
    job = Job()
    job.train(2)
    ckpt = Checkpointer(tmp_path, io=IoOptions(shard_bytes=2048))
    ckpt.save(2, job.objects, loss=0.5)
    manifest = json.loads((tmp_path / step_key(2, "manifest.json")).read_text())
    assert manifest["framework"]["name"] == "pytorch"
    assert manifest["framework"]["version"] == torch.__version__
    assert {"python", "numpy", "rtj_shim"} <= set(manifest["framework"]["components"])
    assert manifest["world_size"] == 1 and manifest["parallelism"] == {"data_parallel": 1}
    extra = manifest["extra"]["torch"]
    assert extra["layout"] == "replicated" and extra["loss"] == 0.5
    assert extra["objects"]["model"] == {"kind": "module", "placement": "common"}
    assert extra["samplers"]["data"]["offset"] == 2
    assert set(extra["rng"]) >= {"python", "numpy", "torch_cpu"}
    paths = {f["path"] for f in manifest["files"]}
    assert {"common/skeleton.pt", "ranks/rank-00000.pt"} <= paths
    assert len([p for p in paths if p.startswith("common/shard-")]) > 1


def test_nonfinite_loss_or_parameters_are_refused(tmp_path: Path) -> None:
    job = Job()
    job.train(2)
    ckpt = Checkpointer(tmp_path)
    ckpt.save(2, job.objects)
    with pytest.raises(NonFiniteStateError, match="loss is nan"):
        ckpt.save(3, job.objects, loss=float("nan"))
    with torch.no_grad():
        job.model[0].weight[0, 0] = float("inf")
    with pytest.raises(NonFiniteStateError, match=r"model\.0\.weight has 1 non-finite"):
        ckpt.save(4, job.objects)
    ckpt.save(5, job.objects, blocking=False)
    with pytest.raises(NonFiniteStateError):
        ckpt.wait()
    assert published(tmp_path) == [2]
    assert resolve(open_store(str(tmp_path)), Depth.DEEP).step == 2


def test_background_errors_surface_at_wait_and_publish_nothing(tmp_path: Path) -> None:
    class FailingWriter:
        def __init__(self, inner: Any) -> None:
            self._inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

        def write_file(self, path: str, chunks: Any) -> Any:
            raise OSError("No space left on device")

    class FailingStore:
        def __init__(self, inner: Any) -> None:
            self._inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

        def begin_step(self, step: int, attempt: str, *, fresh: bool = True) -> Any:
            return FailingWriter(self._inner.begin_step(step, attempt, fresh=fresh))

    job = Job()
    ckpt = Checkpointer(FailingStore(open_store(str(tmp_path))))  # type: ignore[arg-type]
    ckpt.save(1, job.objects, blocking=False)
    with pytest.raises(CheckpointError, match="No space left"):
        ckpt.wait()
    ckpt.wait()  # reported once
    assert published(tmp_path) == []
    assert not any((tmp_path / "steps").iterdir())  # the in-progress area was dropped


class Config:
    """Not a tensor or plain container: weights_only=True refuses it."""

    def __init__(self) -> None:
        self.value = 3


class Holder:
    def __init__(self) -> None:
        self.cfg = Config()

    def state_dict(self) -> dict[str, Any]:
        return {"cfg": self.cfg}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cfg = state["cfg"]


def test_unsafe_state_is_refused_at_save_unless_opted_in(tmp_path: Path) -> None:
    with pytest.raises(UnsafeStateError, match="weights_only"):
        Checkpointer(tmp_path / "safe").save(1, {"holder": Holder()})
    unsafe = Checkpointer(tmp_path / "unsafe", resume=ResumeOptions(allow_unsafe_pickle=True))
    unsafe.save(1, {"holder": Holder()})
    other = Holder()
    other.cfg.value = 0
    with pytest.warns(UserWarning, match="arbitrary code"):
        Checkpointer(tmp_path / "unsafe", resume=ResumeOptions(allow_unsafe_pickle=True)).restore(
            {"holder": other}
        )
    assert other.cfg.value == 3


def test_probe_validates_the_restore_and_catches_lost_optimizer_state(tmp_path: Path) -> None:
    batch = torch.randn(16, 8)

    def probe_for(job: Job) -> Any:
        return lambda: job.model(batch).pow(2).mean()

    job = Job()
    job.train(5)
    Checkpointer(tmp_path, resume=ResumeOptions(probe=probe_for(job))).save(5, job.objects)
    extra = json.loads((tmp_path / step_key(5, "manifest.json")).read_text())["extra"]["torch"]
    assert {"loss", "grad_norm", "moments"} <= set(extra["validation"])
    assert extra["validation"]["moments"]["opt"]["exp_avg_sq"] > 0

    good = Job(seed=7)
    assert (
        Checkpointer(tmp_path, resume=ResumeOptions(probe=probe_for(good))).restore(good.objects)
        == 5
    )
    assert all(p.grad is None for p in good.model.parameters())  # probe left no gradients

    class LossyAdamW(torch.optim.AdamW):
        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            super().load_state_dict({**state_dict, "state": {}})  # a silent bug

    bad = Job(seed=7)
    bad.opt = LossyAdamW(bad.model.parameters(), lr=1e-2)
    bad.sched = torch.optim.lr_scheduler.LambdaLR(bad.opt, lambda i: 1.0)
    with pytest.raises(RestoreValidationError, match="exp_avg"):
        Checkpointer(tmp_path, resume=ResumeOptions(probe=probe_for(bad))).restore(bad.objects)

    wrong = Job(seed=7)
    other_batch = torch.randn(16, 8) * 10
    with pytest.raises(RestoreValidationError, match="probe loss"):
        Checkpointer(
            tmp_path, resume=ResumeOptions(probe=lambda: wrong.model(other_batch).pow(2).mean())
        ).restore(wrong.objects)


def test_probe_does_not_perturb_training(tmp_path: Path) -> None:
    batch = torch.randn(16, 8)
    runs = []
    for name, with_probe in (("a", True), ("b", False)):
        random.seed(0)
        np.random.seed(0)
        job = Job()
        job.train(3)
        probe = (lambda j=job: j.model(batch).sum()) if with_probe else None
        Checkpointer(tmp_path / name, resume=ResumeOptions(probe=probe)).save(3, job.objects)
        runs.append(job.train(5))
    assert runs[0] == runs[1]


def test_resume_file_pins_the_step_for_the_first_incarnation_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    job = Job()
    ckpt = Checkpointer(root)
    for step in (10, 20):
        job.train(10)
        ckpt.save(step, job.objects)
    resume = tmp_path / "resume.json"
    uri = open_store(str(root)).key_uri(step_key(10))
    resume.write_text(json.dumps({"step": 10, "uri": uri, "skipped": []}))
    monkeypatch.setenv("RTJ_RESUME_FILE", str(resume))

    pinned = Checkpointer(root)
    assert pinned.restore(Job().objects) == 10
    assert pinned.last_restore is not None and pinned.last_restore.source == "resume-file"

    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # in-pod restart: resolve again
    again = Checkpointer(root)
    assert again.restore(Job().objects) == 20
    assert again.last_restore is not None and again.last_restore.source == "resolved"
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT")

    resume.write_text(json.dumps({"step": None, "uri": None, "skipped": []}))
    assert Checkpointer(root).restore(Job().objects) == 0

    shard = next((root / step_key(10, "common")).glob("shard-*"))
    data = bytearray(shard.read_bytes())
    data[-100] ^= 1
    shard.write_bytes(bytes(data))
    resume.write_text(json.dumps({"step": 10, "uri": uri, "skipped": []}))
    with pytest.raises(CheckpointError, match="pins step 10, which does not verify"):
        Checkpointer(root).restore(Job().objects)

    # the init container's own deep verification of this pod and attempt is not repeated:
    # the restore checks the manifest, COMMITTED and sizes only (a flipped byte after it
    # ran is outside what it promised), so a restart reads the step once, not twice
    resume.write_text(json.dumps({"step": 10, "uri": uri, "skipped": [],
                                  "verification": "deep"}))  # fmt: skip
    assert Checkpointer(root).restore(Job().objects) == 10
    shard.write_bytes(bytes(data[:-1]))  # a size the manifest does not have: still refused
    with pytest.raises(CheckpointError, match="pins step 10, which does not verify"):
        Checkpointer(root).restore(Job().objects)

    resume.write_text(json.dumps({"step": 10, "uri": "s3://elsewhere/x", "skipped": []}))
    with pytest.raises(CheckpointError, match="not under this job's root"):
        Checkpointer(root).restore(Job().objects)


def test_restore_skips_broken_steps_and_a_resave_replaces_them(tmp_path: Path) -> None:
    job = Job()
    ckpt = Checkpointer(tmp_path)
    for step in (10, 20, 30):
        job.train(10)
        ckpt.save(step, job.objects)
    shard = next((tmp_path / step_key(20, "common")).glob("shard-*"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    (tmp_path / step_key(30, "COMMITTED")).unlink()

    resumed = Job()
    again = Checkpointer(tmp_path)
    assert again.restore(resumed.objects) == 10
    assert again.last_restore is not None
    reasons = dict(again.last_restore.skipped)
    assert "COMMITTED is missing" in reasons[30] and "sha256" in reasons[20]
    resumed.train(10)
    again.save(20, resumed.objects)  # replaces the corrupt step 20
    assert resolve(open_store(str(tmp_path)), Depth.DEEP).step == 20
    assert again.save(20, resumed.objects).already_published  # type: ignore[union-attr]
    resumed.train(1)
    with pytest.raises(CheckpointError, match="already published"):
        again.save(20, resumed.objects)  # a valid published step stays immutable


def test_missing_object_state_fails_loudly(tmp_path: Path) -> None:
    job = Job()
    Checkpointer(tmp_path).save(1, {"model": job.model})
    with pytest.raises(CheckpointError, match=r"no state for \['opt'\]"):
        Checkpointer(tmp_path).restore({"model": job.model, "opt": job.opt})


@pytest.mark.s3
def test_s3_root_round_trip(s3_root: str) -> None:
    job = Job()
    ckpt = Checkpointer(s3_root, io=IoOptions(shard_bytes=2048))
    job.train(4)
    ckpt.save(4, job.objects)
    expected = job.train(6)
    resumed = Job(seed=3)
    assert Checkpointer(s3_root).restore(resumed.objects) == 4
    assert resumed.train(6) == expected


def test_objects_given_as_a_list_are_refused_naming_the_argument(tmp_path: Path) -> None:
    """`restore([model])` (issue 44): an error that says what `objects` must be, not
    AttributeError: 'list' object has no attribute 'items'."""
    ckpt = Checkpointer(tmp_path)
    model = nn.Linear(2, 2)
    for call in (lambda: ckpt.restore([model]), lambda: ckpt.save(1, [model])):  # type: ignore[arg-type]
        with pytest.raises((CheckpointError, TypeError), match=r"objects: expected a mapping of"):
            call()
    ckpt.close()
