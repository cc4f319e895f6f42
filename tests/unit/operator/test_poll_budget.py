"""policy.poll_budget: a job's share of a progress-poll round (issue 42, finding 4)."""

from __future__ import annotations

from rtj_operator.policy.poll_budget import PodAsk, choose, interleave, job_budget


def test_a_jobs_budget_grows_with_its_pods_from_a_floor() -> None:
    assert job_budget(1) == 2.0
    assert job_budget(1250) == 125.0
    assert job_budget(10, pod_share=0.5, min_job_budget=1.0) == 5.0


def test_fast_pods_are_all_asked() -> None:
    asks = [PodAsk(f"p{i}", 0.005) for i in range(1000)]
    asked, left_out = choose(asks, job_budget(1000))
    assert len(asked) == 1000 and not left_out


def test_slow_pods_are_asked_while_the_predicted_spend_is_within_the_budget() -> None:
    asks = [PodAsk(f"p{i}", 1.9) for i in range(250)]
    asked, left_out = choose(asks, job_budget(250))  # 25 s: 14 answers of 1.9 s
    assert asked == [f"p{i}" for i in range(14)]
    assert len(left_out) == 236


def test_one_pod_is_always_asked_however_slow() -> None:
    assert choose([PodAsk("p", 30.0)], 2.0) == (["p"], [])


def test_pods_never_asked_cost_the_pod_share() -> None:
    asked, left_out = choose([PodAsk(f"p{i}", None) for i in range(30)], 2.0, pod_share=0.1)
    assert len(asked) == 20 and len(left_out) == 10


def test_pressing_pods_go_first_then_those_left_out_longest() -> None:
    asks = [
        PodAsk("a", 1.0),
        PodAsk("b", 1.0, waiting=1),
        PodAsk("c", 1.0, waiting=3),
        PodAsk("d", 1.0, pressing=True),
    ]
    asked, left_out = choose(asks, 2.0)
    assert asked == ["d", "c"] and left_out == ["b", "a"]


def test_interleave_takes_one_of_each_job_in_turn() -> None:
    assert interleave([[1, 2, 3], ["a"], [10, 20]]) == [1, "a", 10, 2, 20, 3]
    assert interleave([]) == []
