"""The fast tier's settings and what a pod reports it holds (issue 16). Pure, apart from a
temporary directory standing in for the pod's memory-backed volume."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from rtj_shim.agent.progress_report import report
from rtj_shim.checkpoint.layout import COMMITTED_FILE, step_key
from rtj_shim.checkpoint.protocol import CommitProtocol
from rtj_shim.fast.fast_tier import (
    ENV_DIR,
    ENV_EVERY_STEPS,
    ENV_KEEP,
    MIN_KEEP,
    FastTierConfig,
    committed_steps,
    holdings,
    newest_held,
    rank_store,
)


def test_settings_come_from_arguments_then_the_operators_environment() -> None:
    assert FastTierConfig.from_env({}) is None
    assert FastTierConfig.from_env({ENV_DIR: "/fast"}) is None  # no interval: no fast tier
    config = FastTierConfig.from_env({ENV_DIR: "/fast", ENV_EVERY_STEPS: "10"})
    assert config is not None
    assert (config.directory, config.every_steps, config.keep) == (Path("/fast"), 10, MIN_KEEP)
    config = FastTierConfig.from_env({ENV_DIR: "/fast", ENV_EVERY_STEPS: "10"}, "/mine", 4, 3)
    assert config is not None
    assert (config.directory, config.every_steps, config.keep) == (Path("/mine"), 4, 3)
    assert [s for s in range(13) if config.due(s)] == [4, 8, 12]


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({ENV_EVERY_STEPS: "ten"}, ENV_EVERY_STEPS),
        ({ENV_EVERY_STEPS: "0"}, "fast_every_steps"),
        ({ENV_EVERY_STEPS: "5", ENV_KEEP: "1"}, "fast_keep"),
        ({ENV_EVERY_STEPS: "5", ENV_KEEP: "x"}, ENV_KEEP),
    ],
)
def test_a_bad_setting_names_its_field(env: dict[str, str], field: str) -> None:
    with pytest.raises(ValueError, match=re.escape(field)):
        FastTierConfig.from_env({ENV_DIR: "/fast", **env})


def _publish(root: Path, rank: int, step: int, payload: Path) -> None:
    CommitProtocol(rank_store(root, rank), retention=None).publish_directory(step, payload)


def test_a_pod_holds_the_committed_steps_every_rank_directory_has(tmp_path: Path) -> None:
    payload = tmp_path / "payload"
    payload.mkdir()
    (payload / "state.bin").write_bytes(b"x" * 64)
    fast = tmp_path / "fast"
    assert holdings(fast) == []  # no fast tier yet
    for step in (10, 20, 30):
        _publish(fast, 0, step, payload)
    for step in (10, 20):
        _publish(fast, 1, step, payload)
    assert holdings(fast) == [10, 20]  # rank 1 has no 30
    # a COMMITTED that does not match its manifest is not held
    (rank_store(fast, 1).root / step_key(20, COMMITTED_FILE)).write_text("0" * 64)
    assert committed_steps(rank_store(fast, 1)) == [10]
    assert holdings(fast) == [10]
    for step in range(40, 200, 10):
        _publish(fast, 0, step, payload)
        _publish(fast, 1, step, payload)
    assert len(holdings(fast)) == 8 and holdings(fast)[-1] == 190  # the newest, bounded


def test_the_sidecar_reports_the_newest_step_every_rank_holds_and_when(tmp_path: Path) -> None:
    payload = tmp_path / "payload"
    payload.mkdir()
    (payload / "state.bin").write_bytes(b"x")
    fast = tmp_path / "fast"
    records = tmp_path / "records"
    records.mkdir()
    assert report(records, fast_tier_dir=fast)["fast_tier"] is None  # nothing yet
    assert "fast_tier" not in report(records)  # no fast tier: not in the body at all
    _publish(fast, 0, 10, payload)
    _publish(fast, 0, 20, payload)
    _publish(fast, 1, 10, payload)
    os.utime(rank_store(fast, 0).root / step_key(10, COMMITTED_FILE), (1000.0, 1000.0))
    os.utime(rank_store(fast, 1).root / step_key(10, COMMITTED_FILE), (2000.0, 2000.0))
    held = newest_held(fast)
    # complete when the last rank was; of the history both ranks' copies record (issue 43)
    assert held == {"step": 10, "committed_wall_time": 2000.0, "lineage": "legacy"}
    assert report(records, fast_tier_dir=fast)["fast_tier"] == held
