"""The pure parts of bench/hang_detection.py: the simulated ranks, what they serve, and the
parsing of torch's default timeouts. No timing is asserted."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.hang_defaults import cpp_timeout
from bench.hang_ranks import (
    PHASES,
    WAIT,
    Freeze,
    Sim,
    address,
    freeze_point,
    phase_at,
    pod_body,
    pod_name,
    stop_ns,
)
from bench.hang_report import summarize
from rtj_operator.policy import progress as policy
from rtj_shim.agent.progress_report import report
from rtj_shim.progress import Progress

S = 10**9 * 10  # 10 s steps
T0 = 10**12  # the simulation's start on CLOCK_MONOTONIC
SIM = Sim(T0, S, wall_offset_ns=1_700_000_000 * 10**9)
SECOND = 10**9


def reports(now_ns: int, pods: int = 4, freeze: Freeze | None = None) -> list[policy.PodReport]:
    received = (now_ns + SIM.wall_offset_ns) / 1e9
    return [policy.PodReport(pod_name(p), received, pod_body(SIM, p, now_ns, freeze))
            for p in range(pods)]  # fmt: skip


def test_the_body_has_the_shape_of_the_product_servers(tmp_path: Path) -> None:
    progress = Progress(tmp_path, 3)
    progress.step_done(1)
    progress.enter("forward")
    real = report(tmp_path)
    progress.close()
    fake = pod_body(SIM, 0, T0 + 3 * S)
    assert fake.keys() == real.keys()
    assert fake["ranks"][0].keys() == real["ranks"][0].keys()
    assert [r["rank"] for r in fake["ranks"]] == list(range(8))
    assert fake["schema"] == real["schema"] == 1


def test_ranks_go_through_the_sections_of_a_step_in_order() -> None:
    seen = []
    for tenth in range(10):
        k, index, since = phase_at(SIM, 0, T0 + 5 * S + tenth * S // 10)
        assert k == 5 and since <= T0 + 5 * S + tenth * S // 10
        seen.append(PHASES[index][0])
    assert seen == ["data", *["forward"] * 3, *["backward"] * 4, "allreduce", "optimizer"]


def test_a_healthy_job_is_not_hung_and_its_allowance_comes_from_its_steps() -> None:
    now = T0 + 20 * S + S // 3
    got = reports(now)
    at = (now + SIM.wall_offset_ns) / 1e9
    assert policy.hang_verdict(got, 30.0, at) is None
    assert policy.auto_timeout(got, now=at).step == pytest.approx(50.0, rel=0.02)
    assert policy.job_progress(got, at).ranks == 32


def test_a_frozen_rank_is_named_and_the_others_wait_for_it_in_the_collective() -> None:
    frozen = 13
    at = freeze_point(SIM, frozen, T0 + 7 * S + S // 2)
    k, index, since = phase_at(SIM, frozen, at)
    assert PHASES[index][0] == "forward" and k == 8
    assert stop_ns(SIM, frozen, Freeze(frozen, at)) == at
    assert stop_ns(SIM, 0, Freeze(frozen, at)) == T0 + 8 * S + 3 * S // 4  # its allreduce
    assert stop_ns(SIM, 0, None) is None
    now = at + 40 * SECOND
    got = reports(now, freeze=Freeze(frozen, at))
    hang = policy.hang_verdict(got, 30.0, (now + SIM.wall_offset_ns) / 1e9)
    assert hang is not None and hang.rank == frozen and hang.section == "forward"
    assert hang.seconds == pytest.approx(40 + (at - since) / 1e9, abs=0.01)
    assert len(hang.ahead) == 31 and not hang.all_ranks_equally_stuck
    others = [r for b in got for r in b.body["ranks"] if r["rank"] != frozen]
    assert {r["section"] for r in others} == {PHASES[WAIT][0]}


def test_addresses_are_distinct_loopback_addresses() -> None:
    seen = {address(p) for p in range(1250)}
    assert len(seen) == 1250
    assert all(a.startswith("127.3.") and not a.endswith((".0", ".255")) for a in seen)


def test_torchs_timeouts_are_read_from_its_headers() -> None:
    text = "x\n\nconstexpr auto kProcessGroupNCCLDefaultTimeout =\n    std::chrono::milliseconds(10 * 60 * 1000);\n"  # noqa: E501
    assert cpp_timeout(text, "kProcessGroupNCCLDefaultTimeout") == (600.0, 3)
    assert cpp_timeout(text, "kBackendDefaultTimeout") is None


def test_the_round_summary_leaves_the_silent_rounds_out() -> None:
    def one(scenario: str, seconds: float, cpu: float) -> dict[str, object]:
        return {"scenario": scenario, "seconds": seconds, "cpu": cpu, "generator_cpu": 0.5,
                "fetch_s": seconds / 2,
                "decide": {"a": 0.1, "b": 0.2}, "answered": 10, "rss_mib": 1.0,
                "load1": 1.0}  # fmt: skip

    s = summarize([one("steady", 1.0, 2.0), one("steady", 3.0, 2.0), one("silent", 20, 9)], 10, 5)
    assert s["rounds"] == 2
    assert s["round_p50_s"] == pytest.approx(2.0)
    assert s["fetch_p50_s"] == pytest.approx(1.0)
    assert s["cpu_per_pod_us"] == pytest.approx(2e5)
    assert s["core_percent"] == pytest.approx(100 * 2.0 / 7.0)
    assert s["decisions_p50_s"] == pytest.approx(0.3)
