"""A Checkpointer's state and the internals its saves and restores share: the store and its
commit protocol, the options, the fast tier, the resume sources, the coordinators, and the
run's configuration record. `rtj_shim.torch.checkpointer.Checkpointer` builds its public API
(save, restore, peek, step_boundary) on it; nothing else uses this class.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import threading
import time
import weakref
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from rtj_shim import progress
from rtj_shim.checkpoint.protocol import CommitProtocol, retention_from_env
from rtj_shim.checkpoint.run_config import RunConfig, allowed_changes, user_config
from rtj_shim.checkpoint.storage import CheckpointStore, open_store
from rtj_shim.checkpoint.storage.throttle import throttled
from rtj_shim.fast.fast_tier import FastTierConfig
from rtj_shim.torch import _dist, fast_save, fingerprint, resave, rng, run_record
from rtj_shim.torch.agreement import StepAgreement
from rtj_shim.torch.capture import (
    SaveJob,
)
from rtj_shim.torch.emergency import SigtermGuard
from rtj_shim.torch.integrity_watch import IntegrityWatch
from rtj_shim.torch.options import (
    DEFAULT_RESUME_FILE,
    EmergencyOptions,
    IntegrityOptions,
    IoOptions,
    Options,
    ResumeOptions,
    group_legacy_options,
    with_pod_defaults,
)
from rtj_shim.torch.outcomes import (
    CheckpointError,
    RestoreReport,
    SaveReport,
)
from rtj_shim.torch.restore import ResumeSources
from rtj_shim.torch.schedule import (
    Best,
    Mode,
    Schedule,
    merged_retention,
)
from rtj_shim.torch.staging import Staging, mark_staged
from rtj_shim.torch.state import Entry
from rtj_shim.torch.writer import CollectiveWriter
from rtj_shim.wire import interval_order, pod_env
from rtj_shim.wire.save_costs import SaveTier

log = logging.getLogger("rtj_shim.torch")

AUTO = "auto"
"""``every_seconds="auto"``: save as often as the operator orders (`plannedIntervalSeconds:
auto`, `rtj_shim.wire.interval_order`)."""


class CheckpointerState:
    """What a Checkpointer holds (see `Checkpointer` for its arguments)."""

    def __init__(
        self,
        root: str | os.PathLike[str] | CheckpointStore | None = None,
        *,
        every_steps: int | None = None,
        every_seconds: float | Literal["auto"] | None = None,
        monitor: str | None = None,
        mode: Mode = "min",
        keep_last: int | None = None,
        keep_best: int = 0,
        rank_local: Iterable[str] = (),
        replicated: Iterable[str] = (),
        config: Mapping[str, Any] | None = None,
        allow_config_change: Iterable[str] = (),
        run_id: str | None = None,
        attempt: str | None = None,
        io: IoOptions | None = None,
        resume: ResumeOptions | None = None,
        emergency: EmergencyOptions | None = None,
        integrity: IntegrityOptions | None = None,
        fast_tier: FastTierConfig | None = None,
        **deprecated: Any,
    ) -> None:
        given = Options(
            io or IoOptions(), resume or ResumeOptions(),
            emergency or EmergencyOptions(), integrity or IntegrityOptions(),
        )  # fmt: skip
        grouped = group_legacy_options(given, deprecated)
        self.options = opts = with_pod_defaults(grouped)
        if root is None:  # in an operator's pod: spec.checkpoint.uri
            root = pod_env.checkpoint_uri()
        store = open_store(os.fspath(root)) if isinstance(root, str | os.PathLike) else root
        # durable saves paced (spec.checkpoint.maxWriteBytesPerSecond); never an emergency save
        self.store = throttled(store, opts.io.max_write_bytes_per_second, self._sigterm_requested)
        self._followed = _followed(every_seconds)
        seconds = self._followed.seconds() if self._followed is not None else every_seconds
        assert not isinstance(seconds, str)
        self.schedule = Schedule(every_steps, seconds, monitor, mode)
        self.config = user_config(config)  # ValueError naming `config` before anything runs
        self.allow_config_change = allowed_changes(allow_config_change)
        self.protocol = CommitProtocol(
            self.store,
            run_id=run_id,
            attempt=attempt or os.environ.get("RTJ_ATTEMPT") or "0",
            retention=merged_retention(retention_from_env(), keep_last, keep_best, monitor),
        )
        self.rank, self.world_size = _dist.rank(), _dist.world_size()
        self.rank_local, self.replicated = tuple(rank_local), tuple(replicated)
        if opts.resume.allow_unsafe_pickle:
            log.warning("allow_unsafe_pickle=True: restore will unpickle arbitrary objects")
        self.last_save: SaveReport | None = None
        self.last_restore: RestoreReport | None = None
        check_finite = opts.integrity.check_finite
        self._staging = Staging(opts.io.staging_dir, check_finite=check_finite)
        self._writer = CollectiveWriter(
            self.protocol, self.store, world_size=self.world_size,
            io_workers=opts.io.io_workers, check_finite=check_finite,
        )  # fmt: skip
        self._fast = self._open_fast_tier(fast_tier)
        self._fast_entries: list[Entry] | None = None  # as the last fast save classified them
        self.protocol.lineage = fast_save.fresh_lineage()  # until a restore continues one
        self._sources = ResumeSources(
            self.store, self._fast, Path(opts.resume.resume_file or DEFAULT_RESUME_FILE),
            allow_unsafe_pickle=opts.resume.allow_unsafe_pickle, io_workers=opts.io.io_workers,
            staging_dir=opts.io.staging_dir, claim=self.protocol.claim_run,
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
        deadline = opts.emergency.deadline_s
        assert deadline is not None  # with_pod_defaults filled it in
        self._sigterm = SigtermGuard(self.rank, deadline, opts.emergency.exit_code)
        self._integrity = IntegrityWatch(
            opts.integrity.anomaly_guard,
            opts.integrity.every_steps,
            opts.integrity.data_alignment,
        )
        atexit.register(_drain_at_exit, weakref.ref(self))

    def _sigterm_requested(self) -> bool:
        guard = getattr(self, "_sigterm", None)
        return guard is not None and bool(guard.requested)

    def _open_fast_tier(self, given: FastTierConfig | None) -> fast_save.FastTier | None:
        args = self.options.fast_args
        config = given or FastTierConfig.from_env(
            os.environ, args.directory, args.every_steps, args.keep
        )
        if config is None:
            return None
        tier = fast_save.FastTier(
            config, rank=self.rank, attempt=self.protocol.attempt,
            allow_unsafe_pickle=self.options.resume.allow_unsafe_pickle,
            shard_bytes=self.options.io.shard_bytes, max_shards=self.options.io.max_shards,
        )  # fmt: skip
        tier.durable_schedule = {
            "every_steps": self.schedule.every_steps,
            "every_seconds": self.schedule.every_seconds,
            "by_metric": False,  # until a step_boundary passes a metric
        }
        return tier

    def _follow_interval(self) -> None:
        """``every_seconds="auto"``: the operator's interval, as it last ordered it (a clock
        read at most boundaries; `rtj_shim.wire.interval_order`)."""
        if self._followed is None:
            return
        seconds = self._followed.seconds()
        if seconds != self.schedule.every_seconds:
            self.schedule = dataclasses.replace(self.schedule, every_seconds=seconds)
            if self._fast is not None:
                self._fast.durable_schedule["every_seconds"] = seconds

    def _coordinator(self) -> _dist.Coordinator:
        if self._coord is None:
            self._coord = _dist.Coordinator(self.options.io.collective_timeout_s)
        return self._coord

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
            timeout_s = self.options.io.collective_timeout_s
            self._agreement = StepAgreement(
                _dist.Coordinator(timeout_s), lagged=self.schedule.monitor is None,
                timeout_s=timeout_s,
            )  # fmt: skip
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
        if not report.already_published:  # what `auto` intervals weigh a save at
            progress.current().note_save(SaveTier.DURABLE, report.stall_seconds)

    def _snapshot(self, step: int, entries: list[Entry], origin: str) -> resave.Snapshot:
        digests = fingerprint.entry_digests(entries, identity=True)
        return resave.Snapshot(
            step, digests, fingerprint.digest(rng.capture(), identity=False), origin
        )


def _followed(every_seconds: float | str | None) -> interval_order.FollowedInterval | None:
    """The operator's interval to follow (``every_seconds="auto"``), from the progress
    directory; outside the operator's pods `interval_order.START_SECONDS`, logged."""
    if every_seconds != AUTO:
        if isinstance(every_seconds, str):
            raise ValueError(
                f"every_seconds: expected seconds > 0 or 'auto', got {every_seconds!r}"
            )
        return None
    directory = os.environ.get(progress.ENV_DIR)
    if not directory:
        log.info("every_seconds='auto' without the operator (no %s): every %g s",
                 progress.ENV_DIR, interval_order.START_SECONDS)  # fmt: skip
    return interval_order.FollowedInterval(Path(directory) if directory else None)


def _drain_at_exit(ref: weakref.ReferenceType[CheckpointerState]) -> None:
    me = ref()
    thread = None if me is None else me._inflight
    if thread is not None and thread.is_alive():
        log.warning("waiting for the background save before exiting")
        thread.join()
