"""Restart orders (issue 15): their format, their signature, which ones a pod accepts, and
what the supervisor does with the last one read. Pure."""

from __future__ import annotations

import json
import re

import pytest

from rtj_shim.agent.supervisor import Supervised, next_action
from rtj_shim.wire.control import Order, OrderError, accept, job_key, parse_order, sign, verify

UID = "0c2f7a4e-1b7c-4f0e-9d55-3f1f0b1a2c3d"
KEY = job_key(b"operator secret", UID)


def body(**fields: object) -> bytes:
    return json.dumps({"job_uid": UID, **fields}).encode()


def test_an_order_names_the_field_that_is_wrong() -> None:
    assert parse_order(body(generation=2, action="stop")) == Order(UID, 2, "stop")
    run = parse_order(body(generation=2, action="run", attempt=3, step=1200))
    assert (run.attempt, run.step) == (3, 1200)
    assert parse_order(body(generation=2, action="run", attempt=3, step=None)).step is None
    fast = Order(UID, 2, "run", attempt=3, step=1200, fast_step=1260)
    assert parse_order(fast.encode()) == fast  # the fast tier's step travels signed
    assert "fast_step" not in Order(UID, 2, "run", attempt=3, step=1200).to_json()
    assert parse_order(body(generation=2, action="stop", fast_step=9)).fast_step is None
    # the history the fast step is pinned in travels with it (issue 43), never without it
    pinned = Order(UID, 2, "run", attempt=3, step=1200, fast_step=1260,
                   fast_lineage="5f0c2a9e81d4b7c3")  # fmt: skip
    assert parse_order(pinned.encode()) == pinned
    assert pinned.to_json()["fast_lineage"] == "5f0c2a9e81d4b7c3"
    assert parse_order(body(generation=2, action="run", attempt=3, step=5,
                            fast_lineage="5f0c2a9e81d4b7c3")).fast_lineage is None  # fmt: skip
    for fields, field in [
        ({"generation": -1, "action": "stop"}, "order.generation"),
        ({"generation": True, "action": "stop"}, "order.generation"),
        ({"generation": 1, "action": "reboot"}, "order.action"),
        ({"generation": 1, "action": "run", "attempt": 0, "step": 4}, "order.attempt"),
        ({"generation": 1, "action": "run", "attempt": 2, "step": "4"}, "order.step"),
        (
            {"generation": 1, "action": "run", "attempt": 2, "step": 4, "fast_step": -5},
            "order.fast_step",
        ),
        (
            {
                "generation": 1,
                "action": "run",
                "attempt": 2,
                "step": 4,
                "fast_step": 8,
                "fast_lineage": "legacy",
            },
            "order.fast_lineage",
        ),
        (
            {
                "generation": 1,
                "action": "run",
                "attempt": 2,
                "step": 4,
                "fast_step": 8,
                "fast_lineage": 7,
            },
            "order.fast_lineage",
        ),
    ]:
        with pytest.raises(OrderError, match=re.escape(field)):
            parse_order(body(**fields))
    with pytest.raises(OrderError, match=r"order\.job_uid"):
        parse_order(json.dumps({"generation": 1, "action": "stop"}).encode())
    with pytest.raises(OrderError, match="JSON object"):
        parse_order(b"[1, 2]")
    with pytest.raises(OrderError, match="at most 4096 bytes"):
        parse_order(b" " * 5000)


def test_a_pod_accepts_only_its_own_jobs_signed_orders_moving_forward() -> None:
    raw = Order(UID, 2, "stop").encode()
    assert accept(raw, sign(KEY, raw), key=KEY, job_uid=UID, last=None).generation == 2
    # another job's key (its pods' key is derived from its own uid)
    other = job_key(b"operator secret", "another-uid")
    assert other != KEY
    with pytest.raises(OrderError, match="X-RTJ-Signature"):
        accept(raw, sign(other, raw), key=KEY, job_uid=UID, last=None)
    with pytest.raises(OrderError, match="X-RTJ-Signature"):
        accept(raw, None, key=KEY, job_uid=UID, last=None)
    tampered = raw.replace(b'"generation":2', b'"generation":9')
    assert not verify(KEY, tampered, sign(KEY, raw))
    # signed with the right key, but for another job's pods
    foreign = Order("another-uid", 2, "stop").encode()
    with pytest.raises(OrderError, match="not this pod's job"):
        accept(foreign, sign(KEY, foreign), key=KEY, job_uid=UID, last=None)
    # forward only: a replayed older order does nothing; the same one again is a retry
    last = Order(UID, 3, "run", attempt=4, step=100)
    for old in (Order(UID, 3, "stop"), Order(UID, 2, "run", attempt=3, step=0)):
        with pytest.raises(OrderError, match="older than the last accepted"):
            accept(old.encode(), sign(KEY, old.encode()), key=KEY, job_uid=UID, last=last)
    assert accept(last.encode(), sign(KEY, last.encode()), key=KEY, job_uid=UID, last=last)
    with pytest.raises(OrderError, match="no control key"):
        accept(raw, sign("", raw), key="", job_uid=UID, last=None)


def test_the_supervisor_stops_before_it_starts_and_only_moves_forward() -> None:
    running0 = Supervised(0, "running", attempt=1)
    stop1, run1 = Order(UID, 1, "stop"), Order(UID, 1, "run", attempt=2, step=40)
    assert next_action(running0, None) == "wait"
    assert next_action(running0, stop1) == "stop"
    assert next_action(Supervised(0, "exited", 1, 1), stop1) == "stop"
    stopped1 = Supervised(1, "stopped", attempt=1)
    assert next_action(stopped1, stop1) == "wait", "stopped for it: wait for the run"
    assert next_action(stopped1, run1) == "start"
    # a run for a generation this pod has not stopped for: stop first, never start so
    assert next_action(running0, run1) == "stop"
    # started: the same order again changes nothing; an older one neither
    running1 = Supervised(1, "running", attempt=2)
    assert next_action(running1, run1) == "wait"
    assert next_action(running1, stop1) == "wait"
    assert next_action(running1, Order(UID, 0, "stop")) == "wait"
    assert next_action(Supervised(1, "finished", 2, 0), Order(UID, 2, "stop")) == "wait"


def test_fast_source_travels_only_with_a_fast_step_in_a_run_order() -> None:
    order = Order(UID, 2, "run", attempt=3, step=1200, fast_step=1260, fast_source="10.0.3.7:9478")
    assert parse_order(order.encode()) == order
    assert order.to_json()["fast_source"] == "10.0.3.7:9478"
    no_fast = Order(UID, 2, "run", attempt=3, step=1200, fast_source="10.0.3.7:9478")
    assert "fast_source" not in no_fast.to_json()
    stop = parse_order(body(generation=2, action="stop", fast_source="10.0.3.7:1"))
    assert stop.fast_source is None
    assert (
        parse_order(
            body(
                generation=2, action="run", attempt=1, step=4, fast_step=8, fast_source="[::1]:9478"
            )
        ).fast_source
        == "[::1]:9478"
    )


@pytest.mark.parametrize(
    "source", ["10.0.3.7", "host.example:9478", "10.0.3.7:0", "10.0.3.7:70000", 7, ""]
)
def test_a_fast_source_that_is_not_an_address_is_refused(source: object) -> None:
    raw = body(generation=2, action="run", attempt=1, step=4, fast_step=8, fast_source=source)
    with pytest.raises(OrderError, match=r"order\.fast_source"):
        parse_order(raw)


def test_a_run_order_may_name_the_rank_and_the_rendezvous_host() -> None:
    """A warm spare takes a replaced pod's rank; when rank 0 moved, every pod gets the new
    rendezvous host. Both travel signed, only in a run order."""
    order = Order(
        UID, 2, "run", attempt=3, step=1200, rank=1, master_addr="llm-a1-spare-0-0.llm-a1"
    )
    assert parse_order(order.encode()) == order
    assert (order.to_json()["rank"], order.to_json()["master_addr"]) == (1, order.master_addr)
    plain = Order(UID, 2, "run", attempt=3, step=1200)
    assert "rank" not in plain.to_json() and "master_addr" not in plain.to_json()
    assert (
        parse_order(body(generation=2, action="run", attempt=1, master_addr="10.0.3.7")).master_addr
        == "10.0.3.7"
    )
    stop = parse_order(body(generation=2, action="stop", rank=1, master_addr="x"))
    assert (stop.rank, stop.master_addr) == (None, None)
    wrong: list[tuple[dict[str, object], str]] = [
        ({"rank": -1}, "order.rank"),
        ({"rank": "1"}, "order.rank"),
        ({"rank": True}, "order.rank"),
        ({"master_addr": "Upper.Case"}, "order.master_addr"),
        ({"master_addr": "a_b.svc"}, "order.master_addr"),
        ({"master_addr": "-x.svc"}, "order.master_addr"),
        ({"master_addr": ""}, "order.master_addr"),
        ({"master_addr": "x" * 64 + ".svc"}, "order.master_addr"),
        ({"master_addr": 7}, "order.master_addr"),
    ]
    for fields, field in wrong:
        with pytest.raises(OrderError, match=re.escape(field)):
            parse_order(body(generation=2, action="run", attempt=1, **fields))


def test_a_run_order_may_name_the_world_size_of_an_elastic_generation() -> None:
    shrink = Order(UID, 3, "run", attempt=1, step=400, rank=1, world_size=3)
    assert parse_order(shrink.encode()) == shrink and shrink.to_json()["world_size"] == 3
    assert "world_size" not in Order(UID, 3, "run", attempt=1, step=400).to_json()
    assert parse_order(body(generation=3, action="stop", world_size=3)).world_size is None
    wrong: list[tuple[dict[str, object], str]] = [
        ({"world_size": 0}, "order.world_size"),
        ({"world_size": "3"}, "order.world_size"),
        ({"world_size": True}, "order.world_size"),
        ({"world_size": 3, "rank": 3}, "order.rank: 3 is outside a world of 3"),
    ]
    for fields, field in wrong:
        with pytest.raises(OrderError, match=re.escape(field)):
            parse_order(body(generation=2, action="run", attempt=1, **fields))


def test_a_stop_order_may_give_the_trainers_a_grace_to_save() -> None:
    graceful = Order(UID, 4, "stop", save_seconds=30)
    assert parse_order(graceful.encode()) == graceful and graceful.to_json()["save_seconds"] == 30
    assert "save_seconds" not in Order(UID, 4, "stop").to_json()
    assert "save_seconds" not in Order(UID, 4, "run", attempt=1, save_seconds=30).to_json()
    assert (
        parse_order(body(generation=4, action="run", attempt=1, save_seconds=30)).save_seconds
        is None
    )
    for value in (0, -1, "30", True, 3601):
        with pytest.raises(OrderError, match=re.escape("order.save_seconds")):
            parse_order(body(generation=4, action="stop", save_seconds=value))


def test_only_an_idle_pod_finishes_on_order() -> None:
    finish = Order(UID, 3, "finish")
    assert parse_order(finish.encode()) == finish
    assert next_action(Supervised(3, "stopped", 1), finish) == "finish"
    assert next_action(Supervised(0, "stopped", 1), finish) == "finish"  # a spare, held
    assert next_action(Supervised(3, "running", 1), finish) == "wait", "a world pod runs on"
    assert next_action(Supervised(4, "stopped", 1), finish) == "wait", "an older order"
