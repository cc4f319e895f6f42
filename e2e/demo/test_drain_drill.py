"""The fast tier's drain on real training through the pod runner (issue 16).

Two pods (the example trainer, restart in place, fast steps every 5, no peer replica), the
trainers' own durable saves only every 200 steps, and ``drainEverySteps: 20``: the progress
sidecar of the pod holding rank 0 publishes every 20th fast step to the S3 store (rank 1's
file read from the other pod's sidecar), leaving 200 and 400 to the trainers. Then rank 1's
node goes silent with its processes frozen: its pod is replaced, and with no copy of its fast
steps anywhere the restart falls back to the durable tier, whose newest step is a drained
one, far newer than the trainers' own 200. The finished model equals the no-fault run bit
for bit.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from e2e.demo import drills, story
from e2e.operator_proc import wait_for
from rtj_shim.checkpoint.layout import MANIFEST_FILE, step_key
from rtj_shim.checkpoint.manifest import decode_manifest
from rtj_shim.checkpoint.storage import open_store
from rtj_shim.checkpoint.storage.base import CheckpointStore

JOB = "drill-drain"
STEPS, SAVE_EVERY, FAST_EVERY, DRAIN_EVERY = 400, 200, 5, 20

pytestmark = pytest.mark.timeout(1200)


def _rank_lines(opts: story.Options, pod: dict[str, Any], rank: int) -> list[str]:
    path = drills.rank_log(opts, pod, rank)
    return path.read_text().splitlines() if path.exists() else []


def _job() -> dict[str, Any]:
    body = drills.in_place_job(JOB, SAVE_EVERY, STEPS)
    body["spec"]["checkpoint"]["retention"] = {"keepLast": 100}  # the listing shows them all
    body["spec"]["checkpoint"]["fastTier"] = {
        "everySteps": FAST_EVERY, "keep": 4, "peerReplicas": 0, "drainEverySteps": DRAIN_EVERY,
    }  # fmt: skip
    return body


@contextmanager
def _store(kube: Any) -> Iterator[CheckpointStore]:
    """The job's S3 root, read with the credentials its pods get (the demo's Secret)."""
    secret = kube.core.read_namespaced_secret(story.SECRET, story.NAMESPACE)
    env = {k: base64.b64decode(v).decode() for k, v in secret.data.items()}
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        yield open_store(f"s3://{story.BUCKET}/{JOB}")
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _published(store: CheckpointStore) -> dict[int, bool]:
    """Published step -> whether the drain made it (its manifest says drained_from)."""
    out = {}
    for entry in store.list_step_dirs():
        if entry.name.in_progress:
            continue
        raw = store.read(step_key(entry.name.step, MANIFEST_FILE))
        if raw is not None:
            manifest = decode_manifest(raw)
            out[entry.name.step] = manifest.extra.get("drained_from") == "fast-tier"
    return out


def test_a_drained_step_is_what_a_replaced_pod_without_a_fast_step_resumes_from(
    tmp_path: Path,
) -> None:
    with drills.controlling_platform(
        tmp_path, "rtj-drain", 3,
        "--checkpoint-refresh-seconds", "2",  # the store read often: drained steps seen
    ) as platform:  # fmt: skip
        opts, kube, api = platform.opts, platform.kube, platform.api
        api.create_rtj(story.NAMESPACE, _job())
        before = drills.scheduled(api, JOB, 2)
        survivor, victim = drills.rank_pod(before, 0), drills.rank_pod(before, 1)

        def trained() -> int:
            return max(drills.losses(_rank_lines(opts, survivor, 0)), default=0)

        def verified() -> int:
            found = drills.status(api, JOB).get("lastVerifiedCheckpoint") or {}
            return int(found.get("step") or 0)

        # the operator has read a drained step past the trainers' own first save, and
        # training is well before their next one
        wait_for(f"a drained step the operator verified, past {SAVE_EVERY}", lambda: (
            verified() > SAVE_EVERY + DRAIN_EVERY and trained() < 2 * SAVE_EVERY - 40
        ), 400, 0.2)  # fmt: skip
        drained_seen = verified()
        (cut,) = drills.cut_off(opts, [victim])
        frozen = time.monotonic()
        try:
            entry = drills.first_restart_after(
                api, JOB, frozen, "the replacement and the in-place restart"
            )
            assert entry["outcome"] == "Running" and entry["failureClass"] == "NodeLost", entry

            def succeeded() -> bool:
                return drills.status(api, JOB).get("phase") == "Succeeded"

            wait_for("the job to succeed", succeeded, 600, 1.0)
        finally:
            cut.unlink(missing_ok=True)
        status = drills.status(api, JOB)
        assert status["attempt"] == 1 and len(status["attempts"]) == 1, status["attempts"]

        # no fast step for the replaced pod (no replica): the durable tier, a drained step
        assert entry.get("resumedFromFastStep") is None, entry
        assert "holds no fast step" in (entry.get("fastTierFallback") or ""), entry
        resumed = entry["resumedFromStep"]
        with _store(kube) as store:
            published = _published(store)
        assert published.get(resumed) is True, (resumed, published)
        assert resumed >= drained_seen > SAVE_EVERY, (resumed, drained_seen)
        # the trainers' own saves stay theirs; every other published step is a drained one
        assert published.get(SAVE_EVERY) is False and published.get(STEPS) is False, published
        assert all(s % DRAIN_EVERY == 0 for s, drained in published.items() if drained)
        sys.stdout.write(f"resumed from drained step {resumed} (the trainers' own durable "
                         f"step {SAVE_EVERY}); published {sorted(published)}\n")  # fmt: skip

        after = drills.pods(api, JOB, 1)
        replacement = drills.rank_pod(after, 1)
        assert replacement["metadata"]["uid"] != victim["metadata"]["uid"]
        got = {0: drills.losses(_rank_lines(opts, survivor, 0)),
               1: drills.losses(_rank_lines(opts, replacement, 1))}  # fmt: skip
        restores = [json.loads(x) for x in _rank_lines(opts, replacement, 1) if '"restore"' in x]
        assert [r["step"] for r in restores] == [resumed], restores
        want = drills.no_fault_losses(tmp_path, STEPS, SAVE_EVERY)
        for rank in (0, 1):
            diff = sorted(s for s in got[rank] if got[rank][s] != want[rank][s])
            assert not diff, f"rank {rank}: {len(diff)} steps differ (first {diff[:5]})"
        assert max(got[1]) == STEPS and min(got[1]) == resumed + 1
