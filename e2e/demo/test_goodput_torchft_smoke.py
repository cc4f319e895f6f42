"""The goodput soak's TorchFT baseline, short (`python -m bench.goodput_baseline --launcher
torchft` is the long one, in `make bench`): two replica groups of examples/torchft_train.py
in a JobSet with TorchFT's lighthouse, on the pod runner. A killed group's Job starts a new
pod that heals live from the surviving group (which trains on alone meanwhile); an evicted
group the same; both groups end with the same model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from bench import goodput, goodput_baseline
from bench.soak_schedule import Fault

pytestmark = [pytest.mark.demo, pytest.mark.timeout(600)]


def test_torchft_groups_rejoin_and_heal_live(tmp_path: Path) -> None:
    opts = goodput.SoakOptions(
        steps=500,
        save_every=50,
        work=tmp_path / "soak",
        faults=[Fault(5.0, "rank_killed", 1), Fault(20.0, "eviction", 0)],
    )
    facts = goodput_baseline.run(opts, cap=240.0, launcher="torchft")
    sys.stdout.write(json.dumps({k: facts[k] for k in ("goodput", "findings", "recoveries")}))
    assert facts["problems"] == []
    assert [f["kind"] for f in facts["injected"]] == ["rank_killed", "eviction"]
    assert all(not f["what"].startswith("skipped") for f in facts["injected"])
    assert facts["completed"] == "Completed" and facts["reached_step"] == 500
    assert facts["steps_short_of_groups"] > 0, "a survivor trained on without the other"
    assert not any("different models" in f for f in facts["findings"]), facts["findings"]
    killed, evicted = facts["recoveries"]
    for fault in (killed, evicted):  # the group's Job started a pod that joined again
        assert fault["seconds_to_rejoin"] is not None and fault["rejoined_at_step"] > 1
    # a group pod per fault at least (TorchFT's DDP wrapper may fail the survivor too)
    assert facts["attempts"] >= 4
    assert 0.0 < facts["goodput"] < facts["goodput_by_steps"] <= 1.0
