"""The fast tier for the torch Checkpointer: each rank's own step in pod-local memory, and
the collective decision to resume from it (layout and rules: :mod:`rtj_shim.fast.fast_tier`).

A fast save is local and staged like a background durable save: the rank captures the
same state, copies what the next forward and backward may change into its own reused host
buffers, and a writer thread copies the optimizer-owned tensors while they run (a fence
holds the next ``optimizer.step()`` until it has), then writes the replicated part
(skeleton and every shard) and the rank's own file into the rank's directory under the
commit protocol and publishes it there. No collective, no other pod's storage. A step
being written when the next is due is skipped, not waited for.

A fast restore is collective: rank 0 reads the step the resume file pins (``fast_step``,
written by the in-place restart's supervisor), every rank hashes that step in its own
directory, and only when every rank verified it does any rank load it (each from its own
directory, with its own manifest). Otherwise the restore goes on with the durable tier and
the report names the fast step and why it was skipped.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rtj_shim import progress
from rtj_shim.alignment import LOSS_ALIGNMENT
from rtj_shim.checkpoint import lineage as lineage_mod
from rtj_shim.checkpoint.layout import COMMITTED_FILE, MANIFEST_FILE, step_key
from rtj_shim.checkpoint.manifest import decode_manifest, sha256_hex
from rtj_shim.checkpoint.protocol import CommitProtocol
from rtj_shim.checkpoint.retention import RetentionPolicy
from rtj_shim.checkpoint.storage.filesystem import FilesystemStore
from rtj_shim.checkpoint.verification import Depth
from rtj_shim.checkpoint.verifier import verify_step
from rtj_shim.fast import fast_tier
from rtj_shim.fast.fast_tier import FastTierConfig, rank_store
from rtj_shim.torch import _dist
from rtj_shim.torch import serialization as ser
from rtj_shim.torch.capture import (
    SKELETON,
    Reading,
    SaveJob,
    capture,
    finite_candidates,
    rank_path,
    read_state,
    shard_path,
    step_metadata,
)
from rtj_shim.torch.staging import Staging, mark_staged
from rtj_shim.torch.state import SHARDED, Entry
from rtj_shim.torch.validation import nonfinite_problem
from rtj_shim.wire.resume_file import ResumeFile, ResumeFileError
from rtj_shim.wire.save_costs import SaveTier

log = logging.getLogger("rtj_shim.torch")

SOURCE = "fast-tier"


@dataclass
class Pending:
    """A fast save between its boundary and its writer thread: the state as read there
    (what may change before the next ``optimizer.step()`` already copied), the fence's
    event, and the training thread's stall so far (the fence's waits add to it)."""

    step: int
    entries: list[Entry]
    reading: Reading
    started: float
    coord: _dist.Coordinator  # its rank and world only (no collective off the training thread)
    stall: float = 0.0
    staged: threading.Event = field(default_factory=threading.Event)
    loss_alignment: dict[str, Any] | None = None  # the reference at the boundary


@dataclass(frozen=True)
class FastSaveReport:
    step: int
    stall: float  # the training thread's: capture and the copy into host memory
    seconds: float  # until published: the writer thread's serialization, hashing, publish
    bytes: int
    uri: str


class FastTier:
    """One rank's fast tier: saves into ``<dir>/rank-NNNNN`` and verifies from it."""

    def __init__(
        self,
        config: FastTierConfig,
        *,
        rank: int,
        attempt: str,
        allow_unsafe_pickle: bool,
        shard_bytes: int,
        max_shards: int,
    ) -> None:
        self.config = config
        self.rank = rank
        self.store: FilesystemStore = rank_store(config.directory, rank)
        self.protocol = CommitProtocol(
            self.store, attempt=attempt, retention=RetentionPolicy(keep_last=config.keep)
        )
        self.allow_unsafe_pickle = allow_unsafe_pickle
        self.shard_bytes = shard_bytes
        self.max_shards = max_shards
        self.last: FastSaveReport | None = None
        self.failures = 0
        self.skipped = 0  # fast steps not taken: the previous one was still being written
        # one long-lived writer thread (starting a thread per save cost the training thread
        # up to a millisecond, waiting for it to run); idle while no fast step is written
        self._writer: threading.Thread | None = None
        self._jobs: queue.SimpleQueue[Pending | None] = queue.SimpleQueue()
        self._idle = threading.Event()
        self._idle.set()
        self._staging = Staging(None, check_finite=False)  # its own buffers and fences
        self._writing: int | None = None
        # the Checkpointer's durable schedule, recorded in every fast manifest: the drain
        # leaves the steps the trainers publish themselves to them (rtj_shim.fast.drain)
        self.durable_schedule: dict[str, Any] = {}
        # the ranks' loss levels as of the boundary (rtj_shim.alignment), set by the
        # Checkpointer before each save: a restore checks the ranks' data against it
        self.loss_alignment: dict[str, Any] | None = None
        self._adopted = False  # whether this rank's directory was made one history (adopt)

    def save(
        self,
        step: int,
        entries: list[Entry],
        coord: _dist.Coordinator,
        started: float,
    ) -> None:
        """Take this rank's copy of ``step`` and write it in the background, staged as a
        background durable save is (:mod:`rtj_shim.torch.staging`, its own reused buffers):
        the training thread captures the state and copies what the next forward and backward
        may change; the writer thread copies the optimizer-owned tensors while they run (a
        fence holds the next ``optimizer.step()`` until it has), then serializes, hashes and
        publishes. While the previous fast step is still being written this one is skipped
        (counted), never waited for. A failure is logged, never raised: the durable tier is
        untouched and the next fast step tries again. `started`: when the caller began the
        save (its reading of the objects counts in the stall)."""
        if not self._adopted:  # never restored: a fresh history, whatever the directory holds
            self.adopt(fresh_lineage(), None, None)
        if not self._idle.is_set():
            self.skipped += 1
            log.debug("rank %d: fast-tier step %d skipped (step %s still writing)",
                      self.rank, step, self._writing)  # fmt: skip
            return
        try:
            if any(e.placement == SHARDED for e in entries):
                raise ValueError(
                    "sharded (FSDP) state is not kept in the fast tier yet; durable only"
                )
            reading = read_state(entries, coord, self.allow_unsafe_pickle, clone_rank_objects=True)
            self._staging.freeze(reading, entries, self.allow_unsafe_pickle)
        except Exception as exc:
            self.failures += 1
            log.warning("rank %d: fast-tier save of step %d failed: %s", self.rank, step, exc)
            return
        pending = Pending(step, entries, reading, started, coord)
        pending.loss_alignment = self.loss_alignment
        self._staging.install_fences(entries)
        self._staging.inflight = pending
        pending.stall = time.perf_counter() - started
        self._writing = step
        self._idle.clear()
        if self._writer is None or not self._writer.is_alive():
            self._writer = threading.Thread(target=self._run, name="rtj-fast-writer", daemon=True)
            self._writer.start()
        self._jobs.put(pending)

    def _run(self) -> None:
        while (item := self._jobs.get()) is not None:
            try:
                self._write(item)
            finally:
                self._idle.set()

    def _plan(self, pending: Pending) -> SaveJob:
        """Writer thread, while the fence holds the next ``optimizer.step()``: the files of
        the state read at the boundary, every tensor copied into the staging buffers."""
        try:
            job = capture(
                pending.step, pending.entries, pending.coord, blocking=False,
                started=pending.started, problem=None, loss=None,
                allow_unsafe_pickle=self.allow_unsafe_pickle,
                shard_bytes=self.shard_bytes, max_shards=self.max_shards,
                every_shard=True, reading=pending.reading,  # this rank keeps them all
            )  # fmt: skip
            job.staged = pending.staged
            self._staging.stage_unfenced(job, rank_state=False)  # read_state() cloned it
            self._staging.stage_fenced(job)
        finally:
            mark_staged(pending)
        return job

    def _write(self, pending: Pending) -> None:
        try:
            job = self._plan(pending)
            problem = nonfinite_problem(finite_candidates(job))
            if problem is not None:
                raise ValueError(f"non-finite state, not kept: {problem}")
            writer = self.protocol.begin(job.step)
            try:
                files = [ser.stream_to_store({"objects": job.skeleton}, writer, SKELETON)]
                for n in job.mine:
                    part = {i: job.tensors[i] for i in job.shards[n]}
                    files.append(ser.stream_to_store(part, writer, shard_path(n)))
                files.append(
                    ser.stream_to_store(job.rank_state, writer, rank_path(pending.coord.rank))
                )
                metadata = step_metadata(job, pending.coord.world)
                metadata.extra["tier"] = "fast"
                metadata.extra["durable_schedule"] = dict(self.durable_schedule)
                if pending.loss_alignment is not None:
                    metadata.extra["torch"][LOSS_ALIGNMENT] = pending.loss_alignment
                published = self.protocol.publish(writer, files, metadata)
            except BaseException:
                writer.abort()
                raise
        except Exception as exc:
            self.failures += 1
            log.warning("rank %d: fast-tier save of step %d failed: %s",
                        self.rank, pending.step, exc)  # fmt: skip
            return
        seconds = time.perf_counter() - pending.started
        # the training thread's: the boundary's reading, and the fence's wait if the next
        # optimizer.step() came before the writer had copied the optimizer-owned tensors
        stall = pending.stall
        self.last = FastSaveReport(pending.step, stall, seconds, published.bytes, published.uri)
        progress.current().note_save(SaveTier.FAST, stall)
        log.debug("rank %d: fast-tier step %d: %.4fs stall, %.4fs in all",
                  self.rank, pending.step, stall, seconds)  # fmt: skip

    @property
    def busy(self) -> bool:
        """A fast step is being written."""
        return not self._idle.is_set()

    def wait(self) -> None:
        """Until the fast step being written is published (or failed)."""
        self._idle.wait()

    def close(self) -> None:
        self.wait()
        if self._writer is not None:
            self._jobs.put(None)
            self._writer.join()
            self._writer = None
        self._staging.remove_fences()

    def adopt(self, lineage: str, parent: str | None, restored: int | None) -> list[int]:
        """Continue history `lineage`, which resumed from step `restored` of history
        `parent` (None, None: a fresh start): every fast step of this rank's directory
        newer than `restored` is of a future this world does not continue, and one of
        another history than `parent` is not this world's; both are deleted before the
        first fast save, so saving their numbers again neither collides nor mixes. The
        steps deleted, oldest first."""
        self.protocol.lineage = lineage
        self._adopted = True
        gone = []
        for held in reversed(fast_tier.committed_held(self.store)):
            mine = held.lineage == parent and restored is not None and held.step <= restored
            if not mine:
                gone.append(held.step)
        for entry in self.store.list_step_dirs():
            if entry.name.step in gone and not entry.name.in_progress:
                self.store.delete_step_dir(entry.name)
        if gone:
            log.info("rank %d: fast-tier steps %s of another history deleted (lineage %s)",
                     self.rank, gone, lineage)  # fmt: skip
        return gone

    def lineage_of(self, step: int) -> str:
        """The lineage this rank's copy of ``step`` records (LEGACY when none or unreadable)."""
        return next((h.lineage for h in fast_tier.committed_held(self.store) if h.step == step),
                    lineage_mod.LEGACY)  # fmt: skip

    def problem(self, step: int) -> str | None:
        """Why this rank cannot resume ``step`` from its fast tier (None: it can)."""
        try:
            verdict = verify_step(self.store, step, Depth.DEEP)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        if not verdict.valid:
            return verdict.reason
        extra = verdict.manifest.extra if verdict.manifest is not None else {}
        if extra.get("tier") != "fast":
            return "not a fast-tier step"
        return None

    def decision(self, step: int) -> dict[str, Any]:
        """This rank's restore decision for a verified fast step (its own manifest)."""
        return {
            "step": step,
            "skipped": [],
            "source": SOURCE,
            "tier": "fast",
            "manifest": self.store.read(step_key(step, MANIFEST_FILE)),
            "committed": self.store.read(step_key(step, COMMITTED_FILE)),
        }


def fresh_lineage() -> str:
    """The lineage of a run that starts from nothing (every rank computes the same)."""
    return lineage_mod.derive(None, None, lineage_mod.FRESH, os.environ.get("RTJ_RUN_ID", ""))


def continue_history(
    protocol: CommitProtocol, tier: FastTier | None, decision: dict[str, Any]
) -> str:
    """After a restore decision every rank shares: the lineage the steps this world
    publishes carry from now on (durable and fast), and this rank's fast directory made
    that one history (:meth:`FastTier.adopt`). Derived from the restored step's lineage,
    its number and its origin (the durable manifest's digest, or "fast" for a fast step,
    whose manifest differs from rank to rank), so every rank computes the same id."""
    step = decision.get("step")
    if step is None:
        parent, new = None, fresh_lineage()
    else:
        raw = decision["manifest"]
        parent = lineage_mod.of(decode_manifest(raw).lineage)
        fast = decision.get("tier") == "fast"
        origin = lineage_mod.FAST_ORIGIN if fast else sha256_hex(raw)
        new = lineage_mod.derive(parent, int(step), origin, os.environ.get("RTJ_RUN_ID", ""))
    protocol.lineage = new
    if tier is not None:
        tier.adopt(new, parent, None if step is None else int(step))
    return new


def pinned_fast_step(resume_file: Path, restored_once: bool) -> tuple[int, str | None] | None:
    """The fast step the resume file pins, and its lineage when the pin names one
    (``fast_lineage``); first incarnation only, like its ``step``."""
    if restored_once or int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0) > 0:
        return None
    try:
        pin = ResumeFile.parse(resume_file.read_bytes())
    except (FileNotFoundError, ResumeFileError):  # the durable restore reports a bad file
        return None
    return None if pin.fast_step is None else (pin.fast_step, pin.fast_lineage)


def fast_resume(
    tier: FastTier | None, resume_file: Path, restored_once: bool, coord: _dist.Coordinator
) -> tuple[dict[str, Any] | None, list[tuple[int, str]]]:
    """Collective: this rank's decision to resume from the fast tier (None: not from it),
    and the fast step skipped with the reason (every rank gets the same list). Every rank
    verifies its own copy deeply, and the copies must all be of one lineage (the pinned
    one, when the pin names it): two histories of one step number never mix."""
    pin = pinned_fast_step(resume_file, restored_once) if coord.rank == 0 else None
    pin = coord.broadcast(pin)
    if pin is None:
        return None, []
    step, pinned = int(pin[0]), pin[1]
    if tier is None:
        why: str | None = f"rank {coord.rank}: this trainer has no fast tier"
    else:
        found = tier.problem(step)
        why = None if found is None else f"rank {coord.rank}: {found}"
    problems = [p for p in coord.all_gather(why) if p]
    held = coord.all_gather(tier.lineage_of(step) if tier is not None and not problems else "")
    if not problems and (mixed := lineage_mod.mismatch(step, pinned, list(held))):
        problems = [mixed]
    if problems:
        reason = "fast tier: " + "; ".join(problems)
        if coord.rank == 0:
            log.warning("restore: fast-tier step %d skipped: %s", step, reason)
        return None, [(step, reason)]
    assert tier is not None
    return tier.decision(step), []
