"""The Checkpointer's option groups (`rtj_shim.torch.options`): the flat keywords they replaced
still work for one release, each with a DeprecationWarning naming the new spelling; a keyword
that never existed is a TypeError naming it; the pod's environment fills what the caller
left unset."""

from __future__ import annotations

from pathlib import Path

import pytest

from rtj_shim.torch.options import (
    DEFAULT_RESUME_FILE,
    LEGACY,
    EmergencyOptions,
    IoOptions,
    Options,
    ResumeOptions,
    group_legacy_options,
    with_pod_defaults,
)


def test_every_flat_keyword_lands_in_its_group() -> None:
    with pytest.warns(DeprecationWarning, match=r"pass io=IoOptions\(shard_bytes=...\)"):
        grouped = group_legacy_options(Options(), {"shard_bytes": 4096})
    assert grouped.io == IoOptions(shard_bytes=4096)
    with pytest.warns(DeprecationWarning, match=r"resume=ResumeOptions\(report=...\)"):
        grouped = group_legacy_options(Options(), {"restore_report": False, "probe_atol": 0.5})
    assert grouped.resume == ResumeOptions(report=False, probe_atol=0.5)
    with pytest.warns(DeprecationWarning, match="FastTierConfig"):
        grouped = group_legacy_options(Options(), {"fast_tier_dir": "/f", "fast_keep": 3})
    assert (grouped.fast_args.directory, grouped.fast_args.keep) == ("/f", 3)
    assert {group for group, _ in LEGACY.values()} == {
        "io", "resume", "emergency", "integrity", "fast_tier",
    }  # fmt: skip


def test_a_keyword_that_never_existed_is_named() -> None:
    with pytest.raises(TypeError, match=r"unexpected keyword argument.*every_step\b"):
        group_legacy_options(Options(), {"every_step": 5})


def test_the_pod_fills_what_the_caller_left_unset() -> None:
    env = {"RTJ_RESUME_FILE": "/pod/resume.json", "RTJ_EMERGENCY_SAVE_SECONDS": "12"}
    filled = with_pod_defaults(Options(io=IoOptions(io_workers=0)), env)
    assert filled.resume.resume_file == Path("/pod/resume.json")
    assert filled.emergency.deadline_s == 12.0
    assert filled.io.io_workers == 1  # at least one writer
    given = Options(emergency=EmergencyOptions(deadline_s=3), resume=ResumeOptions(resume_file="r"))
    kept = with_pod_defaults(given, env)
    assert (kept.emergency.deadline_s, kept.resume.resume_file) == (3, Path("r"))
    assert with_pod_defaults(Options(), {}).resume.resume_file == Path(DEFAULT_RESUME_FILE)
