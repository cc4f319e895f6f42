"""The goodput model's elastic path (issue 45): a replaced pod that finds no free node.

The other paths assume a replacement node can be had within the recovery time. On a busy
cluster (and after a rack fails) it often cannot: the replaced pod's rank waits for capacity
for `W` seconds while the world, holding its quota, idles. Elastic N-k trains on: after
``waitForReplacementSeconds`` (`T`, the operator's default) the survivors restart in place as
a world of P-1 pods from the fast step they share (their own memory), train at (P-1)/P of the
full rate with the same global batch (`rtj_shim.torch.ElasticBatchSampler`), and grow back
when the node returns: one more in-place restart, whose joining pod copies a fast step the
survivors save at the boundary.

Per such interruption, seconds lost beyond the replaced-pod path's own cost:

    waiting: W
    elastic: W <= T: W;  else T + shrink + (W - T) / P + grow

where shrink = in-place control plane + start-up + fast restore + half the fast interval,
grow = in-place control plane + start-up + the joiner's copy-back restore + one fast save.
Which share of interruptions is short of capacity, and for how long, depends on the
cluster: no public figure exists, so the report gives a grid of both (`SCARCE_SHARES`,
`CAPACITY_WAITS`) rather than one number.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.goodput_inputs import WORLD_PODS
from bench.goodput_stacks import Stack
from rtj_operator.api.elastic_spec import DEFAULT_WAIT_FOR_REPLACEMENT_SECONDS

WAIT_FOR_REPLACEMENT = float(DEFAULT_WAIT_FOR_REPLACEMENT_SECONDS)
"""spec.elastic.waitForReplacementSeconds' default."""
SCARCE_SHARES = (0.1, 0.5, 1.0)
"""Assumed: the share of replaced-pod interruptions that find no free node within `T`."""
CAPACITY_WAITS = (900.0, 3600.0, 4 * 3600.0)
"""Assumed: how long such a pod's rank waits for a node (a repair, a node freed by others)."""


@dataclass(frozen=True)
class ElasticPath:
    stack: Stack
    pods: int = WORLD_PODS
    wait_for_replacement: float = WAIT_FOR_REPLACEMENT

    def shrink(self) -> float:
        s = self.stack
        interval = s.fast_interval if s.fast_interval is not None else s.checkpoint_interval
        return s.in_place_recovery + s.in_place_startup + s.in_place_restore + interval / 2

    def grow(self) -> float:
        s = self.stack
        return s.in_place_recovery + s.in_place_startup + s.replica_restore + s.fast_save_cost

    def break_even(self) -> float:
        """The capacity wait past which shrinking loses less than waiting: the shrink and
        the grow-back cost more than a wait just past `T` would have."""
        t = self.wait_for_replacement
        return t + (self.shrink() + self.grow()) / (1 - 1 / self.pods)

    def lost(self, capacity_wait: float) -> float:
        """Seconds lost to the wait for capacity, beyond the replaced-pod path's own."""
        t = self.wait_for_replacement
        if capacity_wait <= t:
            return capacity_wait
        return t + self.shrink() + (capacity_wait - t) / self.pods + self.grow()

    def goodput(
        self, rate: float, scarce_share: float, capacity_wait: float, *, elastic: bool
    ) -> float:
        """The stack's goodput when `scarce_share` of its replaced-pod interruptions wait
        `capacity_wait` seconds for a node: idle (`elastic` False) or shrunk."""
        extra = self.lost(capacity_wait) if elastic else capacity_wait
        share = self.stack.replicated() * scarce_share
        return max(0.0, self.stack.goodput(rate) - rate * share * extra / 3600)


def section(path: ElasticPath, rate: float) -> list[str]:
    """The report's section: the arithmetic, then the grid."""
    s = path.stack
    served = s.replicated()
    rows = []
    for share in SCARCE_SHARES:
        for wait in CAPACITY_WAITS:
            idle = path.goodput(rate, share, wait, elastic=False)
            shrunk = path.goodput(rate, share, wait, elastic=True)
            rows.append(
                f"| {share:.0%} | {wait / 60:.0f} min | {idle:.2%} | {shrunk:.2%} | "
                f"{(shrunk - idle) * 100:+.2f} |"
            )
    return [
        f"A replaced pod short of a node: {served:.1%} of interruptions replace a pod (GPU "
        f"faults, lost nodes, evictions); the share of those that find no free node within "
        f"waitForReplacementSeconds ({path.wait_for_replacement:.0f} s) is the cluster's, "
        f"assumed below. Waiting, the world idles for the whole wait W. Elastic, it loses "
        f"{path.wait_for_replacement:.0f} s + the shrink ({s.in_place_recovery:.4g} + "
        f"{s.in_place_startup:.4g} + {s.in_place_restore:.4g} + {s.fast_interval or 0:.4g} / 2 = "
        f"{path.shrink():.1f} s: an in-place restart from the survivors' own fast step) + "
        f"(W - {path.wait_for_replacement:.0f}) / {path.pods:,} (one pod of {path.pods:,} "
        f"short, the global batch kept) + the grow-back ({s.in_place_recovery:.4g} + "
        f"{s.in_place_startup:.4g} + {s.replica_restore:.4g} + {s.fast_save_cost:.4g} = "
        f"{path.grow():.1f} s: the joining pod copies a fast step saved at the boundary). "
        f"Shrinking pays once the node is away longer than {path.break_even():.0f} s (the "
        "wait, the shrink and the grow-back; a node back sooner costs the job up to the "
        "shrink and grow-back more than waiting would have). "
        f"Stack: {s.name}, no spares (a warm spare takes the first replaced pod's rank; "
        "elastic serves the faults beyond the spares). Assumed: one node is one "
        "data-parallel replica; where pipeline stages span k nodes, the lost node takes its "
        "replica's k nodes out, (W - T) x k / P, still small at this scale; tensor or "
        "pipeline layouts that cannot lose a replica cannot shrink at all.",
        "",
        "| short of a node | wait W | waiting | elastic | points |",
        "|---|---|---|---|---|",
        *rows,
        "",
        "The quota stays held meanwhile: the pinned Kueue (v0.17) has workload slices only "
        "as an alpha feature (beta from v0.18), so the missing pod's quota is not offered "
        "to other jobs; what the grid counts is this job's goodput alone.",
    ]
