"""What a rank's saves cost it (`rtj_shim.wire.save_costs`): the moving average, the file
beside the progress record, and the sidecar serving it only for the record's process."""

from __future__ import annotations

from pathlib import Path

import pytest

from rtj_shim.agent.progress_report import report
from rtj_shim.progress import Progress
from rtj_shim.wire import save_costs
from rtj_shim.wire.save_costs import (
    EAGER_SAVES,
    SMOOTHING,
    Recorder,
    SaveCosts,
    SaveCostsError,
    SaveTier,
    TierCost,
)


def test_the_average_leans_on_the_newest_save_and_counts_them() -> None:
    costs = SaveCosts(7).with_save(SaveTier.DURABLE, 2.0).with_save(SaveTier.DURABLE, 4.0)
    durable = costs.tiers[SaveTier.DURABLE]
    assert durable.saves == 2
    assert durable.seconds == pytest.approx((1 - SMOOTHING) * 2.0 + SMOOTHING * 4.0)
    assert SaveTier.FAST not in costs.tiers
    assert SaveCosts.parse(costs.encode()) == costs


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"schema": 2, "pid": 1, "tiers": {}}, "save_costs.schema"),
        ({"schema": 1, "pid": -1, "tiers": {}}, "save_costs.pid"),
        ({"schema": 1, "pid": 1, "tiers": []}, "save_costs.tiers"),
        ({"schema": 1, "pid": 1, "tiers": {"durable": {"seconds": -1, "saves": 1}}},
         "save_costs.tiers.durable.seconds"),
        ({"schema": 1, "pid": 1, "tiers": {"fast": {"seconds": 1e9, "saves": 1}}},
         "save_costs.tiers.fast.seconds"),
        ({"schema": 1, "pid": 1, "tiers": {"fast": {"seconds": 0.1, "saves": 0}}},
         "save_costs.tiers.fast.saves"),
    ],
)  # fmt: skip
def test_a_bad_record_names_its_field(body: object, field: str) -> None:
    with pytest.raises(SaveCostsError, match=field.replace(".", r"\.")):
        SaveCosts.parse(body)


def test_a_newer_shims_tier_is_not_this_readers() -> None:
    body = {"schema": 1, "pid": 3, "tiers": {"nvme": {"seconds": 1, "saves": 1}}}
    assert SaveCosts.parse(body).tiers == {}


def test_the_recorder_writes_its_first_saves_then_at_most_every_gap(tmp_path: Path) -> None:
    path = tmp_path / "rank-00000.saves"
    save_costs.write(path, SaveCosts(1, {SaveTier.FAST: TierCost(9.0, 4)}))
    recorder = Recorder(path, 2)
    assert not path.exists()  # an older process's costs are not this one's
    for _ in range(EAGER_SAVES):
        recorder.note(SaveTier.FAST, 0.05)
        found = save_costs.read(path)
        assert found == recorder.costs
    recorder.note(SaveTier.FAST, 0.5)  # within the gap: kept, not written
    found = save_costs.read(path)
    assert found is not None and found.tiers[SaveTier.FAST].saves == EAGER_SAVES
    recorder.note(SaveTier.DURABLE, 3.0)  # a tier's first saves are written at once
    found = save_costs.read(path)
    assert found is not None and found.tiers[SaveTier.DURABLE].seconds == 3.0
    assert found.tiers[SaveTier.FAST].saves == EAGER_SAVES + 1


def test_the_sidecar_serves_the_costs_of_the_records_process_only(tmp_path: Path) -> None:
    progress = Progress(tmp_path, rank=0, local_rank=0)
    try:
        assert "save_costs" not in report(tmp_path)["ranks"][0]  # no save yet
        progress.note_save(SaveTier.DURABLE, 1.25)
        entry = report(tmp_path)["ranks"][0]
        assert entry["save_costs"] == {"durable": {"seconds": 1.25, "saves": 1}}
        path = save_costs.path_for(progress.path)
        save_costs.write(path, SaveCosts(progress._pid + 1, {SaveTier.DURABLE: TierCost(1, 1)}))
        assert "save_costs" not in report(tmp_path)["ranks"][0]  # another process's
        path.write_text("{not json")
        body = report(tmp_path)
        assert "save_costs" not in body["ranks"][0]
        assert body["errors"] and body["errors"][0]["file"] == path.name
    finally:
        progress.close()
