"""Apply a retention policy to a store: list and verify, plan (pure), delete in a safe order.

The decision is :func:`rtj_shim.checkpoint.retention.plan_retention`'s alone; this module only reads
the listing it needs (every step directory, shallow-verified) and deletes what the plan
says, one step at a time, through ``CheckpointStore.delete_step_dir``, which unpublishes a
step (removes ``COMMITTED``) before it removes anything else. A step that cannot be deleted
does not stop the others: every failure is returned with its reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from rtj_shim.checkpoint.layout import StepDirName
from rtj_shim.checkpoint.resolver import describe_steps
from rtj_shim.checkpoint.retention import RetentionPlan, RetentionPolicy, plan_retention
from rtj_shim.checkpoint.storage.base import CheckpointStore
from rtj_shim.errors import StoreError


@dataclass(frozen=True)
class PruneResult:
    plan: RetentionPlan
    deleted: tuple[StepDirName, ...]
    failed: tuple[tuple[StepDirName, str], ...]

    def to_json(self) -> dict[str, object]:
        return {
            "deleted": [name.step for name in self.deleted],
            "failed": [{"step": name.step, "error": why} for name, why in self.failed],
        }


def prune(store: CheckpointStore, policy: RetentionPolicy, *, dry_run: bool = False) -> PruneResult:
    """Delete every step directory outside ``policy`` (nothing with ``dry_run``).

    Reading the listing may raise ``StoreError``; a failed deletion never raises.
    """
    plan = plan_retention((listing.state for listing in describe_steps(store)), policy)
    deleted: list[StepDirName] = []
    failed: list[tuple[StepDirName, str]] = []
    if not dry_run:
        for decision in plan.delete:
            try:
                store.delete_step_dir(decision.name)
            except Exception as exc:  # one step left behind must not keep the others
                why = str(exc) if isinstance(exc, StoreError) else f"{type(exc).__name__}: {exc}"
                failed.append((decision.name, why))
            else:
                deleted.append(decision.name)
    return PruneResult(plan, tuple(deleted), tuple(failed))
