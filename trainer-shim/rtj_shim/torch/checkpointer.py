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

import logging
import threading
import time
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

import torch

from rtj_shim import progress
from rtj_shim.alignment import LOSS_ALIGNMENT, MisalignedResume
from rtj_shim.checkpoint.layout import step_key
from rtj_shim.checkpoint.verification import check_commit
from rtj_shim.integrity import SuspectState
from rtj_shim.torch import fast_save, fingerprint, integrity_watch, resave
from rtj_shim.torch.agreement import decide_at_boundary
from rtj_shim.torch.capture import (
    FORMAT,
    SKELETON,
    as_float,
    capture,
    rank_path,
    shard_path,
)
from rtj_shim.torch.checkpointer_state import CheckpointerState
from rtj_shim.torch.fingerprint import replica_mismatches
from rtj_shim.torch.integrity_watch import RankIntegrity
from rtj_shim.torch.options import (
    DEFAULT_RESUME_FILE,
)
from rtj_shim.torch.outcomes import (
    CheckpointError,
    NonFiniteStateError,
    RestoreReport,
    SaveReport,
    announce,
    raise_if_any,
)
from rtj_shim.torch.peek import CheckpointInfo, peek_step
from rtj_shim.torch.restore import (
    record_misaligned,
    record_suspect,
    saved_reference,
    validate_restored,
)
from rtj_shim.torch.schedule import (
    best_from,
    scores,
)
from rtj_shim.torch.state import COMMON, USER_KINDS, classify, reclassify
from rtj_shim.torch.validation import loss_problem, optimizer_moments, run_probe
from rtj_shim.wire.milestones import Milestone

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


class Checkpointer(CheckpointerState):
    """Save and restore the complete state of a (distributed) PyTorch job.

    ``root``: a path, ``file://`` or ``s3://`` URI (or an opened store); omitted: the
    operator's ``RTJ_CHECKPOINT_URI`` (``spec.checkpoint.uri``; ``rtj_shim.wire.pod_env``:
    the whole environment contract). Rank and world size come from ``torch.distributed``
    when it is initialized. ``every_steps``/``every_seconds``/``monitor``/``mode``: when
    ``step_boundary`` saves (``every_seconds="auto"``: as often as the operator orders, for a
    job with ``plannedIntervalSeconds: auto``); ``keep_last``/``keep_best``: what is kept.

    ``rank_local`` / ``replicated``: names of objects whose placement differs from their
    kind's default (replicated: modules, optimizers, schedulers, scalers, samplers, plain
    values; rank-local: other Stateful objects). A replicated object is saved once and
    restores on any world size; every save checks that a replicated plain value or
    Stateful object is equal on every rank. A rank-local one is saved per rank.
    ``config``/``allow_config_change``: the configuration guard on resume.

    The other options come in groups (:mod:`rtj_shim.torch.options`): ``io`` (workers,
    shards, staging), ``resume`` (unsafe pickle, probe, resume file), ``emergency`` (the
    SIGTERM save), ``integrity`` (finite values, the anomaly guard: a suspect state is never
    published) and ``fast_tier`` (each rank's copy in pod-local memory every few steps,
    :mod:`rtj_shim.torch.fast_save`, or the operator's ``RTJ_FAST_*``).
    """

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
        problem = loss_problem(loss) if self.options.integrity.check_finite else None
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
                allow_unsafe_pickle=self.options.resume.allow_unsafe_pickle,
                shard_bytes=self.options.io.shard_bytes,
                max_shards=self.options.io.max_shards,
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
        self._judge(step, [row[4] for row in rows if row[4] is not None])
        if (reference := self._integrity.reference) is not None:
            job.extra[LOSS_ALIGNMENT] = reference.encode()
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
        if (probe := self.options.resume.probe) is not None:
            sharded = job.extra["layout"] == "sharded"
            validation: dict[str, Any] = dict(run_probe(probe, entries, coord, sharded))
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
            progress.current().mark(Milestone.RESTORED, 0)
            return 0
        manifest = check_commit(step, decision["manifest"], decision["committed"])
        self._guard_config(manifest.extra, entries, step, coord)
        loader = self._sources.loader_for(decision)
        applied = loader.load_and_apply(step, manifest, entries, coord, strict=strict)
        fast_save.continue_history(self.protocol, self._fast, decision)  # lineage (issue 43)
        self._integrity.resumed(step, saved_reference(manifest.extra, step))
        if applied.values:
            assert isinstance(objects, MutableMapping)
            objects.update(applied.values)
        if (probe := self.options.resume.probe) is not None:
            resume = self.options.resume
            validate_restored(
                probe, manifest, entries, coord, rtol=resume.probe_rtol, atol=resume.probe_atol
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
        progress.current().mark(Milestone.RESTORED, int(step))
        return int(step)

    def _announce(self, report: RestoreReport) -> None:
        self.last_restore = report
        announce(report, rank=self.rank, printed=self.options.resume.report)

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
        self._follow_interval()
        verdict = decide_at_boundary(
            self._step_agreement(), self.schedule, step, value,
            sigterm=self._sigterm.requested, last_save_at=self._last_save_at, best=self._best,
        )  # fmt: skip
        if verdict.sigterm:
            self._emergency(step, objects)
        decision, best_metric = verdict.save, verdict.best_metric
        if self._integrity.due(step):  # collective: every rank passes the same step
            self._check_integrity(step, objects)
        if self._integrity.alignment_due(step):  # collective: the same step on every rank
            self._check_alignment(step)
        if self._fast is not None and self._fast.config.due(step):
            self._fast_save(step, objects)
        if not decision.save:
            return None
        if self.rank == 0:
            log.info("saving step %d (%s)", step, decision.why)
        return self.save(step, objects, blocking=blocking, loss=loss, metric=best_metric)

    def watch_gradients(self, model: Any) -> None:
        """Judge this rank's gradient norm before DDP's all-reduce too (a DDP communication
        hook, :mod:`rtj_shim.torch.local_gradients`; call before the first backward): a
        gradient scaled on one rank is then named, where the norm after the all-reduce is
        off on every rank alike. Needs an ``anomaly_guard``."""
        self._integrity.watch_gradients(model)

    def _check_integrity(self, step: int, objects: Mapping[str, Any]) -> None:
        """Between saves: the same verdict a save takes, so training stops on a suspect
        state within `integrity_every_steps`, not at the next save."""
        entries = classify(objects, self.rank_local, self.replicated)
        rows = self._coordinator().all_gather(self._integrity.local(entries))
        self._judge(step, rows, what="failed its integrity check")

    def _check_alignment(self, step: int) -> None:
        """The data alignment check after a resume (`rtj_shim.alignment`): warn, or fail
        with `MisalignedResume` (``data_alignment.fail``), naming the ranks whose losses
        left the ranks' spread before the fault; left beside the resume file too."""
        levels = self._coordinator().all_gather(self._integrity.level())
        found = self._integrity.judge_alignment(step, levels)
        if found is None:
            return
        record_misaligned(self._sources.resume_file, found)
        check = self.options.integrity.data_alignment
        if check is not None and check.fail:
            raise MisalignedResume(found.describe())
        if self.rank == 0:
            log.warning("%s", found.describe())

    def _judge(self, step: int, rows: Sequence[RankIntegrity], what: str = "not published") -> None:
        """The collective verdict; a suspect one is left beside the resume file too."""
        self._integrity.observed(rows)
        try:
            integrity_watch.verdict(step, rows, what)
        except SuspectState as exc:
            if exc.verdict is not None:
                record_suspect(self._sources.resume_file, exc.verdict)
            raise

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
        raise SystemExit(self.options.emergency.exit_code)

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

    @progress.reports_section("checkpoint")
    def _fast_save(self, step: int, objects: Mapping[str, Any]) -> None:
        assert self._fast is not None
        if self._integrity.guard is not None:  # collective: every rank passes the same step
            # no fast copy of a state an anomaly made suspect: an in-place restart would pin
            # it, a drain would publish it (replicas that differ the drain refuses itself)
            rows = self._coordinator().all_gather(self._integrity.local_anomaly())
            self._judge(step, rows, what="not kept in the fast tier")
        started = time.perf_counter()  # the stall counts reading the objects too
        entries = reclassify(objects, self._fast_entries, self.rank_local, self.replicated)
        self._fast_entries = entries
        reference = self._integrity.reference
        self._fast.loss_alignment = None if reference is None else reference.encode()
        self._record_run_config(entries)
        self._fast.save(step, entries, self._coordinator(), started)
