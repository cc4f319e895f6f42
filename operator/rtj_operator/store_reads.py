"""Reading jobs' checkpoint stores without letting one store hold up another job.

Every read runs in a thread (botocore blocks) and is bounded three ways:

- **Two lanes.** Reads a restart waits for (`Lane.RESTART`) and the periodic refresh of
  checkpoint age (`Lane.REFRESH`) have their own thread pools and their own limits, so a
  round of background refreshes never queues in front of a restart.
- **Per store.** At most `per_store` reads of one store (endpoint, bucket and credentials
  secret) run at once, in each lane: a black-holed endpoint that one tenant's Secret points
  at occupies at most that many threads, and everyone else's reads go on.
- **A deadline.** A read that has not answered within `timeout` seconds is reported as an
  unreadable store (the restart waits, "never treated as no checkpoint"); the thread is
  left to finish on botocore's own bounded retries. After a failure, the refresh lane
  leaves that store alone for a growing while (2 s, doubling, up to `max_backoff`); the
  restart lane always tries (the plan's own retry timing paces it).
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import urlsplit

from rtj_operator import selection


class StoreReader(Protocol):
    def __call__(
        self, uri: str, bad_steps: Iterable[int], credentials: Mapping[str, str] | None
    ) -> selection.Selection: ...


class Lane(enum.Enum):
    RESTART = "restart"
    REFRESH = "refresh"


def _release(limit: asyncio.Semaphore, done: asyncio.Future[selection.Selection]) -> None:
    limit.release()
    if not done.cancelled():
        done.exception()  # retrieved: a read nobody waits for any more fails quietly


def operator_identity_refusal(
    uri: str, credentials_ref: str | None, allowed_prefixes: Iterable[str]
) -> str | None:
    """Why the operator must not read this store (None: it may).

    A job that names no `checkpoint.credentialsSecretRef` would have the operator read its URI
    with the operator's own cloud identity: any tenant could then make the operator read
    (and report on) any bucket that identity reaches (a confused deputy). So that is allowed
    only under the prefixes the platform team configured (`--operator-identity-store`,
    chart value operator.checkpointStores.operatorIdentityPrefixes); otherwise the job must
    bring its own credentials, which the operator then uses for that job alone."""
    if credentials_ref:
        return None
    if any(uri == p.rstrip("/") or uri.startswith(p if p.endswith("/") else p + "/")
           for p in allowed_prefixes):  # fmt: skip
        return None
    return (
        f"the operator reads {uri} only with the job's own credentials "
        "(spec.checkpoint.credentialsSecretRef): it is not under a prefix the platform team "
        "lets the operator read with its own identity (operator.checkpointStores."
        "operatorIdentityPrefixes)"
    )


def store_key(uri: str, credentials_ref: str | None) -> Hashable:
    """Which reads share a store: the bucket of the URI and the Secret that reaches it."""
    parts = urlsplit(uri)
    return (parts.scheme, parts.netloc, credentials_ref or "")


@dataclass
class _Backoff:
    failures: int = 0
    until: float = 0.0


@dataclass
class StoreReads:
    reader: StoreReader
    timeout: float = 30.0
    per_store: int = 2
    threads: int = 8
    """Threads per lane."""
    max_backoff: float = 300.0
    clock: Callable[[], float] = time.monotonic
    _pools: dict[Lane, ThreadPoolExecutor] = field(default_factory=dict)
    _limits: dict[tuple[Lane, Hashable], asyncio.Semaphore] = field(default_factory=dict)
    _backoff: dict[Hashable, _Backoff] = field(default_factory=dict)

    def _pool(self, lane: Lane) -> ThreadPoolExecutor:
        if lane not in self._pools:
            self._pools[lane] = ThreadPoolExecutor(
                self.threads, thread_name_prefix=f"rtj-store-{lane.value}"
            )
        return self._pools[lane]

    def resting(self, key: Hashable) -> bool:
        """Whether the refresh lane leaves this store alone for now (it failed recently)."""
        state = self._backoff.get(key)
        return state is not None and self.clock() < state.until

    def _note(self, key: Hashable, ok: bool) -> None:
        if ok:
            self._backoff.pop(key, None)
            return
        state = self._backoff.setdefault(key, _Backoff())
        state.failures += 1
        wait = min(2.0 * 2 ** (state.failures - 1), self.max_backoff)
        state.until = self.clock() + wait

    async def read(
        self,
        lane: Lane,
        key: Hashable,
        uri: str,
        bad_steps: Iterable[int],
        credentials: Mapping[str, str] | None,
    ) -> selection.Selection:
        """Read the store in `lane`; raises CheckpointUnreadable (also on the deadline)."""
        limit = self._limits.setdefault((lane, key), asyncio.Semaphore(self.per_store))
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.timeout):
                await limit.acquire()
                # the permit is held by the thread, not by this wait: a read past its
                # deadline keeps its store's permit until botocore gives up
                running = loop.run_in_executor(
                    self._pool(lane), self.reader, uri, tuple(bad_steps), credentials
                )
                running.add_done_callback(lambda done: _release(limit, done))
                picked = await asyncio.shield(running)
        except TimeoutError:
            self._note(key, ok=False)
            raise selection.CheckpointUnreadable(
                f"no answer from {uri} within {self.timeout:g}s (reads of this store are "
                f"limited to {self.per_store} at a time; other stores are not held up)"
            ) from None
        except selection.CheckpointUnreadable:
            self._note(key, ok=False)
            raise
        self._note(key, ok=True)
        return picked

    def shutdown(self) -> None:
        for pool in self._pools.values():
            pool.shutdown(wait=False, cancel_futures=True)
