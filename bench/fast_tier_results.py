"""bench.fast_tier's record of one model's measurements (`SizeResult`), the names of what it
measures, and how it prints seconds and bytes."""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.common import GiB, MiB, med

FAST_EVERY = 2  # in this bench: every other step_boundary saves, so both kinds are timed
FAST_KEEP = 2

METHODS = ("fast", "torch.save", "torch.save+fsync", "durable", "durable async")
LABELS = {
    "fast": "fast tier: step_boundary into tmpfs (staged, written in the background)",
    "torch.save": "torch.save to local disk (no fsync)",
    "torch.save+fsync": "torch.save + fsync to local disk",
    "durable": "durable save, blocking, local fs",
    "durable async": "durable save(blocking=False): call + fence",
}
BUDDY_COPY, BUDDY = "buddy copy-back", "buddy copy-back + restore"
HOLDER_COPY = "holder's copy"  # the holder's replication of one step (not a restore)
RESTORES = ("fast", BUDDY_COPY, BUDDY, "fs deep warm", "fs deep cold", "fs shallow warm",
            "s3 deep")  # fmt: skip
RESTORE_LABELS = {
    "fast": "fast tier (resume file `fast_step`; deep-verified in the trainer)",
    BUDDY_COPY: "buddy: the copy-back alone (`peer_pull.fetch_back` from the holder's "
    "sidecar, loopback HTTP, into an empty fast tier)",
    BUDDY: "buddy: copy-back + the restore from the copied fast tier (as the fast tier's)",
    "fs deep warm": "durable local fs (resume file `step`; deep), page cache warm",
    "fs deep cold": "durable local fs (resume file `step`; deep), pages evicted",
    "fs shallow warm": "durable local fs, step the init container verified (shallow), warm",
    "s3 deep": "durable S3, loopback moto server (resume file `step`; deep)",
}


def fmt_s(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def fmt_bytes(n: float) -> str:
    return f"{n / MiB:.1f} MiB" if n < GiB else f"{n / GiB:.2f} GiB"


@dataclass
class SizeResult:
    hidden: int
    params: int
    state_bytes: int
    step_s: list[float] = field(default_factory=list)  # plain training steps
    stalls: dict[str, list[float]] = field(default_factory=dict)  # METHODS
    boundary_idle_s: list[float] = field(default_factory=list)  # step_boundary, not due
    async_published_s: list[float] = field(default_factory=list)  # save() to published
    fast_written_s: list[float] = field(default_factory=list)  # fast save to published
    # what a fast save costs the training, all of it: (the saving step_boundary less a
    # non-saving one, the steps trained until the writer is done, how many): the writer
    # thread's Python work holds the GIL the training thread needs
    fast_cost: list[tuple[float, float, int]] = field(default_factory=list)
    # (steps trained while the save was in flight, their seconds less the stall)
    async_overlap: list[tuple[int, float]] = field(default_factory=list)
    fast_step_bytes: int = 0
    fast_held_steps: list[int] = field(default_factory=list)
    fast_held_bytes: int = 0
    durable_step_bytes: int = 0
    restores: dict[str, list[float]] = field(default_factory=dict)  # RESTORES
    load: tuple[float, float] = (0.0, 0.0)  # 1-minute load average before and after
    s3_save_s: list[float] = field(default_factory=list)
    s3_drain_s: list[float] = field(default_factory=list)  # rtj_shim.fast.drain of the fast step
    replica_copy_s: list[float] = field(default_factory=list)  # the holder's pull_once
    buddy_bytes: int = 0  # the bytes one copy-back moved (the step's shards)
    notes: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"MLP h={self.hidden} ({self.params / 1e6:.1f}M params)"

    @property
    def step_median(self) -> float:
        return med(self.step_s)

    @property
    def fast_cost_s(self) -> list[float]:
        """Per fast save: the training time it cost beyond the plain steps (median step)."""
        step = self.step_median
        return [boundary + trained - n * step for boundary, trained, n in self.fast_cost]
