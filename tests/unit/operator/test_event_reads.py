"""Which Event queries a failed attempt's classification makes (`event_reads`): by name for
the attempt's few pods, nodes and JobSets, so a namespace of many jobs is not read whole
for each failure (`bench.operator_scale_jobs`)."""

from __future__ import annotations

from rtj_operator import event_reads


def test_a_few_objects_are_asked_for_by_name() -> None:
    queries = event_reads.queries_by_name("team-a", "Pod", {"llm-a1-w-0-1", "llm-a1-w-0-0"})
    assert queries == [
        ("team-a", "Pod", "involvedObject.kind=Pod,involvedObject.name=llm-a1-w-0-0"),
        ("team-a", "Pod", "involvedObject.kind=Pod,involvedObject.name=llm-a1-w-0-1"),
    ]
    assert event_reads.queries_by_name("team-a", "JobSet", set()) == []


def test_many_objects_are_read_by_kind_in_one_paged_query() -> None:
    pods = {f"llm-a1-w-0-{i}" for i in range(event_reads.QUERIES_BY_NAME + 1)}
    assert event_reads.queries_by_name("team-a", "Pod", pods) == [
        ("team-a", "Pod", "involvedObject.kind=Pod")
    ]
