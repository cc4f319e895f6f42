"""``Checkpointer``: the whole training state of a PyTorch job through the commit protocol.

Files of one step (all listed, sized and hashed in its manifest)::

    common/skeleton.pt              structure of the replicated state, tensors as references
    common/shard-00000.pt ...       the replicated tensors; shard i is written by rank i % W
    ranks/rank-00000.pt ...         per rank: every RNG and the rank-local Stateful objects
    dcp/...                         sharded modules and optimizers (torch.distributed.checkpoint)

A save is collective. Rank 0 opens the in-progress area (``CommitProtocol.begin``), the
other ranks join it, every rank streams its files through ``StepWriter.write_file``, rank 0
gathers the file entries and publishes, and every rank learns the outcome: a failure on any
rank fails the save on every rank and publishes nothing. Coordination runs on a private
gloo group, so a background save never interleaves with the training's collectives.

Restore is collective too: rank 0 takes the resume decision (the init container's
``resume.json`` or, failing that, deep resolution of the newest verified step) and
broadcasts it with the manifest; every rank loads its part and reports; a rank that cannot
load fails the restore on every rank. State is applied only after every rank has loaded.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import logging
import os
import platform
import shutil
import signal
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import torch

import rtj_shim
from rtj_shim.errors import ShimError, StepAlreadyPublished
from rtj_shim.layout import COMMITTED_FILE, MANIFEST_FILE, StepDirName, step_key
from rtj_shim.manifest import FileEntry, Framework, Manifest, sha256_hex
from rtj_shim.protocol import CommitProtocol, StepMetadata
from rtj_shim.resolver import resolve
from rtj_shim.storage import CheckpointStore, StepWriter, open_store
from rtj_shim.storage.filesystem import FilesystemStore
from rtj_shim.torch import _dist, fsdp, rng
from rtj_shim.torch import serialization as ser
from rtj_shim.torch.state import (
    COMMON,
    RANK,
    SHARDED,
    Entry,
    apply_state,
    classify,
    optimizer_param_ptrs,
    state_of,
)
from rtj_shim.torch.validation import (
    Probe,
    RestoreValidationError,
    compare,
    loss_problem,
    nonfinite_problem,
    optimizer_moments,
    run_probe,
)
from rtj_shim.verification import Depth, check_commit
from rtj_shim.verifier import verify_step

log = logging.getLogger("rtj_shim.torch")

FORMAT = 1
SKELETON = "common/skeleton.pt"
DEFAULT_RESUME_FILE = "/var/run/rtj/resume.json"
MiB = 1 << 20


class CheckpointError(ShimError):
    """A save or restore failed on this rank or on another one."""


class NonFiniteStateError(CheckpointError):
    """The save was refused: the loss or a parameter is NaN or Inf."""


def shard_path(index: int) -> str:
    return f"common/shard-{index:05d}.pt"


def rank_path(rank: int) -> str:
    return f"ranks/rank-{rank:05d}.pt"


@dataclass(frozen=True)
class SaveReport:
    step: int
    blocking: bool
    seconds: float  # save() call to published
    stall_seconds: float  # time the training thread was held
    bytes: int
    files: int
    uri: str | None


@dataclass(frozen=True)
class RestoreReport:
    step: int  # 0: fresh start
    source: str  # "resume-file", "resolved" or "fresh"
    skipped: tuple[tuple[int, str], ...]
    seconds: float
    notes: tuple[str, ...] = ()


@dataclass
class _Job:
    step: int
    blocking: bool
    started: float
    entries: list[Entry]
    problem: str | None  # found before the job ran (loss)
    skeleton: dict[str, Any]
    tensors: list[torch.Tensor]  # every replicated tensor (references)
    shards: list[list[int]]  # tensor indices per shard
    mine: list[int]  # shard numbers this rank writes
    fenced: set[int]  # tensor indices staged in the background (mutated only by step())
    rank_state: dict[str, Any]
    sharded: dict[str, Any]  # DCP state (references)
    extra: dict[str, Any]
    sharded_files: list[tuple[str, Path]] = field(default_factory=list)
    stage_dir: Path | None = None
    staged: threading.Event = field(default_factory=threading.Event)
    stall: float = 0.0


class Checkpointer:
    """Save and restore the complete state of a (distributed) PyTorch job.

    ``root``: a path, ``file://`` or ``s3://`` URI (or an opened store). Rank and world size
    come from ``torch.distributed`` when it is initialized.
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | CheckpointStore,
        *,
        run_id: str | None = None,
        attempt: str | None = None,
        rank_local: tuple[str, ...] = (),
        allow_unsafe_pickle: bool = False,
        probe: Probe | None = None,
        probe_rtol: float = 1e-3,
        probe_atol: float = 1e-6,
        check_finite: bool = True,
        io_workers: int = 4,
        shard_bytes: int = 32 * MiB,
        max_shards: int = 64,
        emergency_deadline_s: float = 30.0,
        emergency_exit_code: int = 143,
        collective_timeout_s: float = 600.0,
        resume_file: str | os.PathLike[str] | None = None,
        staging_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if isinstance(root, str | os.PathLike):
            self.store: CheckpointStore = open_store(os.fspath(root))
        else:
            self.store = root
        self.protocol = CommitProtocol(
            self.store, run_id=run_id, attempt=attempt or os.environ.get("RTJ_ATTEMPT") or "0"
        )
        self.rank = _dist.rank()
        self.world_size = _dist.world_size()
        self.rank_local = tuple(rank_local)
        self.allow_unsafe_pickle = allow_unsafe_pickle
        if allow_unsafe_pickle:
            log.warning("allow_unsafe_pickle=True: restore will unpickle arbitrary objects")
        self.probe = probe
        self.probe_rtol = probe_rtol
        self.probe_atol = probe_atol
        self.check_finite = check_finite
        self.io_workers = max(1, io_workers)
        self.shard_bytes = shard_bytes
        self.max_shards = max_shards
        self.emergency_deadline_s = emergency_deadline_s
        self.emergency_exit_code = emergency_exit_code
        self.collective_timeout_s = collective_timeout_s
        self.resume_file = Path(
            resume_file or os.environ.get("RTJ_RESUME_FILE") or DEFAULT_RESUME_FILE
        )
        self.staging_dir = staging_dir or os.environ.get("RTJ_STAGING_DIR") or None
        self.last_save: SaveReport | None = None
        self.last_restore: RestoreReport | None = None
        self._coord: _dist.Coordinator | None = None
        self._control: _dist.Coordinator | None = None
        self._inflight: threading.Thread | None = None
        self._inflight_job: _Job | None = None
        self._error: BaseException | None = None
        self._buffers: dict[int, torch.Tensor] = {}
        self._hooked: dict[int, Any] = {}
        self._restored_once = False
        self._published: int | None = None
        self._sigterm_at: float | None = None
        self._signal_installed = False
        self._previous_handler: Any = None
        atexit.register(_drain_at_exit, weakref.ref(self))

    # ================================================================== public API

    def save(
        self,
        step: int,
        objects: Mapping[str, Any],
        *,
        blocking: bool = True,
        loss: float | torch.Tensor | None = None,
    ) -> SaveReport | None:
        """Collective. Every rank calls it after completing ``step`` steps.

        Blocking: returns once the step is published. ``blocking=False``: takes what it
        needs (RNG, small state, staging of large tensors overlapped with the next forward
        and backward, fenced before the next ``optimizer.step()``), returns, and publishes
        in the background; errors surface at the next ``save`` or ``wait``.
        """
        started = time.perf_counter()
        self.wait()
        coord = self._coordinator()
        problem = loss_problem(loss) if self.check_finite else None
        try:  # local work only: a rank that fails here must not leave the others waiting
            entries = classify(objects, self.rank_local)
            job = self._prepare(step, entries, blocking, started, problem, loss, coord)
            local_error = None
        except Exception as exc:
            local_error, failure = f"rank {coord.rank}: {type(exc).__name__}: {exc}", exc
        errors = [e for e in coord.all_gather(local_error) if e]
        if errors:
            if local_error is not None:
                raise failure
            raise CheckpointError(f"save of step {step} failed: " + "; ".join(errors))
        if self.probe is not None:
            sharded = job.extra["layout"] == "sharded"
            validation: dict[str, Any] = dict(run_probe(self.probe, entries, coord, sharded))
            validation["moments"] = optimizer_moments(entries, coord, sharded)
            job.extra["validation"] = validation
        if job.sharded:
            self._stage_sharded(job, coord)
        if blocking:
            job.staged.set()
            self._run(job, coord)
            return self.last_save
        self._stage_sync(job)
        self._install_fences(entries)
        self._inflight_job = job
        self._inflight = threading.Thread(
            target=self._background, args=(job, coord), name=f"rtj-save-{step}", daemon=True
        )
        self._inflight.start()
        job.stall += time.perf_counter() - started
        return None

    def wait(self) -> None:
        """Wait for a background save; raise its error, if it had one."""
        thread = self._inflight
        if thread is not None:
            thread.join()
            self._inflight = None
            self._inflight_job = None
        error, self._error = self._error, None
        if error is not None:
            if isinstance(error, CheckpointError):
                raise error
            raise CheckpointError(f"background save failed: {error}") from error

    def restore(self, objects: Mapping[str, Any]) -> int:
        """Collective. Restore ``objects`` and this rank's RNGs; return the step (0: fresh)."""
        started = time.perf_counter()
        self.wait()
        coord = self._coordinator()
        local_error = None
        try:
            entries = classify(objects, self.rank_local)
        except Exception as exc:
            local_error = f"rank {coord.rank}: {type(exc).__name__}: {exc}"
        decision = self._decide() if coord.rank == 0 else None
        decision = coord.broadcast(decision)
        assert isinstance(decision, dict)
        self._raise_if_any(coord, local_error, "restore failed")
        if decision.get("error"):
            raise CheckpointError(f"restore: {decision['error']}")
        skipped = tuple((int(s), str(r)) for s, r in decision["skipped"])
        if coord.rank == 0:
            for s, reason in skipped:
                log.warning("restore: skipped step %d: %s", s, reason)
        step = decision["step"]
        self._restored_once = True
        if step is None:
            self.last_restore = RestoreReport(0, "fresh", skipped, time.perf_counter() - started)
            log.info("restore: no verified checkpoint under %s; starting fresh", self.store.uri)
            return 0
        manifest = check_commit(step, decision["manifest"], decision["committed"])
        notes = self._load_and_apply(step, manifest, entries, coord)
        if self.probe is not None:
            self._validate(manifest, entries, coord)
        self._published = step
        self.last_restore = RestoreReport(
            step, decision["source"], skipped, time.perf_counter() - started, tuple(notes)
        )
        log.info(
            "restore: resumed from step %d (%s) in %.2fs",
            step,
            decision["source"],
            self.last_restore.seconds,
        )
        return int(step)

    def step_boundary(self, step: int, objects: Mapping[str, Any]) -> None:
        """Call after every completed step. Arms the SIGTERM handler on first use; when a
        SIGTERM arrived on any rank, every rank saves ``step`` (unless already published)
        within the deadline and exits with ``emergency_exit_code``."""
        self._install_sigterm()
        control = self._control_coordinator()
        if not control.any_flag(self._sigterm_at is not None):
            return
        if self._sigterm_at is None:
            self._sigterm_at = time.monotonic()
            self._arm_deadline()
        log.warning("emergency save at step %d (SIGTERM)", step)
        try:
            self.wait()
        except CheckpointError as exc:
            log.error("emergency: the background save failed: %s", exc)
        if self._published != step:
            self.save(step, objects, blocking=True)
        log.warning("emergency save of step %d published; exiting", step)
        raise SystemExit(self.emergency_exit_code)

    def close(self) -> None:
        self.wait()
        for handle in self._hooked.values():
            handle.remove()
        self._hooked.clear()
        if self._signal_installed and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._previous_handler)
            self._signal_installed = False

    # ================================================================== save internals

    def _coordinator(self) -> _dist.Coordinator:
        if self._coord is None:
            self._coord = _dist.Coordinator(self.collective_timeout_s)
        return self._coord

    def _control_coordinator(self) -> _dist.Coordinator:
        if self._control is None:
            self._coordinator()
            self._control = _dist.Coordinator(self.collective_timeout_s)
        return self._control

    def _prepare(
        self,
        step: int,
        entries: list[Entry],
        blocking: bool,
        started: float,
        problem: str | None,
        loss: float | torch.Tensor | None,
        coord: _dist.Coordinator,
    ) -> _Job:
        sharded = any(e.placement == SHARDED for e in entries)
        tensors: list[torch.Tensor] = []
        skeleton = {
            e.name: ser.flatten(state_of(e), tensors, e.name, self.allow_unsafe_pickle)
            for e in entries
            if e.placement == COMMON
        }
        rank_objects = {e.name: state_of(e) for e in entries if e.placement == RANK}
        rank_state: dict[str, Any] = {
            "rank": coord.rank,
            "world_size": coord.world,
            "rng": rng.capture(),
            "objects": rank_objects,
        }
        ser.flatten(rank_state, [], f"rank {coord.rank} state", self.allow_unsafe_pickle)
        shards = ser.plan_shards(tensors, self.shard_bytes, self.max_shards) if tensors else []
        mine = [i for i in range(len(shards)) if i % coord.world == coord.rank]
        fenced: set[int] = set()
        if not blocking:
            ptrs = optimizer_param_ptrs(entries)
            fenced = {i for s in mine for i in shards[s] if tensors[i].data_ptr() in ptrs}
        objects_meta = {e.name: {"kind": e.kind, "placement": e.placement} for e in entries}
        samplers = {e.name: e.obj.state_dict() for e in entries if e.kind == "sampler"}
        extra: dict[str, Any] = {
            "format": FORMAT,
            "layout": "sharded" if sharded else "replicated",
            "world_size": coord.world,
            "objects": objects_meta,
            "common": {"skeleton": SKELETON, "shards": [shard_path(i) for i in range(len(shards))]},
            "rank_files": "ranks/rank-{rank:05d}.pt",
            "dcp": fsdp.DCP_DIR if sharded else None,
            "loss": None if loss is None else _as_float(loss),
            "validation": None,
            "samplers": samplers,
            "rng": sorted(rank_state["rng"]),
            "topology": _topology(coord.world),
        }
        return _Job(
            step=step,
            blocking=blocking,
            started=started,
            entries=entries,
            problem=problem,
            skeleton=skeleton,
            tensors=tensors,
            shards=shards,
            mine=mine,
            fenced=fenced,
            rank_state=rank_state,
            sharded=fsdp.sharded_state(entries) if sharded else {},
            extra=extra,
        )

    def _staging_buffer(self, index: int, tensor: torch.Tensor) -> torch.Tensor:
        buf = self._buffers.get(index)
        if buf is None or buf.shape != tensor.shape or buf.dtype != tensor.dtype:
            buf = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu")
            self._buffers[index] = buf
        return buf

    def _stage_sync(self, job: _Job) -> None:
        """Copy what the training thread may change before the next optimizer step."""
        wanted = {i for s in job.mine for i in job.shards[s]}
        keep = set(wanted)
        for i in sorted(wanted - job.fenced):
            job.tensors[i] = self._staging_buffer(i, job.tensors[i]).copy_(job.tensors[i])
        for stale in set(self._buffers) - keep:
            del self._buffers[stale]
        job.rank_state = _clone_tensors(job.rank_state)

    def _stage_fenced(self, job: _Job) -> None:
        for i in sorted(job.fenced):
            job.tensors[i] = self._staging_buffer(i, job.tensors[i]).copy_(job.tensors[i])

    def _install_fences(self, entries: list[Entry]) -> None:
        fence = _make_fence(weakref.ref(self))
        for entry in entries:
            if entry.kind == "optimizer" and id(entry.obj) not in self._hooked:
                self._hooked[id(entry.obj)] = entry.obj.register_step_pre_hook(fence)

    def _background(self, job: _Job, coord: _dist.Coordinator) -> None:
        try:
            try:
                self._stage_fenced(job)
            finally:
                job.staged.set()
            self._run(job, coord)
        except BaseException as exc:
            self._error = exc
            log.error("background save of step %d failed: %s", job.step, exc)

    def _run(self, job: _Job, coord: _dist.Coordinator) -> None:
        try:
            self._run_protocol(job, coord)
        finally:
            if job.stage_dir is not None:
                shutil.rmtree(job.stage_dir, ignore_errors=True)

    def _run_protocol(self, job: _Job, coord: _dist.Coordinator) -> None:
        problem = job.problem
        if problem is None and self.check_finite:
            problem = nonfinite_problem(self._finite_candidates(job))
        problems = coord.all_gather(problem)
        refused = [f"rank {r}: {p}" for r, p in enumerate(problems) if p]
        if refused:
            raise NonFiniteStateError(
                f"save of step {job.step} refused (non-finite state): " + "; ".join(refused)
            )
        status: str | None = None
        writer: StepWriter | None = None
        if coord.rank == 0:
            try:
                writer = self._begin(job.step)
            except Exception as exc:
                status = f"rank 0 could not open step {job.step}: {exc}"
        status = coord.broadcast(status)
        if status:
            raise CheckpointError(status)
        local_error: str | None = None
        entries: list[FileEntry] = []
        try:
            if writer is None:
                writer = self.protocol.join(job.step)
            entries = self._write_files(job, writer, coord)
            if coord.rank != 0:
                writer.close()  # rank 0's writer commits; the others only contribute files
        except Exception as exc:
            log.exception("rank %d could not write its part of step %d", coord.rank, job.step)
            local_error = f"rank {coord.rank}: {type(exc).__name__}: {exc}"
        gathered = coord.gather(([e.model_dump() for e in entries], local_error))
        result: dict[str, Any] | None = None
        if coord.rank == 0:
            assert gathered is not None and writer is not None
            errors = [err for _, err in gathered if err]
            if errors:
                writer.abort()
                result = {"error": "; ".join(errors)}
            else:
                try:
                    files = [FileEntry(**d) for rows, _ in gathered for d in rows]
                    published = self.protocol.publish(writer, files, self._metadata(job))
                    result = {
                        "uri": published.uri,
                        "bytes": published.bytes,
                        "files": published.files,
                    }
                except Exception as exc:
                    with contextlib.suppress(Exception):
                        writer.abort()
                    result = {"error": f"rank 0 could not publish: {exc}"}
        result = coord.broadcast(result)
        assert isinstance(result, dict)
        if "error" in result:
            raise CheckpointError(f"save of step {job.step} failed: {result['error']}")
        self._published = job.step
        seconds = time.perf_counter() - job.started
        stall = seconds if job.blocking else job.stall
        self.last_save = SaveReport(
            job.step, job.blocking, seconds, stall, result["bytes"], result["files"], result["uri"]
        )
        log.info("saved step %d in %.2fs (%d bytes)", job.step, seconds, result["bytes"])

    def _finite_candidates(self, job: _Job) -> list[tuple[str, torch.Tensor]]:
        modules = {e.name for e in job.entries if e.kind == "module"}
        owner: dict[int, str] = {}
        for name in modules:
            if name in job.skeleton:
                _collect_refs(job.skeleton[name], name, owner)
        return [(owner[i], job.tensors[i]) for s in job.mine for i in job.shards[s] if i in owner]

    def _begin(self, step: int) -> StepWriter:
        try:
            return self.protocol.begin(step)
        except StepAlreadyPublished:
            verdict = verify_step(self.store, step, Depth.DEEP)
            if verdict.valid:
                raise
            log.warning(
                "step %d exists but does not verify (%s); replacing it", step, verdict.reason
            )
            self.store.delete_step_dir(StepDirName(step))
            return self.protocol.begin(step)

    def _write_files(
        self, job: _Job, writer: StepWriter, coord: _dist.Coordinator
    ) -> list[FileEntry]:
        entries: list[FileEntry] = []
        # The skeleton first: it is what a loader reads to find everything else.
        if coord.rank == 0:
            entries.append(ser.stream_to_store({"objects": job.skeleton}, writer, SKELETON))
        entries.append(ser.stream_to_store(job.rank_state, writer, rank_path(coord.rank)))
        if job.sharded_files:
            entries.extend(self._write_sharded(job, writer))
        pending = [(shard_path(s), {i: job.tensors[i] for i in job.shards[s]}) for s in job.mine]
        if not pending:
            return entries
        workers = min(self.io_workers, len(pending))
        writers = [writer] + [self.protocol.join(job.step) for _ in range(workers - 1)]
        lock = threading.Lock()

        def drain(w: StepWriter) -> list[FileEntry]:
            done: list[FileEntry] = []
            while True:
                with lock:
                    if not pending:
                        return done
                    path, obj = pending.pop(0)
                done.append(ser.stream_to_store(obj, w, path))

        try:
            with ThreadPoolExecutor(workers, thread_name_prefix="rtj-shard") as pool:
                for part in pool.map(drain, writers):
                    entries.extend(part)
        finally:
            for extra in writers[1:]:
                extra.close()
        return entries

    def _stage_sharded(self, job: _Job, coord: _dist.Coordinator) -> None:
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

    def _write_sharded(self, job: _Job, writer: StepWriter) -> list[FileEntry]:
        try:
            return [writer.copy_file(rel, path) for rel, path in job.sharded_files]
        finally:
            if job.stage_dir is not None:
                shutil.rmtree(job.stage_dir, ignore_errors=True)

    def _metadata(self, job: _Job) -> StepMetadata:
        layout = "fsdp" if job.extra["layout"] == "sharded" else "data_parallel"
        return StepMetadata.from_env(
            world_size=self.world_size,
            parallelism={layout: self.world_size},
            framework=_framework(),
            extra={"torch": job.extra},
        )

    # ================================================================== restore internals

    def _decide(self) -> dict[str, Any]:
        """Rank 0: which step to resume, and why the newer ones were skipped."""
        try:
            pinned = self._pinned_step()
            if pinned is not None:
                source, step, skipped = "resume-file", pinned[0], list(pinned[1])
                if step is None:
                    return {"step": None, "skipped": skipped, "source": source}
                resolution = resolve(self.store, Depth.DEEP, step=step)
                if resolution.step is None:
                    why = "; ".join(s.reason for s in resolution.skipped) or "does not verify"
                    return {
                        "error": f"{self.resume_file} pins step {step}, which does not "
                        f"verify: {why}"
                    }
            else:
                source = "resolved"
                resolution = resolve(self.store, Depth.DEEP)
                skipped = [(s.step, s.reason) for s in resolution.skipped]
                step = resolution.step
                if resolution.hint_problem:
                    log.warning("restore: %s", resolution.hint_problem)
            if step is None:
                return {"step": None, "skipped": skipped, "source": source}
            manifest = self.store.read(step_key(step, MANIFEST_FILE))
            committed = self.store.read(step_key(step, COMMITTED_FILE))
            return {
                "step": step,
                "skipped": skipped,
                "source": source,
                "manifest": manifest,
                "committed": committed,
            }
        except Exception as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}

    def _pinned_step(self) -> tuple[int | None, list[tuple[int, str]]] | None:
        """The init container's decision, valid for the pod's first incarnation only: after
        an in-pod restart (torchrun), newer steps may exist, so resolve again."""
        if self._restored_once or int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0) > 0:
            return None
        try:
            raw = self.resume_file.read_bytes()
        except FileNotFoundError:
            return None
        data = json.loads(raw)
        uri = data.get("uri")
        if uri is not None and not str(uri).startswith(self.store.uri):
            raise CheckpointError(
                f"{self.resume_file} names {uri}, which is not under this job's root "
                f"{self.store.uri}"
            )
        skipped = [(int(s["step"]), str(s["reason"])) for s in data.get("skipped", [])]
        step = data.get("step")
        return (None if step is None else int(step)), skipped

    def _local_path(self, step: int, rel: str) -> Path | None:
        if isinstance(self.store, FilesystemStore):
            return self.store.root / step_key(step, rel)
        return None

    def _read_verified(self, step: int, entry: FileEntry) -> bytes:
        data = self.store.read(step_key(step, entry.path))
        if data is None:
            raise CheckpointError(f"{entry.path} of step {step} is missing")
        if len(data) != entry.bytes or sha256_hex(data) != entry.sha256:
            raise CheckpointError(f"{entry.path} of step {step} does not match its manifest")
        return data

    def _load_file(self, step: int, manifest: Manifest, rel: str) -> Any:
        files = {f.path: f for f in manifest.files}
        if rel not in files:
            raise CheckpointError(f"step {step} has no {rel} in its manifest")
        local = self._local_path(step, rel)
        source: Path | bytes = local if local is not None else self._read_verified(step, files[rel])
        return ser.load(source, self.allow_unsafe_pickle)

    def _load_and_apply(
        self, step: int, manifest: Manifest, entries: list[Entry], coord: _dist.Coordinator
    ) -> list[str]:
        extra = manifest.extra.get("torch")
        notes: list[str] = []
        loaded: dict[str, Any] = {}
        rank_state: dict[str, Any] | None = None
        error: str | None = None
        try:
            if not isinstance(extra, dict) or extra.get("format") != FORMAT:
                raise CheckpointError(
                    f"step {step} was not written by rtj_shim.torch format {FORMAT}"
                )
            entries[:] = self._placements_from(extra, entries)
            old_world = int(extra["world_size"])
            loaded = self._load_common(step, manifest, extra, entries)
            if old_world == coord.world:
                rank_state = self._load_file(step, manifest, rank_path(coord.rank))
                if rank_state is None or rank_state.get("rank") != coord.rank:
                    raise CheckpointError(f"{rank_path(coord.rank)} belongs to another rank")
            elif any(e.placement == RANK for e in entries):
                names = [e.name for e in entries if e.placement == RANK]
                raise CheckpointError(
                    f"step {step} was saved by {old_world} ranks; the rank-local state of "
                    f"{names} cannot be mapped onto {coord.world} ranks"
                )
            else:
                notes.append(
                    f"world size changed from {old_world} to {coord.world}: per-rank RNG "
                    "state is not restored"
                )
        except Exception as exc:
            log.exception("rank %d could not load step %d", coord.rank, step)
            error = f"rank {coord.rank}: {type(exc).__name__}: {exc}"
        self._raise_if_any(coord, error, f"restore of step {step} failed")
        try:
            if any(e.placement == SHARDED for e in entries):
                self._load_sharded(step, manifest, entries, coord)
            for e in entries:
                if e.placement == COMMON:
                    apply_state(e, loaded[e.name])
                elif e.placement == RANK and rank_state is not None:
                    apply_state(e, rank_state["objects"][e.name])
                if e.kind == "sampler" and e.obj.repartitioned:
                    notes.append(e.obj.repartitioned)
            if rank_state is not None:
                rng.restore(rank_state["rng"])
        except Exception as exc:
            log.exception("rank %d could not apply step %d", coord.rank, step)
            error = f"rank {coord.rank}: {type(exc).__name__}: {exc}"
        self._raise_if_any(coord, error, f"restore of step {step} failed")
        for note in notes:
            log.warning("restore: %s", note)
        return notes

    def _placements_from(self, extra: dict[str, Any], entries: list[Entry]) -> list[Entry]:
        saved: dict[str, Any] = extra.get("objects", {})
        missing = [e.name for e in entries if e.name not in saved]
        if missing:
            raise CheckpointError(f"the checkpoint has no state for {missing}")
        out = []
        for e in entries:
            placement = saved[e.name]["placement"]
            if e.placement == SHARDED and placement != SHARDED:
                raise CheckpointError(
                    f"{e.name!r} is sharded now but was saved replicated; loading a "
                    "replicated checkpoint into a sharded module is not supported"
                )
            out.append(dataclasses.replace(e, placement=placement))
        return out

    def _load_common(
        self, step: int, manifest: Manifest, extra: dict[str, Any], entries: list[Entry]
    ) -> dict[str, Any]:
        names = [e.name for e in entries if e.placement == COMMON]
        if not names:
            return {}
        skeleton = self._load_file(step, manifest, extra["common"]["skeleton"])["objects"]
        shard_files: list[str] = extra["common"]["shards"]
        tensors: dict[int, torch.Tensor] = {}
        workers = max(1, min(self.io_workers, len(shard_files)))
        with ThreadPoolExecutor(workers, thread_name_prefix="rtj-load") as pool:
            for part in pool.map(lambda p: self._load_file(step, manifest, p), shard_files):
                tensors.update(part)
        return {name: ser.unflatten(skeleton[name], tensors) for name in names}

    def _load_sharded(
        self, step: int, manifest: Manifest, entries: list[Entry], coord: _dist.Coordinator
    ) -> None:
        local = self._local_path(step, fsdp.DCP_DIR)
        if local is not None:
            fsdp.load_into(entries, local, coord.group)
            return
        stage = Path(tempfile.mkdtemp(prefix=f"rtj-dcp-load-{step}-", dir=self.staging_dir))
        try:
            for entry in manifest.files:
                if entry.path.startswith(f"{fsdp.DCP_DIR}/"):
                    target = stage / entry.path
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(self._read_verified(step, entry))
            fsdp.load_into(entries, stage / fsdp.DCP_DIR, coord.group)
        finally:
            shutil.rmtree(stage, ignore_errors=True)

    def _validate(self, manifest: Manifest, entries: list[Entry], coord: _dist.Coordinator) -> None:
        extra = manifest.extra.get("torch") or {}
        recorded = extra.get("validation")
        if not recorded or self.probe is None:
            log.warning("restore: the checkpoint has no validation record; probe skipped")
            return
        sharded = extra.get("layout") == "sharded"
        observed: dict[str, Any] = dict(run_probe(self.probe, entries, coord, sharded))
        observed["moments"] = optimizer_moments(entries, coord, sharded and coord.world > 1)
        problems = compare(recorded, observed, self.probe_rtol, self.probe_atol)
        if problems:
            raise RestoreValidationError(
                f"restored step {manifest.step} does not reproduce its recorded state: "
                + "; ".join(problems)
            )
        log.info("restore: validation probe agrees (loss %.6g)", observed["loss"])

    @staticmethod
    def _raise_if_any(coord: _dist.Coordinator, error: str | None, what: str) -> None:
        errors = [e for e in coord.all_gather(error) if e]
        if errors:
            raise CheckpointError(f"{what}: " + "; ".join(errors))

    # ================================================================== SIGTERM

    def _install_sigterm(self) -> None:
        if self._signal_installed or threading.current_thread() is not threading.main_thread():
            return
        self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)
        self._signal_installed = True

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        if self._sigterm_at is not None:
            return
        self._sigterm_at = time.monotonic()
        sys.stderr.write(
            f"rtj_shim.torch: SIGTERM on rank {self.rank}: emergency save at the next step "
            f"boundary, deadline {self.emergency_deadline_s:.0f}s\n"
        )
        self._arm_deadline()

    def _arm_deadline(self) -> None:
        def expire() -> None:
            sys.stderr.write(
                f"rtj_shim.torch: emergency deadline of {self.emergency_deadline_s:.0f}s "
                f"passed on rank {self.rank}; exiting without publishing a partial step\n"
            )
            sys.stderr.flush()
            os._exit(self.emergency_exit_code)

        timer = threading.Timer(self.emergency_deadline_s, expire)
        timer.daemon = True
        timer.start()


# ====================================================================== helpers


def _make_fence(ref: weakref.ReferenceType[Checkpointer]) -> Any:
    """Optimizer pre-step hook: wait until a background save has staged the parameters."""

    def fence(_opt: Any, _args: Any, _kwargs: Any) -> None:
        me = ref()
        job = None if me is None else me._inflight_job
        if job is not None and not job.staged.is_set():
            t0 = time.perf_counter()
            job.staged.wait()
            job.stall += time.perf_counter() - t0

    return fence


def _drain_at_exit(ref: weakref.ReferenceType[Checkpointer]) -> None:
    me = ref()
    thread = None if me is None else me._inflight
    if thread is not None and thread.is_alive():
        log.warning("waiting for the background save before exiting")
        thread.join()


def _as_float(value: float | torch.Tensor) -> float:
    return float(value.detach()) if isinstance(value, torch.Tensor) else float(value)


def _clone_tensors(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        out = type(value)((k, _clone_tensors(v)) for k, v in value.items())
        if hasattr(value, "_metadata"):
            setattr(out, "_metadata", value._metadata)  # noqa: B010
        return out
    if isinstance(value, list):
        return [_clone_tensors(v) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_clone_tensors(v) for v in value)
    return value


def _collect_refs(skeleton: Any, where: str, out: dict[int, str]) -> None:
    if isinstance(skeleton, Mapping):
        if len(skeleton) == 1 and ser.TENSOR_REF in skeleton:
            out[int(skeleton[ser.TENSOR_REF])] = where
            return
        for k, v in skeleton.items():
            _collect_refs(v, f"{where}.{k}", out)
    elif isinstance(skeleton, list | tuple):
        for i, v in enumerate(skeleton):
            _collect_refs(v, f"{where}[{i}]", out)


def _framework() -> Framework:
    components = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "rtj_shim": getattr(rtj_shim, "__version__", "unknown"),
    }
    cuda = torch.version.cuda
    if cuda:
        components["cuda"] = str(cuda)
    if _dist.is_distributed():
        components["backend"] = str(torch.distributed.get_backend())
    return Framework(name="pytorch", version=torch.__version__, components=components)


def _topology(world: int) -> dict[str, Any]:
    env = os.environ
    return {
        "world_size": world,
        "local_world_size": int(env.get("LOCAL_WORLD_SIZE") or 1),
        "nnodes": max(1, world // max(1, int(env.get("LOCAL_WORLD_SIZE") or world or 1))),
        "backend": str(torch.distributed.get_backend()) if _dist.is_distributed() else None,
    }
