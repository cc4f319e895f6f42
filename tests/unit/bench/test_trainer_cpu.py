"""bench.trainer_cpu's configurations: each adds one feature of the shim to the one before,
and nothing else (pure: the command lines, the environments, the report)."""

from __future__ import annotations

from pathlib import Path

from bench import trainer_cpu
from bench.trainer_cpu import CONFIGS, FAST_EVERY


def test_each_configuration_adds_one_feature(tmp_path: Path) -> None:
    envs = {c: trainer_cpu._env(c, tmp_path) for c in CONFIGS}
    ours = {c: {k for k in env if k.startswith("RTJ_")} for c, env in envs.items()}
    assert ours["plain"] == ours["checkpointer"] == {"RTJ_RESUME_FILE"}
    assert ours["+progress"] - ours["checkpointer"] == {"RTJ_PROGRESS_DIR"}
    assert ours["+fast"] - ours["+progress"] == {
        "RTJ_FAST_TIER_DIR", "RTJ_FAST_EVERY_STEPS", "RTJ_FAST_KEEP"}  # fmt: skip
    assert envs["+fast"]["RTJ_FAST_EVERY_STEPS"] == str(FAST_EVERY)
    commands = {c: trainer_cpu._command(c, tmp_path, 300) for c in CONFIGS}
    assert any(a.startswith("--plain-checkpoints=") for a in commands["plain"])
    for config in CONFIGS[1:]:
        assert commands[config] == commands["checkpointer"]  # only the environment differs
        assert "--save-every=300" in commands[config]  # a durable save at the end alone


def test_the_report_gives_each_configuration_against_plain() -> None:
    row = {"cpu_s": 20.0, "cpu_ms_per_rank_step": 10.0, "wall_s": 60.0}
    result = {"ranks": 2, "steps": 1000, "load": "0.5",
              "configs": {c: {**row, "cpu_ratio_to_plain": 1.0 + i / 10}
                          for i, c in enumerate(CONFIGS)}}  # fmt: skip
    text = trainer_cpu.markdown(result)
    assert "| +fast | 20.0 |  | 10.00 | 1.300 | 60.0 |" in text
    assert text.count("\n| ") == len(CONFIGS) + 1
    runs = {**result["configs"]["plain"], "runs": [{"cpu_s": 19.5}, {"cpu_s": 22.3}]}
    with_runs = {**result, "configs": {**result["configs"], "plain": runs}}
    assert "| plain | 20.0 | 19.5 / 22.3 |" in trainer_cpu.markdown(with_runs)
