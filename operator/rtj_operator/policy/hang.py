"""A Hang as a failure fact (FailureClass.HANG): the first failed rank, the evidence and the
decision, from the verdict `policy.progress.hang_verdict` took over the ranks' reports. Pure:
one of the classification package's failure facts; `reconcile.ranks` gathers its inputs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from rtj_operator.api import keys
from rtj_operator.api.attempts import FirstFailed
from rtj_operator.api.reasons import FailureClass
from rtj_operator.policy.classify import Classification, Decision
from rtj_operator.policy.progress import Hang

Json = Mapping[str, Any]


def hang_failure(
    hang: Hang,
    pod: Json,
    silent: Sequence[str],
    allowance: str,
    trainer: str,
    now: datetime,
) -> Classification:
    """The hang of `hang.rank` in `pod` (its JSON, for its index and node), the pods that
    sent no report (`silent`) and the allowance it exceeded, as the attempt's failure."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    index = (meta.get("annotations") or {}).get(keys.JOB_COMPLETION_INDEX)
    node = spec.get("nodeName")
    first = FirstFailed(
        pod=hang.pod,
        rank=hang.rank,
        node_rank=int(index) if isinstance(index, str) and index.isdigit() else None,
        node=node if isinstance(node, str) else None,
        container=trainer,
        exit_code=None,
        finished_at=now - timedelta(seconds=hang.seconds),
    )
    evidence = [hang.message, f"allowance: {allowance}"]
    if silent:
        evidence.append(f"no progress report from {', '.join(silent[:5])}")
    return Classification(
        FailureClass.HANG,
        first,
        (),
        tuple(evidence),
        Decision(
            signal=f"rank {hang.rank} in '{hang.section}' for {hang.seconds:.0f}s",
            source=f"pod {hang.pod}: {keys.PROGRESS_SIDECAR} GET /progress",
            rule="the rank furthest behind made no progress in its section beyond the "
            "allowance; the ranks ahead wait for it",
        ),
    )
