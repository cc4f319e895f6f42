"""The job's finalizer: a job that holds quarantine claims on nodes keeps the finalizer
`training.resilient.dev/release-quarantines`, so deleting it releases those claims first,
even when the operator was down while it was deleted (the job waits, with its
deletionTimestamp, until an operator lists it and releases them). A job that never
quarantined a node never gets the finalizer: uninstalling the operator never blocks the
deletion of such a job."""

from __future__ import annotations

from rtj_operator.api import keys
from rtj_operator.reconcile.actions import SetFinalizer
from rtj_operator.reconcile.builder import PlanBuilder
from rtj_operator.reconcile.quarantine import release_all


def release_deleted_job(b: PlanBuilder) -> None:
    """The job is being deleted: release every quarantine claim, then drop the finalizer
    (in that order: a failed release keeps the finalizer and is retried)."""
    if keys.RELEASE_FINALIZER not in b.rtj.metadata.finalizers:
        b.notes.append("job is being deleted")
        return
    release_all(b)
    b.after.append(SetFinalizer(keys.RELEASE_FINALIZER, present=False))
    nodes = ", ".join(q.node for q in b.status.quarantined_nodes) or "none"
    b.notes.append(f"job is being deleted: releasing its quarantines ({nodes})")
