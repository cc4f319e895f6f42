"""The fast tier's peer replica, operator side (spec.checkpoint.fastTier.peerReplicas, issue
16): the ring of holders, the assignments sent until the holders' reports show them, and the
pin at an in-place restart's barrier that lets a replaced pod copy its fast step back."""

from __future__ import annotations

from typing import Any

from rtj_test_support import supervisor_reports

from rtj_operator.policy import fast_tier, peer_replica
from rtj_operator.policy.peer_replica import Member, PeerView
from rtj_shim.wire.supervisor_report import SupervisorReport


def members(*nodes: str | None) -> list[Member]:
    return [Member(f"p{i}", i, n, f"10.0.0.{i + 1}:9478") for i, n in enumerate(nodes)]


def held_by(ring: peer_replica.Ring) -> dict[int, str]:
    """Source index -> holder pod."""
    return {h.source_index: h.holder for h in ring.holdings}


# --- the ring -----------------------------------------------------------------------------


def test_each_pod_is_held_by_the_next_index_on_another_node() -> None:
    ring = peer_replica.ring(members("a", "b", "c", "d"))
    assert ring.shift == 1 and ring.note is None
    assert held_by(ring) == {0: "p1", 1: "p2", 2: "p3", 3: "p0"}
    holding = next(h for h in ring.holdings if h.source_index == 2)
    assert (holding.source, holding.source_address) == ("p2", "10.0.0.3:9478")


def test_the_smallest_shift_that_puts_every_holder_on_another_node() -> None:
    # two pods per node, neighbours together: the next index would share a node
    ring = peer_replica.ring(members("a", "a", "b", "b"))
    assert ring.shift == 2 and ring.note is None
    assert held_by(ring) == {0: "p2", 1: "p3", 2: "p0", 3: "p1"}
    # input order does not matter: the ring is over completion indexes
    assert peer_replica.ring(reversed(members("a", "a", "b", "b"))) == ring


def test_no_shift_separates_them_the_next_index_holds_and_the_note_says_so() -> None:
    ring = peer_replica.ring(members("a", "a", "a"))
    assert ring.shift == 1 and held_by(ring) == {0: "p1", 1: "p2", 2: "p0"}
    assert ring.note is not None
    assert "no ring over 3 pods on 1 nodes puts every holder on another node" in ring.note
    # 3 pods on 2 nodes: every shift pairs some two on one node
    assert peer_replica.ring(members("a", "a", "b")).note is not None


def test_too_few_pods_or_an_index_claimed_twice() -> None:
    assert peer_replica.ring(members("a")) == peer_replica.Ring()
    assert peer_replica.ring([]) == peer_replica.Ring()
    twice = [*members("a", "b", "c"), Member("p1-new", 1, "d", "10.0.0.9:9478")]
    ring = peer_replica.ring(twice)
    assert held_by(ring) == {0: "p2", 2: "p0"}, "index 1 is ambiguous this round: left out"


def test_ipv6_addresses_are_bracketed() -> None:
    assert peer_replica.address("10.0.0.1", 9478) == "10.0.0.1:9478"
    assert peer_replica.address("fd00::1", 9478) == "[fd00::1]:9478"


def test_an_assignment_is_sent_until_the_holders_report_shows_it() -> None:
    ring = peer_replica.ring(members("a", "b", "c"))
    assert [h.holder for h in peer_replica.unassigned(ring.holdings, {})] == ["p1", "p2", "p0"]
    shown: dict[str, dict[str, Any] | None] = {
        "p1": {"source_index": 0, "source": "10.0.0.1:9478", "steps": [], "error": None},
        "p2": {"source_index": 1, "source": "10.0.0.9:9478", "steps": [40]},  # old address
        "p0": None,  # no assignment
    }
    assert [h.holder for h in peer_replica.unassigned(ring.holdings, shown)] == ["p2", "p0"]


def test_the_replicated_step_is_the_newest_every_pod_has_a_copy_of() -> None:
    indexes = {"p0": 0, "p1": 1, "p2": 2}
    replicas: dict[str, dict[str, Any] | None] = {
        "p1": {"source_index": 0, "steps": [40, 50]},
        "p2": {"source_index": 1, "steps": [40, 50]},
        "p0": {"source_index": 2, "steps": [30, 40]},
    }
    assert peer_replica.replicated_step(replicas, indexes) == 40
    assert peer_replica.replicated_step({**replicas, "p0": None}, indexes) is None
    assert peer_replica.replicated_step({}, {}) is None


# --- the pin with replicas ----------------------------------------------------------------

PODS = ("p0", "p1", "p2")
ADDRESSES = {p: f"10.0.0.{i + 1}:9478" for i, p in enumerate(PODS)}
INDEXES = {p: i for i, p in enumerate(PODS)}
LINEAGE = "0123456789abcdef"


def stopped(*held: list[int]) -> dict[str, SupervisorReport]:
    return supervisor_reports({p: {"generation": 1, "state": "stopped", "fast_steps": h,
                                   "fast_held": [f"{LINEAGE}@{s}" for s in h]}
                               for p, h in zip(PODS, held, strict=True)})  # fmt: skip


def ring_replicas(*steps: list[int] | None) -> dict[str, dict[str, Any] | None]:
    """The ring with shift 1: pod i + 1 holds pod i's steps (these, per source index)."""
    out: dict[str, dict[str, Any] | None] = {}
    for source, held in enumerate(steps):
        holder = PODS[(source + 1) % len(PODS)]
        out[holder] = None if held is None else {
            "source_index": source, "source": ADDRESSES[PODS[source]], "steps": held,
            "error": None}  # fmt: skip
    return out


def peers(replicas: dict[str, dict[str, Any] | None], replaced: tuple[int, ...] = ()) -> PeerView:
    return PeerView(INDEXES, replicas, ADDRESSES, frozenset(replaced))


def test_a_replaced_pod_resumes_from_the_copy_its_holder_keeps() -> None:
    # p1 was re-created on another node: empty fast tier; p2 holds its replica
    reports = stopped([40, 50], [], [40, 50])
    view = peers(ring_replicas([40, 50], [40, 50], [40, 50]), replaced=(1,))
    found = fast_tier.pin(reports, PODS, 20, [], view)
    assert found == fast_tier.FastPin(50, {1: "10.0.0.3:9478"}, None, LINEAGE)
    # without the replicas, the durable step and the reason
    alone = fast_tier.pin(reports, PODS, 20, [])
    assert alone.step is None and alone.note is not None
    assert alone.note.startswith("pod p1 holds no fast step and no pod holds its replica")


def test_a_replica_copy_of_another_lineage_is_not_the_pinned_step() -> None:
    # issue 43: p2 holds p1's 50 of the history p1 left; p0 and p2 saved 50 again since
    reports = stopped([40, 50], [], [40, 50])
    replicas = ring_replicas([40, 50], [40, 50], [40, 50])
    other = "fedcba9876543210"
    replica = replicas["p2"]
    assert replica is not None
    replica["held"] = [f"{LINEAGE}@40", f"{other}@50"]
    found = fast_tier.pin(reports, PODS, 20, [], peers(replicas, replaced=(1,)))
    assert (found.step, found.lineage, dict(found.sources)) == (40, LINEAGE, {1: "10.0.0.3:9478"})
    replica["held"] = [f"{LINEAGE}@40", f"{LINEAGE}@50"]
    assert fast_tier.pin(reports, PODS, 20, [], peers(replicas, replaced=(1,))).step == 50


def test_a_pods_own_copy_is_preferred_and_every_pod_must_be_covered() -> None:
    view = peers(ring_replicas([40, 50], [40, 50], [40, 50]))
    assert fast_tier.pin(stopped([40, 50], [40, 50], [40, 50]), PODS, 20, [], view) == (
        fast_tier.FastPin(50, {}, None, LINEAGE)
    ), "every pod holds it: nobody copies"
    # p1 never published 50 and its holder has only what p1 had: 40 is the newest for all
    view = peers(ring_replicas([40, 50], [40], [40, 50]), replaced=(1,))
    assert fast_tier.pin(stopped([40, 50], [], [40, 50]), PODS, 20, [], view).step == 40
    # the copy is no better than an own step: not bad, not older than the durable step
    assert fast_tier.pin(stopped([40, 50], [], [40, 50]), PODS, 20, [50], view).step == 40
    older = fast_tier.pin(stopped([40, 50], [], [40, 50]), PODS, 45, [], view)
    assert older.step is None and older.note == (
        "pod index 1 (p1) holds no fast step and its replica on pod index 2 (p2) holds none "
        "at least the durable step and not marked bad"
    )


def test_a_lost_node_and_its_buddy_fall_back_to_the_durable_step_with_the_reason() -> None:
    # p1's node and p2's node were lost: both re-created; p2 held p1's replica
    reports = stopped([40, 50], [], [])
    # p0 keeps p2's old copy (now of no use); the new p1 and p2 hold none
    replicas = ring_replicas(None, None, [40, 50])
    found = fast_tier.pin(reports, PODS, 20, [], peers(replicas, replaced=(1, 2)))
    assert found.step is None and not found.sources
    assert found.note == (
        "pod index 1 (p1) holds no fast step and no pod holds its replica "
        "(its holder, pod index 2, was replaced too)"
    )


def test_a_holder_at_a_replaced_index_or_without_an_address_serves_nobody() -> None:
    reports = stopped([40, 50], [], [40, 50])
    # the replica report of the pod now at index 2 does not count when 2 was replaced
    view = peers(ring_replicas([40, 50], [40, 50], [40, 50]), replaced=(1, 2))
    assert fast_tier.pin(reports, PODS, 20, [], view).step is None
    no_address = PeerView(INDEXES, ring_replicas([40, 50], [40, 50], [40, 50]),
                          {"p0": ADDRESSES["p0"]}, frozenset({1}))  # fmt: skip
    assert fast_tier.pin(reports, PODS, 20, [], no_address).step is None


def test_the_reason_names_a_holder_that_does_not_report_the_copy() -> None:
    reports = stopped([40, 50], [], [40, 50])
    replicas = {**ring_replicas([40, 50], [40, 50], [40, 50]), "p2": None}
    found = fast_tier.pin(reports, PODS, 20, [], peers(replicas, replaced=(1,)))
    assert found.note == (
        "pod index 1 (p1) holds no fast step and no pod holds its replica "
        "(its holder, pod index 2 (p2), does not report holding it)"
    )
    # pods that each have steps but none in common
    apart = fast_tier.pin(stopped([40], [50], [40]), PODS, None, [], peers({}))
    assert apart.note == (
        "no fast step not marked bad is held by or for every pod "
        "(pod index 0 (p0) 40; pod index 1 (p1) 50; pod index 2 (p2) 40)"
    )
    assert len(fast_tier.pin(stopped([40], [], [40]), PODS, None, [], peers({})).note or "") < (
        fast_tier.MAX_NOTE
    )
