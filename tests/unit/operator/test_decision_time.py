"""A failure's record is dated when it is decided, after the reads its plan asked for: at
1,000 jobs a failure's Event reads took up to 20 s on a saturated API server while the
record said 1 s, because the plan kept the time its first look began (issue 49)."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

from prometheus_client import CollectorRegistry
from rtj_test_support import NOW
from rtj_world import jobset, pod, rtj_raw
from test_runtime import SHARED_BUCKET, FakeKube

from rtj_operator import controller as ctl
from rtj_operator.metrics import Metrics
from rtj_operator.reconcile.checkpoints import STORE_FRESH
from rtj_operator.selection import Selection
from rtj_operator.settings import Settings

READ_SECONDS = 4.0


class SlowEvents(FakeKube):
    """Each Event read takes READ_SECONDS on the controller's clock."""

    def __init__(self) -> None:
        super().__init__()
        self.now = NOW

    def clock(self) -> datetime:
        return self.now

    def list_events(self, namespace: str | None, selector: str) -> list[dict[str, Any]]:
        self.now += timedelta(seconds=READ_SECONDS)
        return super().list_events(namespace, selector)


def test_detection_seconds_count_the_event_reads() -> None:
    async def scenario() -> None:
        kube = SlowEvents()

        def reader(uri: str, bad: Any, credentials: Any) -> Selection:
            return Selection(1200, f"{uri}/steps/step-000000001200", NOW)

        settings = Settings(workers=1, operator_identity_stores=SHARED_BUCKET)
        c = ctl.Controller(kube, Metrics(CollectorRegistry()), settings,  # type: ignore[arg-type]
                           clock=kube.clock, store_reader=reader)  # fmt: skip
        status = {"phase": "Running", "attempt": 1, "attempts": [{"attempt": 1,
                  "jobSet": "llm-a1"}]}  # fmt: skip
        c.on_rtj(None, rtj_raw(status))
        c.on_jobset(None, jobset(1))
        c.on_pod(None, pod(1, 0, exit_code=1, message="NCCL error: unhandled system error"))
        c.on_pod(None, pod(1, 1))
        await c.reconcile(("team-a", "llm"))
        await asyncio.gather(*c._posting)
        reads = [x for x in kube.calls if x[0] == "list_events"]
        record = c.rtjs[("team-a", "llm")]["status"]["attempts"][0]
        assert record["failureClass"]
        # the pod ended at NOW; every read of this failure's Events is in its detection time
        assert record["detectionSeconds"] == READ_SECONDS * len(reads) > 0
        c.executor.shutdown()

    asyncio.run(scenario())


def test_a_slow_store_read_is_not_stale_on_arrival() -> None:
    """A store reading's age is judged from the look that asked for it: a read slower than
    STORE_FRESH (a store that hardly answers) still starts the attempt, read once."""

    async def scenario() -> None:
        kube = SlowEvents()
        reads: list[str] = []

        def reader(uri: str, bad: Any, credentials: Any) -> Selection:
            reads.append(uri)
            kube.now += STORE_FRESH * 2
            return Selection(1200, f"{uri}/steps/step-000000001200", NOW)

        settings = Settings(workers=1, operator_identity_stores=SHARED_BUCKET)
        c = ctl.Controller(kube, Metrics(CollectorRegistry()), settings,  # type: ignore[arg-type]
                           clock=kube.clock, store_reader=reader)  # fmt: skip
        c.on_rtj(None, rtj_raw())
        await c.reconcile(("team-a", "llm"))
        await asyncio.gather(*c._posting)
        assert len(reads) == 1
        assert [x[0] for x in kube.calls][:2] == ["create_jobset", "patch_status"]
        c.executor.shutdown()

    asyncio.run(scenario())
