"""The goodput soak, short (`python -m bench.goodput` is the long one, in `make bench`):
real training through the operator with every feature on (restart in place, the fast
checkpoint tier every 10 steps, a warm standby interpreter per pod), a hang and a corrupted
newest checkpoint with a rank killed (both restarted in place from the fast tier: the
corrupted durable step is never read), then an eviction (the evicted pod replaced, the other
restarted in place, in the same attempt: from the emergency save's durable step, newer than
every fast step; or, when the stop cut that save short, from the newest fast step, the
evicted rank's copy taken back from the peer replica the survivor keeps), and every
invariant the soak checks: the final model
equals a no-fault run bit for bit, never two worlds at once (per attempt and trainer
generation), resumes only from the steps the operator pinned, budgets, nothing leaked, and
a goodput figure computed from the trainer's own logs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench import goodput
from bench.soak_schedule import Fault

pytestmark = [pytest.mark.demo, pytest.mark.timeout(900)]


def test_the_soak_restarts_in_place_and_whole_world_bit_for_bit(tmp_path: Path) -> None:
    opts = goodput.SoakOptions(
        steps=1100,  # the eviction strikes by step ~600, well before the end
        save_every=100,
        work=tmp_path / "soak",
        preload=True,
        faults=[Fault(15.0, "hang", 1), Fault(50.0, "corrupt_newest", 0),
                Fault(80.0, "eviction", 1)],
    )  # fmt: skip
    assert opts.in_place and opts.fast_every == 10, "the defaults: in place, the fast tier"
    facts = goodput.run(opts)
    goodput.write_report(tmp_path / "report", facts, opts, goodput.machine())
    sys.stdout.write((tmp_path / "report" / "goodput.md").read_text())
    assert facts["problems"] == []
    kinds = [f["kind"] for f in facts["injected"]]
    assert kinds == ["hang", "corrupt_newest", "eviction"], facts["injected"]
    assert all(not f["what"].startswith("skipped") for f in facts["injected"])
    paths = [(r["path"], r["tier"]) for r in facts["recoveries"]]
    assert paths[:2] == [("in place", "fast")] * 2, facts["recoveries"]
    assert paths[2][0] == "in place, 1 pod(s) replaced", facts["recoveries"]
    hang, corrupt, evicted = facts["recoveries"]
    evicted_world = next(r for r in facts["resumes"] if r["world"] == "1 g3")
    if evicted["tier"] == "fast":  # the emergency save was cut short (a loaded machine, CI)
        # the evicted rank's copy came back from the survivor's peer replica
        assert set(evicted_world["entry"].get("fastSources") or {}) == {"1"}, evicted_world
        durable = evicted_world["entry"].get("resumedFromStep") or 0
        assert evicted_world["step"] >= durable, evicted_world
    else:  # its emergency save: a durable step newer than every fast step
        assert evicted["tier"] == "durable", facts["recoveries"]
        assert evicted_world["entry"].get("resumedFromFastStep") is None, evicted_world
    assert hang["failure_class"] == "Hang" and evicted["failure_class"] == "Evicted"
    assert (hang["attempt"], hang["resumed_generation"]) == (1, 1)
    assert (corrupt["attempt"], corrupt["resumed_generation"]) == (1, 2)
    assert (evicted["resumed_attempt"], evicted["resumed_generation"]) == (1, 3)
    assert evicted["replaced"][0].startswith(facts["injected"][2]["what"].split()[1])
    assert facts["in_place_restarts"] == 3 and facts["worlds"] == 4
    # each in-place world resumed from the fast step the operator pinned for it
    fast = [r for r in facts["resumes"] if r["source"] == "fast-tier"]
    assert [r["world"] for r in fast][:2] == ["1 g1", "1 g2"]
    assert all(r["step"] == r["entry"]["resumedFromFastStep"] for r in fast)
    # each in-place generation began in its pod's warm standby (the trainers' import paid
    # ahead, beside the running generation); the evicted pod's replacement, new, started cold
    fresh = {s["pod"] for s in facts["generation_starts"] if s["generation"] == 3}
    fresh -= {s["pod"] for s in facts["generation_starts"] if s["generation"] < 3}
    assert len(fresh) == 1, facts["generation_starts"]
    restarted = [s for s in facts["generation_starts"]
                 if s["generation"] >= 1 and s["pod"] not in fresh]  # fmt: skip
    assert len(restarted) >= 5 and all(s["warm"] for s in restarted), facts["generation_starts"]
    assert 0.0 < facts["goodput"] < 1.0
    assert (tmp_path / "report" / "goodput-timeline.svg").read_text().count("<polyline") >= 4
