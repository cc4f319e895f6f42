"""Drill on real training through the pod runner (issue 45): elastic N-k. Four worker pods
train ``examples/elastic_train.py`` (gloo, one rank a pod, the global batch kept by
``ElasticBatchSampler``) on a platform of five nodes, one of them cordoned: no free node.
Rank 1's node goes silent with its processes frozen: judged lost, quarantined, its pod
replaced, and the replacement cannot be scheduled. After ``waitForReplacementSeconds`` the
three survivors restart in place as a world of 3 (pods 2 and 3 become ranks 1 and 2) and
train on. The cordoned node is then freed: the replacement runs, held by its supervisor,
and the world grows back to 4, every pod at its own rank, and finishes. One attempt; every epoch's
samples consumed exactly once; the losses within the distance a no-fault 3-rank run keeps
from a no-fault 4-rank one; the last step and the optimizer's step count as the no-fault
run's. The grow-back's stop lets the healthy world save at its next step boundary (saves
are every 8 steps otherwise): the grown world trains no step again.

The job keeps a fast tier every 2 steps, so the survivors hold fast steps newer than the
durable one when they shrink; the fast tier's copies are per rank and the ranks change, so
the shrink resumes every survivor from the newest durable step, never a mix of fast steps
from two worlds (issue 45 with issue 43's lineage), and says why on its entry.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from e2e.demo import drills, elastic_logs, story
from e2e.operator_proc import wait_for
from rtj_operator.api import keys
from rtj_shim.fast import fast_tier

pytestmark = [pytest.mark.demo, pytest.mark.timeout(900)]

JOB = "drill-elastic"
WORKERS = 4  # the drill; shrunk to WORKERS - 1
STEPS, SAMPLES, GLOBAL_BATCH, MICRO = 96, 96, 12, 4  # 12 epochs; 12 = 4 x 3 = 3 x 4
SAVE_EVERY = 8  # the grow-back's stop saves at the boundary: it trains no step again
FAST_EVERY = 2  # the survivors hold fast steps newer than the durable one when they shrink
ARGS = [f"--steps={STEPS}", f"--samples={SAMPLES}", f"--global-batch={GLOBAL_BATCH}",
        f"--micro-batch={MICRO}", f"--save-every={SAVE_EVERY}"]  # fmt: skip


def _job() -> dict[str, Any]:
    body = drills.job(JOB, recovery={"inPlace": True, "inPlaceDeadlineSeconds": 90},
                      elastic={"minReplicas": WORKERS - 1, "waitForReplacementSeconds": 10},
                      replicas=WORKERS)  # fmt: skip
    body["spec"]["checkpoint"]["fastTier"] = {"everySteps": FAST_EVERY, "keep": 4}
    container = body["spec"]["template"]["spec"]["containers"][0]
    container["command"] = ["python", "examples/elastic_train.py",
                            "--root=$(RTJ_CHECKPOINT_URI)", "--log-dir=/var/log/train",
                            "--step-sleep=0.15", *ARGS]  # fmt: skip
    return body


def _fast_holdings(opts: story.Options, pod: dict[str, Any]) -> list[int]:
    """The fast steps every rank directory of `pod`'s fast tier holds in one lineage."""
    return fast_tier.holdings(story._pod_dir(opts, pod) / "volumes" / keys.FAST_TIER_VOLUME)


def _world_size(api: Any) -> int | None:
    record = (drills.status(api, JOB).get("attempts") or [{}])[-1]
    size = record.get("worldSize")
    return int(size) if size is not None else None


def test_a_node_lost_with_no_free_node_shrinks_the_world_then_it_grows_back(
    tmp_path: Path,
) -> None:
    with drills.controlling_platform(tmp_path, "rtj-elastic", WORKERS + 1) as platform:
        opts, api, kube = platform.opts, platform.api, platform.kube
        nodes = sorted(n.metadata.name for n in kube.core.list_node().items)
        spare_node = nodes[-1]
        kube.core.patch_node(spare_node, {"spec": {"unschedulable": True}})  # no free node
        api.create_rtj(story.NAMESPACE, _job())
        before = drills.scheduled(api, JOB, WORKERS)
        victim = drills.rank_pod(before, 1)
        survivors = [p for p in before if p is not victim]
        log0 = drills.rank_log(opts, drills.rank_pod(before, 0), 0)
        # cut between durable saves, past a fast step: the survivors then hold a fast step
        # newer than the durable one (fast every 2 steps, durable every 8)
        wait_for("20 steps trained, between durable saves", lambda: (
            (t := drills.trained(log0)) >= 20 and 3 <= t % SAVE_EVERY <= 6), 300, 0.05)  # fmt: skip
        (cut,) = drills.cut_off(opts, [victim])
        try:
            # the survivors wait on the frozen rank: their fast tiers hold what they saved
            wait_for("the failure seen", lambda: drills.status(api, JOB).get("inPlace"), 120, 0.2)
            fast_held = {p["metadata"]["name"]: _fast_holdings(opts, p) for p in survivors}
            wait_for(f"the world shrunk to {WORKERS - 1}",
                     lambda: _world_size(api) == WORKERS - 1, 240, 0.5)  # fmt: skip
            status = drills.status(api, JOB)
            # renumbered in their order: the survivors past the lost rank each move down one
            moved = {drills.rank_pod(before, r)["metadata"]["name"]: r - 1
                     for r in range(2, WORKERS)}  # fmt: skip
            assert status["attempts"][-1]["spareRanks"] == moved
            shrunk_at = drills.trained(log0)
            wait_for(f"10 steps trained as a world of {WORKERS - 1}", lambda: any(
                r["world"] == WORKERS - 1 and r["step"] >= shrunk_at + 10
                for recs in elastic_logs.newest_records(
                    elastic_logs.pod_dirs(opts, drills.pods(api, JOB, 1))
                ).values()
                for r in recs
            ), 240, 0.5)  # fmt: skip
            kube.core.patch_node(spare_node, {"spec": {"unschedulable": False}})
            wait_for(f"the world grown back to {WORKERS}",
                     lambda: _world_size(api) == WORKERS, 240, 0.5)  # fmt: skip
            wait_for(
                "the job to succeed",
                lambda: drills.status(api, JOB).get("phase") == "Succeeded",
                600,
                1.0,
            )
        finally:
            cut.unlink(missing_ok=True)
        status = drills.status(api, JOB)
        assert status["attempt"] == 1 and len(status["attempts"]) == 1, status["attempts"]
        entries = status["attempts"][0]["inPlaceRestarts"]
        assert [e.get("worldSize") for e in entries] == [WORKERS - 1, WORKERS], entries
        assert entries[0]["failureClass"] == "NodeLost" and entries[1].get("failureClass") is None
        shrink = entries[0]
        durable = shrink["resumedFromStep"]
        # newer fast steps were held by every survivor, yet the shrink pinned the durable step
        assert durable is not None and durable % SAVE_EVERY == 0, shrink
        assert shrink.get("resumedFromFastStep") is None, shrink
        assert shrink["fastTierFallback"] == f"the world changes to {WORKERS - 1} pods", shrink
        assert all(max(held, default=0) > durable for held in fast_held.values()), (
            durable, fast_held)  # fmt: skip
        dirs = elastic_logs.pod_dirs(opts, [*before, *drills.pods(api, JOB, 1)])
        records = elastic_logs.newest_records(dirs)
        trained = elastic_logs.steps_by_generation(dirs)

    # the grow-back's stop lets the healthy world save at its next boundary: generation 2
    # starts where generation 1 stopped, none again (this model's save takes well under the
    # supervisor's 1 s; Order.save_seconds keeps it so for a longer one, which
    # tests/integration/shim/test_supervisor.py shows)
    assert min(trained[2]) == max(trained[1]) + 1, (min(trained[2]), max(trained[1]))

    assert sorted(records) == list(range(1, STEPS + 1)), "every optimizer step, once"
    worlds = [records[s][0]["world"] for s in sorted(records)]
    assert worlds[0] == WORKERS and worlds[-1] == WORKERS and WORKERS - 1 in worlds, worlds
    assert all(len(records[s]) == records[s][0]["world"] for s in records), "a rank each"
    assert elastic_logs.epochs_exactly_once(records, SAMPLES, GLOBAL_BATCH) == []
    full = elastic_logs.no_fault_losses(tmp_path, WORKERS, ARGS)
    shrunk = elastic_logs.no_fault_losses(tmp_path, WORKERS - 1, ARGS)
    tolerance = max(abs(full[s] - shrunk[s]) for s in full)
    drift = max(abs(records[s][0]["loss"] - full[s]) for s in full)
    sys.stdout.write(
        f"\nelastic drill: drift {drift:.3g}, {WORKERS} vs {WORKERS - 1} ranks {tolerance:.3g}\n"
    )
    assert drift <= max(2 * tolerance, 1e-5), (drift, tolerance)
