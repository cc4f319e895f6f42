"""bench.interval_sweep's pure parts: the runs it plans (every fixed interval and auto on the
same schedule, per fault rate) and the table that puts auto beside the best fixed one."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.interval_sweep import AUTO, WORK_LOSING_MIX, Run, plan, table


def test_each_fault_rate_gets_every_fixed_interval_then_auto_on_one_seed() -> None:
    runs = plan([300.0, 120.0], [200, 50, 200], 4000, 5)
    assert [(r.mtbf, r.every) for r in runs] == [
        (300.0, 50), (300.0, 200), (300.0, AUTO),
        (120.0, 50), (120.0, 200), (120.0, AUTO),
    ]  # fmt: skip
    assert {r.seed for r in runs} == {5} and {r.steps for r in runs} == {4000}
    auto = runs[2].argv(Path("/o"), Path("/w"))
    assert "--auto-interval" in auto and not [a for a in auto if a.startswith("--save-every")]
    assert "--save-every=50" in runs[0].argv(Path("/o"), Path("/w"))
    assert "--fast-every=0" in auto  # every recovery resumes from the durable tier
    assert runs[2].name == "sweep-mtbf300-auto-4000-seed5"
    assert not [a for a in auto if a.startswith("--mix")], "no mix: the soak's default"
    mixed = plan([60.0], [100], 4000, 7, WORK_LOSING_MIX)
    assert {f"--mix={WORK_LOSING_MIX}"} <= set(mixed[0].argv(Path("/o"), Path("/w")))
    with pytest.raises(ValueError, match="--every"):
        plan([300.0], [0], 100, 1)
    with pytest.raises(ValueError, match="at least one"):
        plan([], [50], 100, 1)


def test_the_table_puts_auto_beside_the_best_fixed_interval() -> None:
    def facts(goodput: float, lost: int) -> dict[str, object]:
        return {"goodput": goodput, "checkpoint_stall_seconds": 1.5,
                "recoveries": [{"lost_steps": lost}, {"lost_steps": None}]}  # fmt: skip

    results = {
        Run(300.0, 50, 4000, 5): facts(0.91, 10),
        Run(300.0, 200, 4000, 5): facts(0.93, 90),
        Run(300.0, AUTO, 4000, 5): facts(0.925, 40),
    }
    text = table(results)
    assert "| 300 s | every 200 steps | 93.0% | 1.5 | 90 |" in text
    assert "| 300 s | auto | 92.5% | 1.5 | 40 |" in text
    assert "the best fixed interval every 200 steps; auto -0.5 points against it" in text
    assert text.index("every 50 steps") < text.index("every 200 steps") < text.index("| auto")
