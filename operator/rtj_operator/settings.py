"""The operator's settings: what its command line (rtj_operator.main) and the Helm chart's
values set for the controller's runtime."""

from __future__ import annotations

from dataclasses import dataclass, field

from rtj_operator.policy.intervals import IntervalPolicy
from rtj_operator.policy.platform import NodeHealthPolicy
from rtj_operator.policy.preflight import PreflightPolicy


@dataclass
class Settings:
    workers: int = 16
    api_threads: int = 32
    resync_seconds: float = 300.0
    checkpoint_refresh_seconds: float = 60.0
    store_readers: int = 8
    """Threads per store-read lane (restart reads and background refreshes)."""
    store_readers_per_store: int = 2
    store_read_timeout: float = 30.0
    operator_identity_stores: tuple[str, ...] = ()
    """URI prefixes the operator may read with its own identity (jobs without a
    credentialsSecretRef); see store_reads.operator_identity_refusal."""
    node_health: NodeHealthPolicy = field(default_factory=NodeHealthPolicy)
    """The platform's node-health policy (taint key/effect, XID codes, node signals)."""
    watch_node_leases: bool = True
    """Watch kube-node-lease: silent nodes are judged lost from their Lease within seconds
    (off, or not permitted: only the node lifecycle controller's verdict counts)."""
    watch_events: bool = True
    """Keep the Events the classifier reads from a watch (`event_watch`); off, or not
    permitted: a failure reads them by LIST."""
    identity: str = "rtj-operator"
    progress_poll_seconds: float = 5.0
    """How often each running worker pod's progress sidecar is read (0: never; no hang or
    straggler detection)."""
    resolver_image: str | None = None
    """The platform's image for resume init containers and progress sidecars (a job's
    spec.checkpoint.resolverImage wins; None: the trainer's image)."""
    preflight: PreflightPolicy = field(default_factory=PreflightPolicy)
    """The platform's preflight: its image (None: resolver_image) and node-local command."""
    intervals: IntervalPolicy = field(default_factory=IntervalPolicy)
    """The platform's prior and bounds for `plannedIntervalSeconds: auto`."""
    control_secret: bytes | None = None
    """The operator's secret for restart orders (every replica the same): each job's key is
    derived from it and the job's uid (rtj_shim.wire.control.job_key). None: nothing restarts in
    place (spec.recovery.inPlace falls back to re-creating the world)."""
    progress_poll_timeout: float = 2.0
    progress_poll_concurrency: int = 16
    claim_sweep_seconds: float = 60.0
    """How often quarantine claims on nodes are checked against the jobs that exist, and
    those of deleted jobs released (0: never; see claim_sweep)."""
    claim_sweep_grace_seconds: float = 120.0
    """How long a claim must have been seen orphaned before a sweep releases it."""
