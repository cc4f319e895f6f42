"""The progress poller: reads each running worker pod's progress sidecar (`GET
http://<podIP>:<port>/progress`) every few seconds and keeps the last answer per pod, in
memory, for the plan (`reconcile.ranks`). Thin I/O: the decisions are `policy.progress`.

Why pull (docs/progress.md): no API-server write per heartbeat whatever the pod count, no
new permission for training pods, and a report is attributed to the pod the operator chose
to read (a trusted pod of a JobSet this job owns, `reconcile.ranks.poll_targets`), so a pod
cannot report for another job. Bounded: at most `concurrency` requests at once, each with a
`timeout` and a `max_body` limit; per job, one report per polled pod. A pod that does not
answer keeps its last report, which ages out of the evidence after 30 s
(`policy.progress.DEFAULT_MAX_REPORT_AGE`); an unanswered poll is never a Hang by itself.
A report holding a value no sidecar writes (`policy.report_values`) is such a non-answer;
an unexpected error in one job's part of a round is that job's alone (`job_errors`), and
slow answers cost their own job's pods: each job spends at most its budget of worker time
in a round (`policy.poll_budget`); the pods left out keep their last report and go first
next round.

Before reading a pod the poller posts it the signed messages the plan names for it
(`reconcile.pod_messages`: an in-place restart's order, a peer-replica assignment), so the
answer already tells whether it took them; a restart order's own answer carries the pod's
report once its supervisor took the order (`rtj_shim.agent.progress_server`), which stands for the
read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any

from rtj_operator import poll_readings
from rtj_operator.pod_http import (
    Exchange,
    Exchanged,
    Fetch,
    Send,
    SidecarConnections,
    fetch_progress,
    post_signed,
    separately,
)
from rtj_operator.policy import poll_budget
from rtj_operator.policy import stragglers as rank_stragglers
from rtj_operator.reconcile.world import CONTROL_PATH, PollMessage, PollTarget, RankReadings
from rtj_shim.wire.answer_seal import Answerer

log = logging.getLogger("rtj_operator.rank_polls")

Key = tuple[str, str]
ORDER_INTERVAL = 0.25
"""Seconds between rounds while a job has restart orders out (an in-place restart): each
supervisor's progress is seen within this, not within the poll period."""
RESTING_SECONDS = 5.0
"""In close rounds, a pod whose report shows its order carried out is not read again for
this long, nor an order its sidecar took posted again (a round at 1,000+ pods takes longer
than a short poll period, so the period cannot be the measure). Whatever stands longer is
read or posted again: a trainer that ends after it started shows within this."""
MAX_SKIPPED_ROUNDS = 8
"""A pod that keeps not answering is asked every 2, 4, ... up to 1 + 8 rounds: a dead pod
(or one whose image has no progress server) must not cost a connection timeout per round."""


@dataclass(frozen=True)
class JobTargets:
    """What to poll for one job, and how it judges stragglers."""

    key: Key
    targets: tuple[PollTarget, ...]
    straggler_ratio: float = 0.7
    straggler_windows: int = 3
    messages: Mapping[str, tuple[PollMessage, ...]] = field(default_factory=dict)
    """Per pod, the signed messages posted before reading it, in order: a restart order
    (``/control``) until the job's in-place restart moves on, a peer-replica assignment
    (``/replica``) until the pod's report shows it. Both are idempotent."""
    read_key: str | None = None
    """The job's control key: every read of its pods is signed with it (their sidecars
    answer only signed reads); None (the operator has no control secret): unsigned."""

    @property
    def ordering(self) -> bool:
        """Whether restart orders are out that some pod has not yet carried out: rounds then
        come closely (a standing order alone does not: an idle spare's hold would keep them
        close for as long as the job keeps a spare)."""
        return any(self.pressing(pod) for pod in self.messages)

    def pressing(self, pod: str) -> bool:
        """Whether `pod` has a restart order its last report does not show carried out: it
        is read in every close round; the others only at the usual pace."""
        return any(m.path == CONTROL_PATH and not m.standing for m in self.messages.get(pod, ()))


@dataclass(frozen=True)
class Answer:
    """One pod's answer in a round: its body (or why none), when it arrived (the operator's
    clock, Unix s), and the messages its sidecar did not take."""

    body: Any
    error: str | None
    arrived: float
    refused: tuple[PollMessage, ...] = ()
    took: float = 0.0
    """Seconds the exchange held a poller worker (its job's spend, `policy.poll_budget`)."""


class RankPolls:
    """Polls every target each `interval` seconds; `reading(key)` is the latest per job."""

    def __init__(
        self,
        clock: Callable[[], datetime],
        on_round: Callable[[Key], None],
        *,
        interval: float = 5.0,
        timeout: float = 2.0,
        concurrency: int = 16,
        fetch: Fetch | None = None,
        send: Send | None = None,
        pod_share: float = poll_budget.POD_SHARE,
        min_job_budget: float = poll_budget.MIN_JOB_BUDGET,
    ) -> None:
        """`fetch` and `send` replace the HTTP halves (a test's, a bench's); without them
        each pod is asked on a connection kept for it across rounds (`SidecarConnections`).
        At most `concurrency` pods are asked at once; a job spends at most
        `poll_budget.job_budget(pods, pod_share, min_job_budget)` worker seconds a round."""
        self.clock = clock
        self.pod_share = pod_share
        self.min_job_budget = min_job_budget
        self.on_round = on_round
        self.interval = interval
        self.timeout = timeout
        self.concurrency = max(1, concurrency)
        self.connections: SidecarConnections | None = None
        if fetch is None and send is None:
            self.connections = SidecarConnections()
            self.exchange: Exchange = self.connections.exchange
        else:
            self.exchange = separately(fetch or fetch_progress, send or post_signed)
        self._executor = ThreadPoolExecutor(self.concurrency, thread_name_prefix="rtj-progress")
        self._readings: dict[Key, RankReadings] = {}
        self._stragglers: dict[Key, rank_stragglers.StragglerState] = {}
        self._quiet: dict[tuple[Key, int, str], tuple[int, int, float]] = {}
        """(job, attempt, pod) -> (failures in a row, the round it is asked again, when the
        first of them went unanswered)."""
        self._read_at: dict[tuple[Key, int, str], float] = {}
        """(job, attempt, pod) -> when it was last asked (monotonic s)."""
        self._taken: dict[tuple[Key, int, str, str], tuple[str, float]] = {}
        """(job, attempt, pod, path) -> the signature of the message its sidecar last took
        (202), and when it was sent (monotonic s)."""
        self._tried: dict[tuple[Key, int, str, str], str] = {}
        """(job, attempt, pod, path) -> the signature of the message last posted to it,
        taken or not."""
        self._cost: dict[tuple[Key, int, str], float] = {}
        """(job, attempt, pod) -> seconds its last exchange took."""
        self._waiting: dict[tuple[Key, int, str], int] = {}
        """(job, attempt, pod) -> rounds in a row left out for its job's budget."""
        self.left_out: dict[Key, int] = {}
        """Per job, the pods its budget left out of the last round (0: none)."""
        self.job_errors: dict[Key, int] = {}
        """Per job, the rounds in which its part failed unexpectedly."""
        self._failing: set[Key] = set()
        """Jobs whose part failed in their last round (logged once until one succeeds)."""
        self._lock = threading.Lock()
        self._poked: asyncio.Event | None = None
        self._orders_out = False
        self.rounds = 0

    def reading(self, key: Key) -> RankReadings | None:
        with self._lock:
            return self._readings.get(key)

    def readings(self) -> dict[Key, RankReadings]:
        with self._lock:
            return dict(self._readings)

    def forget(self, key: Key) -> None:
        with self._lock:
            self._readings.pop(key, None)
            self._stragglers.pop(key, None)
        self.job_errors.pop(key, None)
        self._failing.discard(key)

    def _get(
        self, target: PollTarget, messages: Sequence[PollMessage] = (), read: bool = True,
        key: str | None = None,
    ) -> Answer:  # fmt: skip
        """The pod's answer, dated when it arrived (the operator's clock, Unix s): each
        report is dated by its own answer, not by the end of the round. The pod's messages
        go first: the answer then already tells whether it took them; the read is signed
        with `key` (the job's, `JobTargets.read_key`)."""
        started = time.monotonic()
        answerer = Answerer(target.pod, str(target.attempt)) if target.sealed else None
        try:
            exchanged = self.exchange(target.ip, target.port, self.timeout, messages, read, key,
                                      answerer)  # fmt: skip
        except Exception as exc:  # a poll must never take the poller down
            why = f"{type(exc).__name__}: {exc}"
            exchanged = Exchanged(None, why, tuple((m, why) for m in messages))
        took = time.monotonic() - started
        for message, why in exchanged.refused:  # an old sidecar without /replica: no line each
            level = logging.INFO if message.path == CONTROL_PATH else logging.DEBUG
            log.log(level, "%s: %s", target.pod, why)
        return Answer(exchanged.body, exchanged.error, self.clock().timestamp(),
                      tuple(m for m, _ in exchanged.refused), took)  # fmt: skip

    def _to_send(
        self, ident: tuple[Key, int, str], messages: Sequence[PollMessage], now: float
    ) -> tuple[PollMessage, ...]:
        """The messages for a pod, less those its sidecar took less than RESTING_SECONDS ago:
        a restart's close rounds post each order once and then only read the pod back
        (posted again after that, in case a new sidecar lost it; all are idempotent)."""
        out = []
        for message in messages:
            signature, sent = self._taken.get((*ident, message.path), ("", -RESTING_SECONDS))
            if signature != message.signature or now - sent >= RESTING_SECONDS:
                out.append(message)
        return tuple(out)

    async def _ask(
        self, asks: Sequence[tuple[PollTarget, tuple[PollMessage, ...], bool, str | None]]
    ) -> list[Answer]:
        """Every pod's answer, in order: `concurrency` workers each take the next pod still
        to ask until none is left (a pod that answers slowly holds one worker, not a share
        of the round; one task per worker rather than per pod keeps a round at 1,000+ pods
        from costing a future and a thread hand-off per pod)."""
        answers: list[Answer | None] = [None] * len(asks)
        todo: queue.SimpleQueue[int] = queue.SimpleQueue()
        for i in range(len(asks)):
            todo.put(i)

        def work() -> None:
            while True:
                try:
                    i = todo.get_nowait()
                except queue.Empty:
                    return
                answers[i] = self._get(*asks[i])

        loop = asyncio.get_running_loop()
        workers = min(self.concurrency, len(asks))
        await asyncio.gather(*(loop.run_in_executor(self._executor, work) for _ in range(workers)))
        arrived = self.clock().timestamp()
        lost = "not asked (a poller worker failed)"
        return [a if a is not None else Answer(None, lost, arrived, ask[1])
                for a, ask in zip(answers, asks, strict=True)]  # fmt: skip

    async def poll_once(self, jobs: Sequence[JobTargets]) -> None:
        """One round over every job's targets, then one `on_round(key)` per job."""
        messages = {job.key: job.messages for job in jobs}
        read_keys = {job.key: job.read_key for job in jobs}
        self._orders_out = any(job.ordering for job in jobs)
        now = time.monotonic()
        flat: list[tuple[Key, PollTarget]] = []
        rested: set[tuple[Key, int, str]] = set()
        for job in jobs:
            ordering = job.ordering
            for t in job.targets:
                ident = (job.key, t.attempt, t.pod)
                if ordering and job.pressing(t.pod):
                    flat.append((job.key, t))  # still to carry its order out: every round
                elif not self._due(job.key, t):
                    continue  # not answering: asked again after its back-off
                elif not self._orders_out or not self._fresh(ident, now, ordering):
                    flat.append((job.key, t))
                else:  # close rounds: its last answer stands until the usual pace
                    rested.add(ident)
        flat = self._within_budgets(jobs, flat, rested)
        sending, reads = [], []
        for key, t in flat:
            ident = (key, t.attempt, t.pod)
            sent = self._to_send(ident, messages[key].get(t.pod, ()), now)
            # a pod given a restart order for the first time is not read after it: its
            # sidecar's answer carries the pod's report once the supervisor took the order
            # (an older sidecar's does not: the pod is read in the next close round); an
            # order posted again, refused or lost before, is read back at once
            read = ident in self._quiet or not any(
                m.path == CONTROL_PATH and not m.standing
                and self._tried.get((*ident, m.path)) != m.signature
                for m in sent
            )  # fmt: skip
            for m in sent:
                self._tried[(*ident, m.path)] = m.signature
            if not read:
                rested.add(ident)
            sending.append(sent)
            reads.append(read)
        answers = await self._ask([(t, sent, read, read_keys[key]) for (key, t), sent, read
                                   in zip(flat, sending, reads, strict=True)])  # fmt: skip
        received = self.clock().timestamp()
        by_pod: dict[tuple[Key, int, str], tuple[Any, str | None, float]] = {}
        for (key, t), sent, read, answer in zip(flat, sending, reads, answers, strict=True):
            ident = (key, t.attempt, t.pod)
            # only a valid answer's time prices the pod (`policy.poll_budget`): a pod that
            # fails is bounded by its back-off, and must keep being asked, or a frozen node's
            # pods, left out, would read as answered by their last report (liveness)
            self._cost[ident] = answer.took if answer.error is None else 0.0
            if not read and isinstance(answer.body, Mapping):
                read = True  # the order's answer carried the pod's report: read after all
                rested.discard(ident)
            if read:
                by_pod[ident] = (answer.body, answer.error, answer.arrived)
                if isinstance(answer.body, Mapping):  # a usable answer: it may rest a while
                    self._read_at[ident] = now
            for message in sent:
                if message not in answer.refused:
                    self._taken[(*ident, message.path)] = (message.signature, now)
        self._note_answers([(key, t, *by_pod[ident][1:]) for key, t in flat
                            if (ident := (key, t.attempt, t.pod)) in by_pod])  # fmt: skip
        self._prune({(job.key, t.attempt, t.pod) for job in jobs for t in job.targets},
                    {(t.ip, t.port) for job in jobs for t in job.targets})  # fmt: skip
        wanted = {job.key for job in jobs}
        with self._lock:
            dropped = [k for k in self._readings if k not in wanted]
            for key in dropped:
                self._readings.pop(key, None)
                self._stragglers.pop(key, None)
        for key in dropped:  # no longer running: its readings (and gauges) go
            self._job_round(key, partial(self.on_round, key))
        for gone in [k for k in self.job_errors if k not in wanted]:
            self.job_errors.pop(gone, None)
            self._failing.discard(gone)
        for gone in [k for k in self.left_out if k not in wanted]:
            self.left_out.pop(gone, None)
        for job in jobs:
            self._job_round(job.key, partial(self._round_of, job, by_pod, received, rested))
        self.rounds += 1

    def _within_budgets(
        self, jobs: Sequence[JobTargets], flat: Sequence[tuple[Key, PollTarget]],
        rested: set[tuple[Key, int, str]],
    ) -> list[tuple[Key, PollTarget]]:  # fmt: skip
        """The round's asks with each job held to its budget (`policy.poll_budget`), one
        job's in turn: the pods left out join `rested` (their last report stands) and go
        first in the job's next round."""
        by_job: dict[Key, list[PollTarget]] = {}
        for key, t in flat:
            by_job.setdefault(key, []).append(t)
        kept: list[list[tuple[Key, PollTarget]]] = []
        for job in jobs:
            targets = by_job.pop(job.key, [])
            if not targets:
                self.left_out.pop(job.key, None)
                continue
            idents = {t.pod: (job.key, t.attempt, t.pod) for t in targets}
            asks = [poll_budget.PodAsk(t.pod, self._cost.get(idents[t.pod]),
                                       self._waiting.get(idents[t.pod], 0),
                                       job.ordering and job.pressing(t.pod))
                    for t in targets]  # fmt: skip
            budget = poll_budget.job_budget(len(job.targets), self.pod_share,
                                            self.min_job_budget)  # fmt: skip
            asked, left_out = poll_budget.choose(asks, budget, self.pod_share)
            for pod in left_out:
                self._waiting[idents[pod]] = self._waiting.get(idents[pod], 0) + 1
                if idents[pod] not in self._quiet:  # one not answering stays unanswered
                    rested.add(idents[pod])
            for pod in asked:
                self._waiting.pop(idents[pod], None)
            self.left_out[job.key] = len(left_out)
            if left_out:
                log.debug("%s/%s: %d pods left out of this round (its time budget, %.1f s)",
                          *job.key, len(left_out), budget)  # fmt: skip
            chosen = set(asked)
            kept.append([(job.key, t) for t in targets if t.pod in chosen])
        return poll_budget.interleave(kept)

    def _round_of(
        self,
        job: JobTargets,
        answers: Mapping[tuple[Key, int, str], tuple[Any, str | None, float]],
        received: float,
        rested: Collection[tuple[Key, int, str]],
    ) -> None:
        self._keep(job, answers, received, rested)
        self.on_round(job.key)

    def _job_round(self, key: Key, work: Callable[[], None]) -> None:
        """One job's part of a round. An unexpected error in it is that job's alone: counted
        against it (`job_errors`), logged with its name at the first of a run of failures,
        and the round goes on for the other jobs (its last reading stands, and ages out)."""
        try:
            work()
        except Exception:
            self.job_errors[key] = self.job_errors.get(key, 0) + 1
            if key in self._failing:
                log.debug("progress round failed again for %s/%s", *key, exc_info=True)
            else:
                self._failing.add(key)
                log.exception("progress round failed for %s/%s (the other jobs go on)", *key)
        else:
            self._failing.discard(key)

    def _due(self, key: Key, target: PollTarget) -> bool:
        held = self._quiet.get((key, target.attempt, target.pod))
        return held is None or held[1] <= self.rounds

    def _fresh(self, ident: tuple[Key, int, str], now: float, ordering: bool) -> bool:
        """Answered when last asked, recently enough that a close round need not ask again
        (its last answer still stands): RESTING_SECONDS for a pod of the job under restart,
        the poll period for another job's (close rounds are not its pace)."""
        asked = self._read_at.get(ident)
        rest = RESTING_SECONDS if ordering else self.interval
        return asked is not None and now - asked < rest and ident not in self._quiet

    def _note_answers(self, answers: Sequence[tuple[Key, PollTarget, str | None, float]]) -> None:
        for key, target, error, arrived in answers:
            ident = (key, target.attempt, target.pod)
            if error is None:
                self._quiet.pop(ident, None)
                continue
            failures, _, first = self._quiet.get(ident, (0, 0, arrived))
            skip = min(2**failures, MAX_SKIPPED_ROUNDS)
            self._quiet[ident] = (failures + 1, self.rounds + 1 + skip, first)

    def _prune(
        self, current: set[tuple[Key, int, str]], addresses: Collection[tuple[str, int]]
    ) -> None:
        """Forget pods no job polls any more (their attempt ended, or they went): bounded.
        Connections are kept to this round's `addresses` only."""
        if len(self._quiet) > 2 * max(len(current), 1024):
            self._quiet = {k: v for k, v in self._quiet.items() if k in current}
        if len(self._read_at) > 2 * max(len(current), 1024):
            self._read_at = {k: v for k, v in self._read_at.items() if k in current}
        if len(self._cost) > 2 * max(len(current), 1024):
            self._cost = {k: v for k, v in self._cost.items() if k in current}
        self._waiting = {k: v for k, v in self._waiting.items() if k in current}
        if len(self._taken) > 4 * max(len(current), 1024):
            self._taken = {k: v for k, v in self._taken.items() if k[:3] in current}
        if len(self._tried) > 4 * max(len(current), 1024):
            self._tried = {k: v for k, v in self._tried.items() if k[:3] in current}
        if self.connections is not None:
            self.connections.keep_only(addresses)

    def _keep(
        self,
        job: JobTargets,
        answers: Mapping[tuple[Key, int, str], tuple[Any, str | None, float]],
        received: float,
        rested: Collection[tuple[Key, int, str]] = (),
    ) -> None:
        """The job's reading from this round's answers (`poll_readings.reading_of`)."""
        with self._lock:
            held = self._readings.get(job.key)
            state = self._stragglers.get(job.key)
        quiet = {t.pod: q[2] for t in job.targets
                 if (q := self._quiet.get((job.key, t.attempt, t.pod))) is not None}  # fmt: skip
        reading, verdict_state = poll_readings.reading_of(
            job.key, job.targets, answers, received, rested, held, state, quiet,
            job.straggler_ratio, job.straggler_windows,
        )  # fmt: skip
        with self._lock:
            self._readings[job.key] = reading
            self._stragglers[job.key] = verdict_state

    def poke(self) -> None:
        """Start the next round now (an in-place restart's next order must not wait for the
        period). Call from the event loop."""
        if self._poked is not None:
            self._poked.set()

    async def run(self, jobs: Callable[[], Iterable[JobTargets]]) -> None:
        """Poll forever (cancel to stop)."""
        self._poked = asyncio.Event()
        while True:
            started = time.monotonic()
            self._poked.clear()
            try:
                await self.poll_once([j for j in jobs() if j.targets])
            except Exception:
                log.exception("progress poll round failed")
            # a round every `interval` (not a round plus `interval`): detection waits at most
            # one period for the next look, whatever a round costs; a poke starts it at once,
            # and while a job has restart orders out the rounds follow each other closely
            interval = min(self.interval, ORDER_INTERVAL) if self._orders_out else self.interval
            wait = max(interval - (time.monotonic() - started), 0.0)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._poked.wait(), wait)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        if self.connections is not None:
            self.connections.close()
