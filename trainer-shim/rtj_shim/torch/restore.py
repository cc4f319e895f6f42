"""Restore: which step to resume, loading every rank's part of it, applying it.

Rank 0 takes the resume decision (:func:`durable_resume`: the init container's ``resume.json`` in
the pod's first incarnation or, failing that, deep resolution of the newest verified
step) and the Checkpointer broadcasts it with the manifest. Every rank then loads its part
(:class:`StepLoader`) and reports; a rank that cannot load fails the restore on every
rank, and state is applied only after every rank has loaded. With a probe,
:func:`validate_restored` checks that the restored state reproduces its recorded loss,
gradient norm and optimizer moments.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from rtj_shim.alignment import LOSS_ALIGNMENT, AlignmentError, Reference
from rtj_shim.checkpoint.layout import COMMITTED_FILE, MANIFEST_FILE, step_key
from rtj_shim.checkpoint.manifest import FileEntry, Manifest, sha256_hex
from rtj_shim.checkpoint.resolver import resolve
from rtj_shim.checkpoint.storage import CheckpointStore
from rtj_shim.checkpoint.storage.filesystem import FilesystemStore
from rtj_shim.checkpoint.storage.throttle import unwrapped
from rtj_shim.checkpoint.verification import Depth
from rtj_shim.errors import StoreError
from rtj_shim.torch import _dist, fast_save, fsdp, rng
from rtj_shim.torch import serialization as ser
from rtj_shim.torch.capture import FORMAT, rank_path
from rtj_shim.torch.outcomes import CheckpointError, raise_if_any
from rtj_shim.torch.state import COMMON, RANK, SHARDED, STRICT_KINDS, Entry, apply_state
from rtj_shim.torch.validation import (
    Probe,
    RestoreValidationError,
    compare,
    optimizer_moments,
    run_probe,
)
from rtj_shim.wire import misaligned_resume, rejected_step
from rtj_shim.wire.misaligned_resume import MisalignedRanks
from rtj_shim.wire.rejected_step import RejectedStep
from rtj_shim.wire.resume_pin import pinned_step
from rtj_shim.wire.suspect_verdict import SUFFIX as SUSPECT_SUFFIX
from rtj_shim.wire.suspect_verdict import SuspectVerdict

log = logging.getLogger("rtj_shim.torch")


# ====================================================================== the decision


def durable_resume(
    store: CheckpointStore, resume_file: Path, restored_once: bool
) -> dict[str, Any]:
    """Rank 0: which step to resume, and why the newer ones were skipped."""
    try:
        pinned = pinned_step(store, resume_file, restored_once)
        if pinned is not None:
            source, step, skipped = "resume-file", pinned[0], list(pinned[1])
            if step is None:
                return {"step": None, "skipped": skipped, "source": source}
            resolution = resolve(store, pinned[2], step=step)
            if resolution.step is None:
                why = "; ".join(s.reason for s in resolution.skipped) or "does not verify"
                reject(resume_file, step, why)
                return {"error": f"{resume_file} pins step {step}, which does not verify: {why}"}
        else:
            source = "resolved"
            resolution = resolve(store, Depth.DEEP)
            skipped = [(s.step, s.reason) for s in resolution.skipped]
            step = resolution.step
            if resolution.hint_problem:
                log.warning("restore: %s", resolution.hint_problem)
        if step is None:
            return {"step": None, "skipped": skipped, "source": source}
        manifest = store.read(step_key(step, MANIFEST_FILE))
        committed = store.read(step_key(step, COMMITTED_FILE))
        return {
            "step": step,
            "skipped": skipped,
            "source": source,
            "manifest": manifest,
            "committed": committed,
        }
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def reject(resume_file: Path, step: int, why: str) -> None:
    """Leave the verdict on a pinned step that does not verify beside the resume file
    (``<resume file>.rejected``): an in-place restart's supervisor reports it, so the
    operator marks the step bad instead of pinning it again. Best effort."""
    target = resume_file.with_name(resume_file.name + REJECTED_SUFFIX)
    try:
        target.write_text(json.dumps(RejectedStep(step, why).encode()))
    except OSError as exc:
        log.warning("restore: could not record the rejected step at %s: %s", target, exc)


REJECTED_SUFFIX = rejected_step.SUFFIX


def record_suspect(resume_file: Path, verdict: SuspectVerdict) -> None:
    """Leave the trainers' suspect-state verdict beside the resume file (``<resume
    file>.suspect``): an in-place restart's supervisor reports it, so the operator restarts
    the world away from the suspect pods' nodes. Best effort (the exception carries it too)."""
    target = resume_file.with_name(resume_file.name + SUSPECT_SUFFIX)
    try:
        target.write_text(json.dumps(verdict.encode()))
    except OSError as exc:
        log.warning("could not record the suspect-state verdict at %s: %s", target, exc)


def record_misaligned(resume_file: Path, found: MisalignedRanks) -> None:
    """Leave the data alignment check's finding beside the resume file (``<resume
    file>.misaligned``, `rtj_shim.wire.misaligned_resume`). Best effort."""
    target = resume_file.with_name(resume_file.name + misaligned_resume.SUFFIX)
    try:
        target.write_text(json.dumps(found.encode()))
    except OSError as exc:
        log.warning("could not record the data alignment finding at %s: %s", target, exc)


def saved_reference(extra: Mapping[str, Any], step: int) -> Reference | None:
    """The loss alignment reference a manifest recorded (``extra.torch.loss_alignment``);
    None when it has none (an older writer, no losses given). A bad one is no reason to
    refuse the step: it is reported and the check skipped."""
    torch_extra = extra.get("torch")
    body = torch_extra.get(LOSS_ALIGNMENT) if isinstance(torch_extra, Mapping) else None
    if body is None:
        return None
    try:
        return Reference.parse(body)
    except AlignmentError as exc:
        log.warning("step %d: no data alignment check after this resume: %s", step, exc)
        return None


def claim_problem(claim: Callable[[], object] | None) -> str | None:
    """Rank 0 at a restore: claim the durable root for this attempt (``CommitProtocol.
    claim_run``) before the first step trains, so a rank of an older world (a partitioned
    node's, a process woken from SIGSTOP) is refused from its next commit on, not only from
    this attempt's first save. Refused (a newer attempt owns the root, or another run
    does): the problem, and this world must not train. A store that cannot be written (a
    read-only root restored for evaluation) only warns: the first save claims it."""
    if claim is None:
        return None
    try:
        claim()
    except StoreError as exc:
        log.warning("restore: could not claim the run before training (%s); the first "
                    "save claims it", exc)  # fmt: skip
    except Exception as exc:  # refused, or unforeseen: every rank must hear it, not hang
        return f"{type(exc).__name__}: {exc}"
    return None


class ResumeSources:
    """Where a restore reads from: the durable store, or this rank's fast tier
    (:mod:`rtj_shim.torch.fast_save`) when the resume file pins a fast step every rank
    verified there. ``claim``: claims the durable root for this attempt (rank 0, at every
    decision: `claim_problem`)."""

    def __init__(
        self,
        store: CheckpointStore,
        fast: fast_save.FastTier | None,
        resume_file: Path,
        *,
        allow_unsafe_pickle: bool,
        io_workers: int,
        staging_dir: str | os.PathLike[str] | None,
        claim: Callable[[], object] | None = None,
    ) -> None:
        self.fast = fast
        self.resume_file = resume_file
        self.claim = claim

        def loader(of: CheckpointStore) -> StepLoader:
            return StepLoader(
                of, allow_unsafe_pickle=allow_unsafe_pickle, io_workers=io_workers,
                staging_dir=staging_dir,
            )  # fmt: skip

        self.durable = loader(store)
        self.fast_loader = None if fast is None else loader(fast.store)

    def resume_decision(self, coord: _dist.Coordinator, restored_once: bool) -> dict[str, Any]:
        """Collective: every rank's own decision from the fast tier, or rank 0's from the
        durable store with the fast step skipped and why (every rank gets it)."""
        fast, skipped = fast_save.fast_resume(self.fast, self.resume_file, restored_once, coord)
        if fast is not None:
            problem = coord.broadcast(claim_problem(self.claim) if coord.rank == 0 else None)
            return fast if problem is None else {"error": f"claiming the run: {problem}"}
        decision = None
        if coord.rank == 0:
            decision = durable_resume(self.durable.store, self.resume_file, restored_once)
            if skipped and "skipped" in decision:
                decision["skipped"] = [*skipped, *decision["skipped"]]
            if "error" not in decision and (problem := claim_problem(self.claim)):
                decision = {"error": f"claiming the run: {problem}"}
        decision = coord.broadcast(decision)
        assert isinstance(decision, dict)
        return decision

    def loader_for(self, decision: dict[str, Any]) -> StepLoader:
        if decision.get("tier") == "fast" and self.fast_loader is not None:
            return self.fast_loader
        return self.durable


# ====================================================================== loading


@dataclasses.dataclass(frozen=True)
class Applied:
    notes: tuple[str, ...]
    values: dict[str, Any]  # plain values by name: what the caller's mapping holds now
    missing: tuple[str, ...] = ()  # passed, but not restored (strict=False)
    unused: tuple[str, ...] = ()  # in the checkpoint, but not passed


class StepLoader:
    """Loads one rank's part of a verified step and applies it to the live objects."""

    def __init__(
        self,
        store: CheckpointStore,
        *,
        allow_unsafe_pickle: bool,
        io_workers: int,
        staging_dir: str | os.PathLike[str] | None,
    ) -> None:
        self.store = store
        self.allow_unsafe_pickle = allow_unsafe_pickle
        self.io_workers = io_workers
        self.staging_dir = staging_dir

    def load_and_apply(
        self,
        step: int,
        manifest: Manifest,
        entries: list[Entry],
        coord: _dist.Coordinator,
        *,
        strict: bool = True,
    ) -> Applied:
        """Collective: load, agree that every rank loaded, apply; return what to report and
        the restored plain values (which go back into the caller's mapping).

        ``strict=False``: an object the step has no state for (added to the code after it
        was written), or a rank-local one saved on another world size, keeps its current
        state, and the report says so; otherwise either fails the restore."""
        extra = manifest.extra.get("torch")
        notes: list[str] = []
        values: dict[str, Any] = {}
        missing: list[str] = []
        unused: list[str] = []
        loaded: dict[str, Any] = {}
        rank_state: dict[str, Any] | None = None
        plain = {e.name for e in entries if e.kind == "value"}
        error: str | None = None
        try:
            if not isinstance(extra, dict) or extra.get("format") != FORMAT:
                raise CheckpointError(
                    f"step {step} was not written by rtj_shim.torch format {FORMAT}"
                )
            saved: dict[str, Any] = extra.get("objects", {})
            unused = sorted(set(saved) - {e.name for e in entries})
            missing = [e.name for e in entries if e.name not in saved]
            if missing and strict:
                raise CheckpointError(
                    f"the checkpoint has no state for {missing} (restore(..., strict=False) "
                    "leaves objects added since it was written as they are)"
                )
            entries[:] = placements_from(saved, [e for e in entries if e.name in saved])
            old_world = int(extra["world_size"])
            loaded = self._load_common(step, manifest, extra, entries)
            if old_world == coord.world:
                rank_state = ser.unflatten(
                    self.load_file(step, manifest, rank_path(coord.rank)), {}
                )
                if not isinstance(rank_state, dict) or rank_state.get("rank") != coord.rank:
                    raise CheckpointError(f"{rank_path(coord.rank)} belongs to another rank")
            elif any(e.placement == RANK for e in entries):
                names = [e.name for e in entries if e.placement == RANK]
                if strict:
                    raise CheckpointError(
                        f"step {step} was saved by {old_world} ranks; the rank-local state of "
                        f"{names} cannot be mapped onto {coord.world} ranks (save them "
                        "replicated=, or restore(..., strict=False) to leave them as they are)"
                    )
                missing.extend(names)
                entries[:] = [e for e in entries if e.placement != RANK]
            if old_world != coord.world:
                notes.append(
                    f"world size changed from {old_world} to {coord.world}: per-rank RNG "
                    "state is not restored"
                )
        except Exception as exc:
            log.exception("rank %d could not load step %d", coord.rank, step)
            error = f"rank {coord.rank}: {type(exc).__name__}: {exc}"
        raise_if_any(coord, error, f"restore of step {step} failed")
        try:
            if any(e.placement == SHARDED for e in entries):
                self._load_sharded(step, manifest, entries, coord)
            for e in entries:
                if e.placement == COMMON:
                    values[e.name] = apply_state(e, loaded[e.name])
                elif e.placement == RANK and rank_state is not None:
                    values[e.name] = apply_state(e, rank_state["objects"][e.name])
                if e.kind == "sampler" and e.obj.repartitioned:
                    notes.append(e.obj.repartitioned)
            if rank_state is not None:
                rng.restore(rank_state["rng"])
        except Exception as exc:
            log.exception("rank %d could not apply step %d", coord.rank, step)
            error = f"rank {coord.rank}: {type(exc).__name__}: {exc}"
        raise_if_any(coord, error, f"restore of step {step} failed")
        for note in notes:
            log.warning("restore: %s", note)
        return Applied(
            tuple(notes),
            {k: v for k, v in values.items() if k in plain},
            tuple(missing),
            tuple(unused),
        )

    def _local_path(self, step: int, rel: str) -> Path | None:
        store = unwrapped(self.store)  # paced writes, not reads
        if isinstance(store, FilesystemStore):
            return store.root / step_key(step, rel)
        return None

    def _read_verified(self, step: int, entry: FileEntry) -> bytes:
        data = self.store.read(step_key(step, entry.path))
        if data is None:
            raise CheckpointError(f"{entry.path} of step {step} is missing")
        if len(data) != entry.bytes or sha256_hex(data) != entry.sha256:
            raise CheckpointError(f"{entry.path} of step {step} does not match its manifest")
        return data

    def load_file(self, step: int, manifest: Manifest, rel: str) -> Any:
        files = {f.path: f for f in manifest.files}
        if rel not in files:
            raise CheckpointError(f"step {step} has no {rel} in its manifest")
        local = self._local_path(step, rel)
        source: Path | bytes = local if local is not None else self._read_verified(step, files[rel])
        return ser.load(source, self.allow_unsafe_pickle)

    def _load_common(
        self, step: int, manifest: Manifest, extra: dict[str, Any], entries: list[Entry]
    ) -> dict[str, Any]:
        names = [e.name for e in entries if e.placement == COMMON]
        if not names:
            return {}
        skeleton = self.load_file(step, manifest, extra["common"]["skeleton"])["objects"]
        shard_files: list[str] = extra["common"]["shards"]
        tensors: dict[int, torch.Tensor] = {}
        workers = max(1, min(self.io_workers, len(shard_files)))
        with ThreadPoolExecutor(workers, thread_name_prefix="rtj-load") as pool:
            for part in pool.map(lambda p: self.load_file(step, manifest, p), shard_files):
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


def placements_from(saved: dict[str, Any], entries: list[Entry]) -> list[Entry]:
    """Entries placed as the checkpoint saved them; a kind that cannot take the saved
    state (a plain value saved where a Stateful object is now, ...) fails."""
    out = []
    for e in entries:
        placement, kind = saved[e.name]["placement"], saved[e.name]["kind"]
        if e.placement == SHARDED and placement != SHARDED:
            raise CheckpointError(
                f"{e.name!r} is sharded now but was saved replicated; loading a "
                "replicated checkpoint into a sharded module is not supported"
            )
        if kind != e.kind and STRICT_KINDS & {kind, e.kind}:
            raise CheckpointError(f"{e.name!r} was saved as a {kind} and is a {e.kind} now")
        out.append(dataclasses.replace(e, placement=placement))
    return out


# ====================================================================== validation


def validate_restored(
    probe: Probe | None,
    manifest: Manifest,
    entries: list[Entry],
    coord: _dist.Coordinator,
    *,
    rtol: float,
    atol: float,
) -> None:
    """Collective: run the probe again and compare with what the save recorded."""
    extra = manifest.extra.get("torch") or {}
    recorded = extra.get("validation")
    if not recorded or probe is None:
        log.warning("restore: the checkpoint has no validation record; probe skipped")
        return
    sharded = extra.get("layout") == "sharded"
    observed: dict[str, Any] = dict(run_probe(probe, entries, coord, sharded))
    observed["moments"] = optimizer_moments(entries, coord, sharded and coord.world > 1)
    problems = compare(recorded, observed, rtol, atol)
    if problems:
        raise RestoreValidationError(
            f"restored step {manifest.step} does not reproduce its recorded state: "
            + "; ".join(problems)
        )
    log.info("restore: validation probe agrees (loss %.6g)", observed["loss"])
