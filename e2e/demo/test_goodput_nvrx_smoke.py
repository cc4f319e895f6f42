"""The goodput soak's NVRx baseline, short (`python -m bench.goodput_baseline --launcher nvrx`
is the long one, in `make bench`): the same trainer in a plain JobSet on the pod runner, each
pod under NVIDIA Resiliency Extension's ``ft_launcher`` (c10d rendezvous, heartbeats from the
trainer every step). A killed rank and a hung one are restarted in the job by NVRx (its
worker groups rendezvous again in the same pods: no JobSet restart), each resuming from the
newest plain file, and the final model equals the no-fault run's."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from bench import goodput, goodput_baseline
from bench.soak_schedule import Fault

pytestmark = [pytest.mark.demo, pytest.mark.timeout(600)]


def test_nvrx_restarts_a_killed_and_a_hung_rank_in_the_job(tmp_path: Path) -> None:
    opts = goodput.SoakOptions(
        steps=700,
        save_every=50,
        work=tmp_path / "soak",
        faults=[Fault(8.0, "rank_killed", 1), Fault(25.0, "hang", 0)],
    )
    facts = goodput_baseline.run(opts, cap=240.0, launcher="nvrx")
    sys.stdout.write(json.dumps({k: facts[k] for k in ("goodput", "findings", "recoveries")}))
    assert facts["problems"] == [] and facts["findings"] == []  # the no-fault run's model
    assert [f["kind"] for f in facts["injected"]] == ["rank_killed", "hang"]
    assert all(not f["what"].startswith("skipped") for f in facts["injected"])
    assert facts["completed"] == "Completed"
    # three worlds, one JobSet attempt: the pods stayed, NVRx restarted their trainers
    assert facts["attempts"] == 3
    pods = {p.name.rsplit("-", 2)[0] for p in (opts.work / "state/runner/pods").glob("*/*")}
    assert pods == {"baseline-worker-0-0", "baseline-worker-0-1"}, pods
    killed, hung = facts["recoveries"]
    assert (killed["attempt"], killed["resumed_attempt"]) == (0, 1)
    assert (hung["attempt"], hung["resumed_attempt"]) == (1, 2)
    # the hang is found by NVRx's heartbeat timeout: it takes at least that long
    assert hung["seconds_to_first_step"] > goodput_baseline.bj.NVRX_HEARTBEAT_TIMEOUTS[1]
    assert 0.0 < facts["goodput"] < 1.0
