"""The attempt's record of its in-place restarts (`status.current.inPlaceRestarts`): the
entry a restart (or an elastic resize) appends, and the fields its later phases fill in."""

from __future__ import annotations

from rtj_operator.api.attempts import InPlaceRestart
from rtj_operator.reconcile.builder import PlanBuilder

MAX_IN_PLACE_RECORDS = 64


def record_entry(b: PlanBuilder, entry: InPlaceRestart) -> None:
    record = b.status.current
    if record is None:
        return
    kept = [*record.in_place_restarts, entry][-MAX_IN_PLACE_RECORDS:]
    b.replace_current(record.model_copy(update={"in_place_restarts": kept}))


def update_entry(b: PlanBuilder, **fields: object) -> None:
    record = b.status.current
    if record is None or not record.in_place_restarts:
        return
    entries = list(record.in_place_restarts)
    entries[-1] = entries[-1].model_copy(update=fields)
    b.replace_current(record.model_copy(update={"in_place_restarts": entries}))
