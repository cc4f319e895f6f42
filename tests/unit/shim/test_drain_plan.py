"""The drain's plan: which files of which rank's fast step make the durable step (pure)."""

from __future__ import annotations

import hashlib

import pytest

from rtj_shim.checkpoint.manifest import FileEntry, Manifest, utc_now
from rtj_shim.fast.drain import DRAINED_FROM, DrainError, compose, trainers_publish
from rtj_shim.fast.drain_sidecar import due_step

STEP = 45


def entry(path: str, content: str) -> FileEntry:
    return FileEntry(
        path=path, bytes=len(content), sha256=hashlib.sha256(content.encode()).hexdigest()
    )


def fast_manifest(
    rank: int, world: int = 2, step: int = STEP, common: str = "a", run: str = "run-a",
    lineage: str = "0123456789abcdef",
) -> Manifest:  # fmt: skip
    """Rank ``rank``'s fast step as `rtj_shim.torch.fast_save` publishes it."""
    return Manifest(
        run_id=run, step=step, world_size=world, parallelism={"data_parallel": world},
        created_at=utc_now(),
        files=(entry("common/skeleton.pt", common), entry("common/shard-00000.pt", "b"),
               entry(f"ranks/rank-{rank:05d}.pt", f"{rank}")),
        extra={"tier": "fast", "torch": {"layout": "replicated"}, "loss": 0.5,
               "lineage": lineage},
    )  # fmt: skip


def test_the_durable_step_is_the_replicated_part_once_and_every_ranks_own_file() -> None:
    plan = compose(STEP, {0: fast_manifest(0), 1: fast_manifest(1)})
    assert [(u.rank, u.entry.path) for u in plan.uploads] == [
        (0, "common/shard-00000.pt"), (0, "common/skeleton.pt"),
        (0, "ranks/rank-00000.pt"), (1, "ranks/rank-00001.pt"),
    ]  # fmt: skip
    assert (plan.step, plan.run_id, plan.metadata.world_size) == (STEP, "run-a", 2)
    assert plan.metadata.parallelism == {"data_parallel": 2}
    # rank 0's provenance, scores and torch layout; not marked as a fast step any more
    assert plan.metadata.extra == {
        "torch": {"layout": "replicated"}, "loss": 0.5, "drained_from": DRAINED_FROM,
        "lineage": "0123456789abcdef",  # the history it continues, as the fast step's
    }  # fmt: skip


@pytest.mark.parametrize(
    ("manifests", "message"),
    [
        ({1: fast_manifest(1)}, "rank 0's fast step is missing"),
        ({0: fast_manifest(0)}, r"world size 2, ranks missing \[1\]"),
        ({0: fast_manifest(0, world=1), 1: fast_manifest(1, world=1)},
         r"ranks outside the world \[1\]"),
        ({0: fast_manifest(0), 1: fast_manifest(1, step=50)}, "rank 1: its manifest is of step 50"),
        ({0: fast_manifest(0), 1: fast_manifest(1, common="z")},
         r"rank 1: its replicated part differs from rank 0's in \['common/skeleton.pt'\]"),
        ({0: fast_manifest(0), 1: fast_manifest(1, run="run-b")}, "not one world's step"),
        ({0: fast_manifest(0), 1: fast_manifest(1, lineage="fedcba9876543210")},
         "rank 1: its step 45 is of lineage fedcba9876543210, rank 0's of 0123456789abcdef "
         r"\(two histories are not drained\)"),
        ({0: fast_manifest(0), 1: fast_manifest(0)},
         r"rank 1: expected only its own files under ranks/, found \['ranks/rank-00000.pt'\]"),
    ],
)  # fmt: skip
def test_fast_steps_that_do_not_make_one_worlds_complete_step_are_refused(
    manifests: dict[int, Manifest], message: str
) -> None:
    with pytest.raises(DrainError, match=message):
        compose(STEP, manifests)


# -- whose step is it: the trainers' own saves are theirs --------------------------------


@pytest.mark.parametrize(
    ("step", "schedule", "theirs"),
    [
        (40, {"every_steps": 20, "every_seconds": None, "by_metric": False}, True),
        (45, {"every_steps": 20, "every_seconds": None, "by_metric": False}, False),
        (45, {"every_steps": None, "every_seconds": None, "by_metric": False}, False),
    ],
)
def test_the_drain_leaves_the_trainers_scheduled_steps_to_them(
    step: int, schedule: dict[str, object], theirs: bool
) -> None:
    assert trainers_publish(step, {"durable_schedule": schedule}) is theirs


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({}, "does not record the trainers' durable schedule"),
        ({"durable_schedule": {"every_steps": 20, "every_seconds": 600.0}}, "every_seconds"),
        ({"durable_schedule": {"every_steps": 20, "by_metric": True}}, "metric improves"),
    ],
)
def test_a_schedule_that_can_pick_any_step_is_not_drained(
    extra: dict[str, object], message: str
) -> None:
    with pytest.raises(DrainError, match=message):
        trainers_publish(45, extra)


def test_the_due_step_is_the_newest_multiple_not_yet_drained() -> None:
    assert due_step([40, 45], 5, None) == 45
    assert due_step([40, 45], 20, None) == 40  # not the newest: the newest multiple
    assert due_step([40, 45], 5, 45) is None
    assert due_step([40, 45], 7, None) is None
    assert due_step([], 5, None) is None
