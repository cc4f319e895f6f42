"""What the restart-in-place drills with the fast tier's peer replica share
(`test_in_place_drill.py`, `test_lost_node_drill.py`): the job, the moment to strike, and
the checks of a replaced pod's resume from its buddy's copy."""

from __future__ import annotations

import json
import sys
from typing import Any

from e2e.demo import drills, story
from rtj_operator.api import keys
from rtj_shim.fast import fast_tier
from rtj_shim.fast.peer_replica import PEER_DIR
from rtj_shim.wire.control import ORDER_FILE

STEPS, SAVE_EVERY, FAST_EVERY = 300, 40, 5
"""The killed-rank drill strikes by step ~130 (after the attempt's first fast step shows in
status.progress, written at once, then a few fast steps past a durable one); the GPU-fault
and lost-node drills by step ~90 (the first fast step past the durable one that the peer
replica holds): 300 steps leave over 150 to train after the resume (every one compared with
the no-fault run: a state restored wrong differs at its first step), and one no-fault run
serves all three and the fallback drill."""
REPLACE_STEPS = STEPS


def last_order(opts: story.Options, pod: dict[str, Any]) -> dict[str, Any]:
    """The last order the pod's progress sidecar accepted (its control volume's order file)."""
    path = story._pod_dir(opts, pod) / "volumes" / keys.CONTROL_VOLUME / ORDER_FILE
    order: dict[str, Any] = json.loads(path.read_text())
    return order


def replicated_job(name: str, steps: int = REPLACE_STEPS) -> dict[str, Any]:
    """Restart in place with the fast tier and its peer replica (the default, one copy)."""
    body = drills.in_place_job(name, SAVE_EVERY, steps)
    body["spec"]["checkpoint"]["fastTier"] = {"everySteps": FAST_EVERY, "keep": 4}
    return body


def replica_ahead(opts: story.Options, holder: dict[str, Any], trained: int) -> bool:
    """Training is between durable saves, at least 5 steps before the next one, and the
    holder's copy of the other pod's fast tier (its peer replica, on its fast-tier volume)
    already has a step past the last durable one: the moment a drill's fault can only be
    recovered with less lost work through the buddy's copy. (Waiting for a step count
    alone raced the copy, a second behind its source, and the next durable save.)"""
    durable = trained - trained % SAVE_EVERY
    if trained <= SAVE_EVERY or trained % SAVE_EVERY > SAVE_EVERY - 5:
        return False
    replica = story._pod_dir(opts, holder) / "volumes" / keys.FAST_TIER_VOLUME / PEER_DIR
    return max(fast_tier.holdings(replica), default=0) > durable


def resumed_from_the_buddys_copy(
    entry: dict[str, Any],
    survivor_log: list[str],
    replaced_log: list[str],
    trained: int,
    replaced_rank: int = 1,
) -> int:
    """Both ranks resumed from the pinned fast step, newer than the durable one; the
    replacement (a new pod on another node: its own fast tier began empty) could only have
    it from the survivor's copy of its rank. The pinned step, after checks."""
    fast = entry.get("resumedFromFastStep")
    assert fast is not None and fast > entry["resumedFromStep"], entry
    # the replaced rank's pod copies it back
    assert list(entry.get("fastSources") or {}) == [str(replaced_rank)], entry
    replaced = [json.loads(x) for x in replaced_log if '"restore"' in x]
    assert [(r["step"], r["source"]) for r in replaced] == [(fast, "fast-tier")], replaced
    survived = [json.loads(x) for x in survivor_log if '"restore"' in x][1:]
    assert [(r["step"], r["source"]) for r in survived] == [(fast, "fast-tier")], survived
    # the copy lags its source by about one pull (1 s, up to 20 steps here): fewer steps
    # trained again than from the durable save before it
    assert 0 <= trained - fast < SAVE_EVERY, (trained, fast)
    sys.stdout.write(f"both ranks resumed from fast-tier step {fast} (the replaced rank's "
                     f"from its buddy's copy; durable {entry['resumedFromStep']}; "
                     f"{trained - fast} steps trained again)\n")  # fmt: skip
    return int(fast)


def began_in_standbys(opts: story.Options, pods: list[dict[str, Any]], generation: int) -> None:
    """Each pod ran ``generation`` last, and it began in the pod's warm standby."""
    for pod in pods:
        report = drills.supervisor_report(opts, pod)
        assert (report["generation"], report["preloaded"]) == (generation, True), report
