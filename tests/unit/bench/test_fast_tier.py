"""bench/fast_tier.py and its fast_tier_* modules: the lost-steps arithmetic, and a tiny run
of the whole benchmark (every method and restore measured, the report's sections written).
No timing is asserted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.fast_tier import main
from bench.fast_tier_example import FAST_EVERY as EXAMPLE_FAST_EVERY
from bench.fast_tier_example import WARM_STEPS, ExampleRun, read_rank_log
from bench.fast_tier_lost import lost_rows, practical_interval
from bench.fast_tier_report import mib_per_s
from bench.fast_tier_results import BUDDY, BUDDY_COPY, FAST_EVERY, METHODS, RESTORES, SizeResult


def sized(step: float = 0.1) -> SizeResult:
    r = SizeResult(hidden=8, params=1, state_bytes=1)
    r.step_s = [step] * 3
    r.stalls = {
        "fast": [0.05] * 3,
        "torch.save": [0.2] * 3,
        "torch.save+fsync": [0.3] * 3,
        "durable": [0.5] * 3,
        "durable async": [0.001] * 3,
    }
    r.async_published_s = [0.35] * 3  # 4 steps of 0.1 s
    r.async_overlap = [(4, 0.6)] * 3  # 0.2 s more than 4 plain steps
    r.restores = {"fast": [0.01], "fs deep warm": [0.02]}
    return r


def test_the_practical_interval_is_the_most_frequent_within_the_budget() -> None:
    assert practical_interval(0.05, 0.1, 0.01) == 50  # 0.05 / (50 * 0.1) == 1%
    assert practical_interval(0.0501, 0.1, 0.01) == 51
    assert practical_interval(0.0001, 0.1, 0.01) == 1
    assert practical_interval(0.0001, 0.1, 0.01, floor=4) == 4


def test_a_failure_loses_half_the_interval_of_the_newer_tier() -> None:
    rows = {row.durable: row for row in lost_rows(sized(), 0.01, 50, 5)}
    blocking = rows["blocking, local fs"]
    assert (blocking.durable_every, blocking.fast_every) == (500, 50)
    assert blocking.lost_alone == 250 and blocking.lost_with_fast == 25
    assert blocking.overhead == pytest.approx(0.01)
    assert blocking.fast_overhead == pytest.approx(0.01)
    gpu = next(row for name, row in rows.items() if "stall only" in name)
    assert gpu.durable_every == 4  # the publish takes 4 steps: the next save waits for it
    assert gpu.lost_with_fast == gpu.lost_alone == 2  # the fast tier is never newer
    cpu = next(row for name, row in rows.items() if "CPU it takes" in name)
    assert cpu.durable_every == 201  # (0.001 + 0.2) s / (1% x 0.1 s)
    assert "blocking, S3 (loopback moto)" not in rows  # not measured: no row

    example = lost_rows(sized(), None, 50, 5)
    assert {(row.durable_every, row.fast_every) for row in example} == {(50, 5)}
    assert {row.lost_with_fast for row in example} == {2.5}


def test_a_tiny_run_measures_every_method_and_writes_the_report(tmp_path: Path) -> None:
    out, md = tmp_path / "fast-tier.json", tmp_path / "fast-tier.md"
    fast_dir, work_dir = tmp_path / "shm", tmp_path / "work"
    fast_dir.mkdir()
    argv = ["--hidden", "16", "--rounds", "1", "--restore-reps", "1", "--no-s3",
            "--fast-dir", str(fast_dir), "--work-dir", str(work_dir),
            "--json", str(out), "--markdown", str(md),
            "--example-steps", str(WARM_STEPS + 11), "--example-pairs", "1"]  # fmt: skip
    assert main(argv) == 0

    body = json.loads(out.read_text())
    (result,) = body["results"]
    assert result["hidden"] == 16 and result["params"] > 0
    assert set(result["stalls"]) == set(METHODS)
    assert all(len(v) == 1 and v[0] >= 0 for v in result["stalls"].values())
    assert set(result["restores"]) == set(RESTORES) - {"s3 deep"}
    # from a buddy: the copy-back alone, and with the restore that followed it
    (back,), (both,) = result["restores"][BUDDY_COPY], result["restores"][BUDDY]
    assert 0 < back < both
    assert len(result["replica_copy_s"]) == 1 and result["replica_copy_s"][0] > 0
    assert 0 < result["buddy_bytes"] <= result["fast_step_bytes"]
    # the warm-up round and the timed one each saved one fast step; fast_keep=2 keeps both
    assert result["fast_held_steps"] == [FAST_EVERY, 2 * FAST_EVERY]
    assert result["fast_step_bytes"] == result["fast_held_bytes"] // 2 > 0
    assert body["context"]["loadavg_start"] and body["context"]["loadavg_end"]

    # the example trainer under torchrun, without and with the fast tier: the steps after
    # the warm-up timed on both ranks, and each fast save of theirs reported with its stall
    plain, fast = body["context"]["example"]["runs"]
    assert (plain["fast"], fast["fast"]) == (False, True)
    assert len(plain["step_s"]) == len(fast["step_s"]) == 2 * 10  # steps 22..31, 2 ranks
    assert plain["stalls"] == [] and plain["boundary_saving_s"] == [] and plain["skipped"] == 0
    # fast steps 25 and 30 on each rank (one still being written when the next is due is
    # skipped, never waited for)
    assert 2 <= len(fast["stalls"]) + fast["skipped"] <= 2 * 2
    assert fast["stalls"] and all(s > 0 for s in fast["stalls"])
    assert len(fast["boundary_saving_s"]) + fast["skipped"] == 2 * 2

    report = md.read_text()
    assert "## The example trainer's own step" in report
    for heading in ("## Summary", "## 1. Training-thread", "## 2. Restore", "## 3. Lost steps"):
        assert heading in report
    assert "not measured in this run (`--no-s3`)" in report
    assert "### From a buddy: the peer replica's copies" in report
    assert list(fast_dir.iterdir()) == []  # the fast tier and the durable steps are gone
    assert list(work_dir.iterdir()) == []


def test_a_copy_rate_is_mebibytes_over_the_median() -> None:
    assert mib_per_s(300 * 2**20, 0.5) == "600 MiB/s"
    assert mib_per_s(1, 0.0) == "-"


def test_the_example_trainers_log_is_read_as_steps_boundaries_and_fast_saves() -> None:
    """The trainer's own lines (examples/ddp_train.py's emit): a step line's ckpt_s is the
    boundary after the step before it, which took a fast step when one is logged for that
    step; one due (a multiple of EXAMPLE_FAST_EVERY) with none logged was skipped."""
    first = WARM_STEPS + 1
    lines = [json.dumps({"event": "restore", "step": 0, "time": 0.0})]
    for n, step in enumerate(range(first, first + 2 * EXAMPLE_FAST_EVERY + 1)):
        lines.append(json.dumps({"step": step, "loss": 1.0, "ckpt_s": 0.001 * (n + 1),
                                 "time": 10.0 + 0.5 * n}))  # fmt: skip
    due = [s for s in range(first, first + 2 * EXAMPLE_FAST_EVERY) if s % EXAMPLE_FAST_EVERY == 0]
    lines.append(
        json.dumps(
            {"event": "fast_save", "step": due[0], "stall": 0.0004, "seconds": 0.02, "time": 11.0}
        )
    )  # fmt: skip (due[1] skipped)
    lines.append(
        json.dumps(
            {"event": "fast_save", "step": WARM_STEPS, "stall": 0.9, "seconds": 0.9, "time": 9.0}
        )
    )  # fmt: skip (a warm-up one)
    run = ExampleRun(fast=True)
    read_rank_log(lines, True, run)
    assert run.step_s == [0.5] * 2 * EXAMPLE_FAST_EVERY
    saving_ckpt_s = 0.001 * (due[0] - first + 2)  # on the line after due[0]
    assert run.boundary_saving_s == [pytest.approx(saving_ckpt_s)]
    assert run.skipped == 1 and len(run.boundary_idle_s) == 2 * EXAMPLE_FAST_EVERY - 2
    assert run.stalls == [0.0004] and run.written_s == [0.02]
    plain = ExampleRun(fast=False)
    read_rank_log(lines[: 2 * EXAMPLE_FAST_EVERY + 2], False, plain)
    assert plain.boundary_saving_s == [] and plain.skipped == 0
    assert len(plain.boundary_idle_s) == 2 * EXAMPLE_FAST_EVERY
