"""`rtj run`'s flags that switch an operator signal off (parsed as the chart passes them)."""

from __future__ import annotations

from rtj_operator.main import parser


def test_node_leases_are_watched_unless_switched_off() -> None:
    assert parser().parse_args([]).watch_node_leases is True
    assert parser().parse_args(["--no-watch-node-leases"]).watch_node_leases is False
    assert parser().parse_args(["--watch-node-leases"]).watch_node_leases is True
