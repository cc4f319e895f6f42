"""``Checkpointer``: the whole training state of a PyTorch job through the commit protocol.

This module is the public façade; each concern lives in its own module:

* :mod:`rtj_shim.torch.capture`: what a save takes from the objects, and the files of a step;
* :mod:`rtj_shim.torch.staging`: the copies a background save writes from, and the fences;
* :mod:`rtj_shim.torch.writer`: the collective write and publish of one step;
* :mod:`rtj_shim.torch.restore`: the resume decision, loading and applying a step;
* :mod:`rtj_shim.torch.outcomes`: reports and the errors every rank raises.

A save is collective: every rank captures its part, rank 0 opens the in-progress area and
publishes, and a failure on any rank fails the save on every rank and publishes nothing.
Coordination runs on a private gloo group, so a background save never interleaves with
the training's collectives. Restore is collective too: rank 0 decides, every rank loads its
part, and state is applied only after every rank has loaded.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, MutableMapping
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from rtj_shim import progress
from rtj_shim.checkpoint.layout import step_key
from rtj_shim.checkpoint.protocol import CommitProtocol, retention_from_env
from rtj_shim.checkpoint.run_config import RunConfig, allowed_changes, user_config
from rtj_shim.checkpoint.storage import CheckpointStore, open_store
from rtj_shim.checkpoint.verification import check_commit
from rtj_shim.fast.fast_tier import FastTierConfig
from rtj_shim.integrity import AnomalyGuard
from rtj_shim.torch import _dist, fast_save, fingerprint, integrity_watch, resave, rng, run_record
from rtj_shim.torch.agreement import StepAgreement
from rtj_shim.torch.capture import (
    FORMAT,
    SKELETON,
    SaveJob,
    as_float,
    capture,
    rank_path,
    shard_path,
)
from rtj_shim.torch.emergency import SigtermGuard
from rtj_shim.torch.fingerprint import replica_mismatches
from rtj_shim.torch.integrity_watch import IntegrityWatch, RankIntegrity
from rtj_shim.torch.outcomes import (
    CheckpointError,
    NonFiniteStateError,
    RestoreReport,
    SaveReport,
    announce,
    raise_if_any,
)
from rtj_shim.torch.peek import CheckpointInfo, peek_step
from rtj_shim.torch.restore import ResumeSources, validate_restored
from rtj_shim.torch.schedule import (
    Best,
    Mode,
    Schedule,
    best_from,
    merged_retention,
    metric_flag,
    save_decision,
    scores,
)
from rtj_shim.torch.staging import Staging, mark_staged
from rtj_shim.torch.state import COMMON, USER_KINDS, Entry, classify, reclassify
from rtj_shim.torch.validation import Probe, loss_problem, optimizer_moments, run_probe
from rtj_shim.torch.writer import CollectiveWriter
from rtj_shim.wire import pod_env

__all__ = [  # the names this module has always offered
    "DEFAULT_RESUME_FILE",
    "FORMAT",
    "SKELETON",
    "CheckpointError",
    "Checkpointer",
    "NonFiniteStateError",
    "RestoreReport",
    "SaveReport",
    "rank_path",
    "shard_path",
]

log = logging.getLogger("rtj_shim.torch")

DEFAULT_RESUME_FILE = "/var/run/rtj/resume.json"
MiB = 1 << 20


class Checkpointer:
    """Save and restore the complete state of a (distributed) PyTorch job.

    ``root``: a path, ``file://`` or ``s3://`` URI (or an opened store); omitted: the
    operator's ``RTJ_CHECKPOINT_URI`` (``spec.checkpoint.uri``). ``emergency_deadline_s``
    omitted: ``RTJ_EMERGENCY_SAVE_SECONDS`` (``spec.checkpoint.emergencySaveSeconds``), else
    30 s (``rtj_shim.wire.pod_env``: the whole environment contract). Rank and world size come
    from ``torch.distributed`` when it is initialized.

    ``rank_local`` / ``replicated``: names of objects whose placement differs from their
    kind's default (replicated: modules, optimizers, schedulers, scalers, samplers, plain
    values; rank-local: other Stateful objects). A replicated object is saved once and
    restores on any world size; every save checks that a replicated plain value or
    Stateful object is equal on every rank. A rank-local one is saved per rank.

    ``fast_tier_dir`` / ``fast_every_steps`` / ``fast_keep`` (or ``RTJ_FAST_TIER_DIR``,
    ``RTJ_FAST_EVERY_STEPS``, ``RTJ_FAST_KEEP`` from the operator): every ``fast_every_steps``
    steps, ``step_boundary`` also keeps each rank's copy in that pod-local directory (the
    fast tier, :mod:`rtj_shim.torch.fast_save`), from which an in-place restart resumes.

    Silent corruption (:mod:`rtj_shim.integrity`): every save compares the exact checksums
    of the replicated modules and optimizers across ranks; with ``anomaly_guard`` it also
    judges the losses and gradient norms ``step_boundary`` is given; with
    ``integrity_every_steps`` ``step_boundary`` takes the same verdict between saves. A
    suspect state is never published: ``SuspectState`` is raised on every rank, naming the
    rank.
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | CheckpointStore | None = None,
        *,
        run_id: str | None = None,
        attempt: str | None = None,
        rank_local: Iterable[str] = (),
        replicated: Iterable[str] = (),
        every_steps: int | None = None,
        every_seconds: float | None = None,
        monitor: str | None = None,
        mode: Mode = "min",
        keep_last: int | None = None,
        keep_best: int = 0,
        allow_unsafe_pickle: bool = False,
        probe: Probe | None = None,
        probe_rtol: float = 1e-3,
        probe_atol: float = 1e-6,
        check_finite: bool = True,
        io_workers: int = 4,
        shard_bytes: int = 32 * MiB,
        max_shards: int = 64,
        emergency_deadline_s: float | None = None,
        emergency_exit_code: int = 143,
        collective_timeout_s: float = 600.0,
        resume_file: str | os.PathLike[str] | None = None,
        staging_dir: str | os.PathLike[str] | None = None,
        restore_report: bool = True,
        fast_tier_dir: str | os.PathLike[str] | None = None,
        fast_every_steps: int | None = None,
        fast_keep: int | None = None,
        config: Mapping[str, Any] | None = None,
        allow_config_change: Iterable[str] = (),
        anomaly_guard: AnomalyGuard | None = None,
        integrity_every_steps: int | None = None,
    ) -> None:
        if root is None:  # in an operator's pod: spec.checkpoint.uri
            root = pod_env.checkpoint_uri()
        if isinstance(root, str | os.PathLike):
            self.store: CheckpointStore = open_store(os.fspath(root))
        else:
            self.store = root
        if emergency_deadline_s is None:  # the operator's spec.checkpoint.emergencySaveSeconds
            emergency_deadline_s = pod_env.emergency_save_seconds()
        self.schedule = Schedule(every_steps, every_seconds, monitor, mode)
        self.config = user_config(config)  # ValueError naming `config` before anything runs
        self.allow_config_change = allowed_changes(allow_config_change)
        self.protocol = CommitProtocol(
            self.store,
            run_id=run_id,
            attempt=attempt or os.environ.get("RTJ_ATTEMPT") or "0",
            retention=merged_retention(retention_from_env(), keep_last, keep_best, monitor),
        )
        self.rank = _dist.rank()
        self.world_size = _dist.world_size()
        self.rank_local = tuple(rank_local)
        self.replicated = tuple(replicated)
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
        self.restore_report = restore_report
        self.last_save: SaveReport | None = None
        self.last_restore: RestoreReport | None = None
        self._staging = Staging(self.staging_dir, check_finite=check_finite)
        self._writer = CollectiveWriter(
            self.protocol,
            self.store,
            world_size=self.world_size,
            io_workers=self.io_workers,
            check_finite=check_finite,
        )
        fast = FastTierConfig.from_env(os.environ, fast_tier_dir, fast_every_steps, fast_keep)
        self._fast = None if fast is None else fast_save.FastTier(
            fast, rank=self.rank, attempt=self.protocol.attempt,
            allow_unsafe_pickle=allow_unsafe_pickle, shard_bytes=shard_bytes,
            max_shards=max_shards,
        )  # fmt: skip
        self._fast_entries: list[Entry] | None = None  # as the last fast save classified them
        self.protocol.lineage = fast_save.fresh_lineage()  # until a restore continues one
        if self._fast is not None:
            self._fast.durable_schedule = {
                "every_steps": self.schedule.every_steps,
                "every_seconds": self.schedule.every_seconds,
                "by_metric": False,  # until a step_boundary passes a metric
            }
        self._sources = ResumeSources(
            self.store, self._fast, self.resume_file, allow_unsafe_pickle=allow_unsafe_pickle,
            io_workers=self.io_workers, staging_dir=self.staging_dir,
            claim=self.protocol.claim_run,
        )  # fmt: skip
        self._coord: _dist.Coordinator | None = None
        self._agreement: StepAgreement | None = None
        self._inflight: threading.Thread | None = None
        self._error: BaseException | None = None
        self._restored_once = False
        self._peeked: dict[str, Any] | None = None  # peek()'s decision, for the next restore
        self._published: int | None = None
        self._clean: resave.Snapshot | None = None  # last state restored or published
        self._best: Best | None = None  # the best metric published so far
        self._last_save_at = time.monotonic()  # for every_seconds
        self._run_config: RunConfig | None = None  # recorded in every manifest published
        self._sigterm = SigtermGuard(self.rank, emergency_deadline_s, emergency_exit_code)
        self._integrity = IntegrityWatch(anomaly_guard, integrity_every_steps)
        atexit.register(_drain_at_exit, weakref.ref(self))

    # ================================================================== public API

    @progress.reports_section("checkpoint")
    def save(
        self,
        step: int,
        objects: Mapping[str, Any],
        *,
        blocking: bool = True,
        loss: float | torch.Tensor | None = None,
        metric: float | torch.Tensor | None = None,
    ) -> SaveReport | None:
        """Collective. Every rank calls it after completing ``step`` steps.

        Blocking: returns once the step is published. ``blocking=False``: takes what it
        needs (RNG, small state, staging of large tensors overlapped with the next forward
        and backward, fenced before the next ``optimizer.step()``), returns, and publishes
        in the background; errors surface at the next ``save`` or ``wait``. ``metric``:
        rank 0's value of the monitored metric, recorded in the manifest (keep-best).
        """
        started = time.perf_counter()
        self.wait()
        self._last_save_at = time.monotonic()
        coord = self._coordinator()
        problem = loss_problem(loss) if self.check_finite else None
        replicas: dict[str, str] = {}
        again: resave.Check | None = None
        integrity: RankIntegrity | None = None
        try:  # local work only: a rank that fails here must not leave the others waiting
            entries = classify(objects, self.rank_local, self.replicated)
            self._record_run_config(entries)
            replicas = fingerprint.entry_digests(
                [e for e in entries if e.placement == COMMON and e.kind in USER_KINDS],
                identity=False,
            )
            integrity = self._integrity.local(entries)
            snapshot = self._snapshot(step, entries, "this run published")
            again = resave.check(self._clean, step, snapshot.digests, snapshot.rng)
            job = capture(
                step,
                entries,
                coord,
                blocking=blocking,
                started=started,
                problem=problem,
                loss=loss,
                allow_unsafe_pickle=self.allow_unsafe_pickle,
                shard_bytes=self.shard_bytes,
                max_shards=self.max_shards,
            )
            job.snapshot = snapshot
            local_error = None
        except Exception as exc:
            local_error, failure = f"rank {coord.rank}: {type(exc).__name__}: {exc}", exc
        score = None if metric is None else as_float(metric)
        rows = coord.all_gather((local_error, replicas, again, score, integrity))
        errors = [error for error, *_ in rows if error]
        if errors:
            if local_error is not None:
                raise failure
            raise CheckpointError(f"save of step {step} failed: " + "; ".join(errors))
        integrity_watch.verdict(step, [row[4] for row in rows if row[4] is not None])
        differing = replica_mismatches([digests for _, digests, *_ in rows])
        if differing:
            raise CheckpointError(
                f"save of step {step} refused: {differing} differ between ranks but are "
                "saved replicated (once, from rank 0's copy); pass Checkpointer(..., "
                f"rank_local={tuple(differing)!r}) to save one copy per rank"
            )
        if self._clean is not None and self._clean.step == step:
            checks = [c for _, _, c, *_ in rows]
            done = resave.settle(self.store, step, self._clean, checks, coord, blocking, started)
            if done is not None:
                self.last_save = done
                return done
        job.scores, self._best = scores(self.schedule, self._best, step, rows[0][3])
        if self.probe is not None:
            sharded = job.extra["layout"] == "sharded"
            validation: dict[str, Any] = dict(run_probe(self.probe, entries, coord, sharded))
            validation["moments"] = optimizer_moments(entries, coord, sharded)
            job.extra["validation"] = validation
        if job.sharded:
            self._staging.stage_sharded(job, coord)
        if blocking:
            job.staged.set()
            self._run(job, coord)
            return self.last_save
        self._staging.stage_unfenced(job)
        self._staging.install_fences(entries)
        self._staging.inflight = job
        self._inflight = threading.Thread(
            target=self._background, args=(job, coord), name=f"rtj-save-{step}", daemon=True
        )
        self._inflight.start()
        job.stall += time.perf_counter() - started
        return None

    @property
    def fast_tier(self) -> fast_save.FastTier | None:
        """The fast tier (None without one): ``.last`` its newest save's report, ``.wait()``
        until the fast step being written is published, ``.skipped`` and ``.failures``."""
        return self._fast

    def wait(self) -> None:
        """Wait for a background save; raise its error, if it had one."""
        thread = self._inflight
        if thread is not None:
            thread.join()
            self._inflight = None
            self._staging.inflight = None
        error, self._error = self._error, None
        if error is not None:
            if isinstance(error, CheckpointError):
                raise error
            raise CheckpointError(f"background save failed: {error}") from error

    @progress.reports_section("restore")
    def restore(self, objects: Mapping[str, Any], *, strict: bool = True) -> int:
        """Collective. Restore ``objects`` and this rank's RNGs; return the step (0: fresh).
        Claims the durable root for this attempt first (as ``peek()`` does): a rank of an
        older world is refused from its next commit on, and an older attempt than the
        root's owner fails here (``rtj_shim.torch.restore.claim_problem``).

        Plain values are written back into ``objects``. ``strict=False``: an object the
        checkpoint has no state for (added to the code since), or a rank-local one saved on
        another world size, keeps its current state with a warning instead of failing."""
        started = time.perf_counter()
        self.wait()
        coord = self._coordinator()
        local_error = None
        try:
            entries = classify(objects, self.rank_local, self.replicated)
            if any(e.kind == "value" for e in entries) and not isinstance(objects, MutableMapping):
                raise TypeError("plain values are restored into the mapping: pass a dict")
        except Exception as exc:
            local_error = f"rank {coord.rank}: {type(exc).__name__}: {exc}"
        decision = self._resume_decision(coord)
        self._peeked = None
        raise_if_any(coord, local_error, "restore failed")
        skipped = tuple((int(s), str(r)) for s, r in decision["skipped"])
        step = decision["step"]
        self._restored_once = True
        if step is None:
            fast_save.continue_history(self.protocol, self._fast, decision)  # a fresh lineage
            self._record_run_config(entries)
            seconds = time.perf_counter() - started
            self._announce(RestoreReport(0, "fresh", skipped, seconds, uri=self.store.uri))
            return 0
        manifest = check_commit(step, decision["manifest"], decision["committed"])
        self._guard_config(manifest.extra, entries, step, coord)
        loader = self._sources.loader_for(decision)
        applied = loader.load_and_apply(step, manifest, entries, coord, strict=strict)
        fast_save.continue_history(self.protocol, self._fast, decision)  # lineage (issue 43)
        if applied.values:
            assert isinstance(objects, MutableMapping)
            objects.update(applied.values)
        if self.probe is not None:
            validate_restored(
                self.probe, manifest, entries, coord, rtol=self.probe_rtol, atol=self.probe_atol
            )
        durable = decision.get("tier") != "fast"
        self._published = step if durable else self._published  # a fast step is not durable
        monitor = self.schedule.monitor
        self._best = None if monitor is None else best_from(manifest.extra, monitor)
        self._last_save_at = time.monotonic()
        now = classify(objects, self.rank_local, self.replicated)  # values written back
        restored = [e for e in now if e.name not in applied.missing]
        self._clean = (
            self._snapshot(step, restored, "this run restored from it") if durable else None
        )
        self._announce(
            RestoreReport(
                step,
                decision["source"],
                skipped,
                time.perf_counter() - started,
                applied.notes,
                missing=applied.missing,
                unused=applied.unused,
                uri=loader.store.key_uri(step_key(step)),
            )
        )
        return int(step)

    def _announce(self, report: RestoreReport) -> None:
        self.last_restore = report
        announce(report, rank=self.rank, printed=self.restore_report)

    def peek(self) -> CheckpointInfo | None:
        """Collective. What ``restore()`` would resume, read before the model exists: the
        step, where from, the manifest's metadata and the replicated plain values (a config
        dict saved as ``objects["config"]``); None on a fresh start. The next ``restore()``
        resumes this very step without verifying it again."""
        self.wait()
        coord = self._coordinator()
        decision = self._resume_decision(coord)
        self._peeked = decision
        if decision["step"] is None:
            return None
        return peek_step(self._sources.loader_for(decision), decision, coord)

    def step_boundary(
        self,
        step: int,
        objects: Mapping[str, Any],
        *,
        loss: float | torch.Tensor | None = None,
        metric: float | torch.Tensor | None = None,
        blocking: bool = True,
        grad_norm: float | torch.Tensor | None = None,
    ) -> SaveReport | None:
        """Collective; call after every completed step. Saves ``step`` when the schedule
        says so (``every_steps``, ``every_seconds``) or when ``metric`` (rank 0's value;
        other ranks may pass None; needs ``monitor``) improved on the best so far; every
        rank takes the same decision from one reduction (rtj_shim.torch.agreement: one
        boundary late unless a metric is monitored, so a SIGTERM or a passed interval acts
        at the next boundary). Returns the report of a blocking save it made.

        Arms the SIGTERM handler on first use; when a SIGTERM arrived on any rank, every
        rank saves ``step`` (unless already published) within the deadline and exits with
        ``emergency_exit_code``. ``loss`` and ``grad_norm`` (this rank's) feed the
        ``anomaly_guard``, judged at the next save without a per-step device sync."""
        progress.step_done(step)  # the pod's progress server reports it (rtj_shim.progress)
        self._integrity.note(step, loss=loss, grad_norm=grad_norm)
        self._sigterm.install()
        value = None if metric is None else as_float(metric)
        if value is not None and self.schedule.monitor is None:
            raise ValueError(f"step_boundary(step={step}, metric=...): the Checkpointer has "
                             "no monitor; construct it with monitor=NAME to save when NAME "
                             "improves")  # fmt: skip
        if value is not None and self._fast is not None:
            self._fast.durable_schedule["by_metric"] = True
        agreement = self._step_agreement()
        rank0 = agreement.coordinator.rank == 0
        with progress.section("collective") if agreement.coordinator.world > 1 else nullcontext():
            agreed = agreement.agree(  # a wait for the slowest rank: a hang verdict looks past it
                self._sigterm.requested,
                self.schedule.time_due(time.monotonic() - self._last_save_at),
                metric_flag(value) if rank0 else 0.0,
                value if rank0 and value is not None and math.isfinite(value) else -math.inf,
                self._last_save_at,
            )
        if agreed.sigterm:
            self._emergency(step, objects)
        if agreed.metric_flag == 2.0 and rank0:
            log.warning("step %d: %s is %s; not recorded", step, self.schedule.monitor, value)
        best_metric = agreed.metric if agreed.metric_flag == 1.0 else None
        decision = save_decision(self.schedule, step, agreed.time_due, best_metric, self._best)
        if self._integrity.due(step):  # collective: every rank passes the same step
            self._check_integrity(step, objects)
        if self._fast is not None and self._fast.config.due(step):
            self._fast_save(step, objects)
        if not decision.save:
            return None
        if rank0:
            log.info("saving step %d (%s)", step, decision.why)
        return self.save(step, objects, blocking=blocking, loss=loss, metric=best_metric)

    def _check_integrity(self, step: int, objects: Mapping[str, Any]) -> None:
        """Between saves: the same verdict a save takes, so training stops on a suspect
        state within `integrity_every_steps`, not at the next save."""
        entries = classify(objects, self.rank_local, self.replicated)
        rows = self._coordinator().all_gather(self._integrity.local(entries))
        integrity_watch.verdict(step, rows, what="failed its integrity check")

    def _emergency(self, step: int, objects: Mapping[str, Any]) -> None:
        self._sigterm.arm()
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
        if self._agreement is not None:
            self._agreement.close()
        if self._fast is not None:
            self._fast.close()
        self._fast_entries = None
        self._staging.remove_fences()
        self._sigterm.uninstall()

    # ================================================================== save internals

    def _coordinator(self) -> _dist.Coordinator:
        if self._coord is None:
            self._coord = _dist.Coordinator(self.collective_timeout_s)
        return self._coord

    @progress.reports_section("checkpoint")
    def _fast_save(self, step: int, objects: Mapping[str, Any]) -> None:
        assert self._fast is not None
        started = time.perf_counter()  # the stall counts reading the objects too
        entries = reclassify(objects, self._fast_entries, self.rank_local, self.replicated)
        self._fast_entries = entries
        self._record_run_config(entries)
        self._fast.save(step, entries, self._coordinator(), started)

    def _record_run_config(self, entries: list[Entry], record: RunConfig | None = None) -> None:
        """What every manifest this run publishes records as its configuration (the
        restore's, with its history, or this run's own on a fresh start)."""
        if record is None:
            if self._run_config is not None:
                return
            record = run_record.current(entries, self.world_size, self.config)
        self._run_config = record
        self.protocol.run_config = record.encode()
        if self._fast is not None:
            self._fast.protocol.run_config = self.protocol.run_config

    def _guard_config(
        self, extra: Mapping[str, Any], entries: list[Entry], step: int, coord: _dist.Coordinator
    ) -> None:
        """Collective: a resume whose configuration changed in undeclared keys is refused."""
        now = run_record.current(entries, self.world_size, self.config)
        record = run_record.guard_collective(
            extra, now, self.allow_config_change, step, self.protocol.attempt, coord
        )
        self._record_run_config(entries, record)

    def _resume_decision(self, coord: _dist.Coordinator) -> dict[str, Any]:
        """Collective: the resume decision (the one peek() took, if it did)."""
        decision = self._peeked or self._sources.resume_decision(coord, self._restored_once)
        if decision.get("error"):
            raise CheckpointError(f"restore: {decision['error']}")
        return decision

    def _step_agreement(self) -> StepAgreement:
        """The per-boundary reduction on the Checkpointer's control group (its own: a
        background save's collectives run on the other); one boundary late unless a metric
        is monitored (rtj_shim.torch.agreement)."""
        if self._agreement is None:
            self._coordinator()
            self._agreement = StepAgreement(
                _dist.Coordinator(self.collective_timeout_s),
                lagged=self.schedule.monitor is None,
                timeout_s=self.collective_timeout_s,
            )
        return self._agreement

    def _background(self, job: SaveJob, coord: _dist.Coordinator) -> None:
        try:
            try:
                self._staging.stage_fenced(job)
            finally:
                mark_staged(job)
            self._run(job, coord)
        except BaseException as exc:
            self._error = exc
            log.error("background save of step %d failed: %s", job.step, exc)

    def _run(self, job: SaveJob, coord: _dist.Coordinator) -> None:
        report = self._writer.write(job, coord)
        self._published = job.step
        self._clean = job.snapshot
        self.last_save = report

    def _snapshot(self, step: int, entries: list[Entry], origin: str) -> resave.Snapshot:
        digests = fingerprint.entry_digests(entries, identity=True)
        return resave.Snapshot(
            step, digests, fingerprint.digest(rng.capture(), identity=False), origin
        )


def _drain_at_exit(ref: weakref.ReferenceType[Checkpointer]) -> None:
    me = ref()
    thread = None if me is None else me._inflight
    if thread is not None and thread.is_alive():
        log.warning("waiting for the background save before exiting")
        thread.join()
