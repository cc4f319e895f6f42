"""Create the default process group so that a restarted worker never reads a dead peer's address.

Why: ``torchrun``'s default (static) rendezvous keeps *one* TCPStore in the agent for its
whole life, and workers launched with ``TORCHELASTIC_USE_AGENT_STORE=True`` connect to it
as plain clients, without a per-round prefix. Gloo's full-mesh connect publishes each
rank's listening address under a fixed key (``default_pg/0//cpu//0/<rank>``) and reads its
peers' keys. After torchrun restarts the workers, those keys still hold the *previous*
round's addresses until each new rank overwrites its own; a rank that reads a peer's key
first connects to a dead listener: "Connection refused" after a few retries, or a connect
that waits for a handshake that never comes (``init_process_group(timeout=...)`` does not
cover that connect).

Remedy: give every restart round its own key space, ``PrefixStore("rtj/round-<N>",
store)`` with ``N = TORCHELASTIC_RESTART_COUNT``, so a round can only read keys written
in that round. Outside torchelastic (plain ``env://``) rank 0 hosts the store and it dies
with the round, and the prefix is harmless.
"""

from __future__ import annotations

import datetime
import os
from typing import Any

import torch.distributed as dist

from rtj_shim import progress
from rtj_shim.wire.milestones import Milestone

DEFAULT_TIMEOUT = datetime.timedelta(minutes=10)


def round_prefix() -> str:
    return f"rtj/round-{os.environ.get('TORCHELASTIC_RESTART_COUNT') or 0}"


def init_process_group(
    backend: str | None = None,
    *,
    timeout: datetime.timedelta = DEFAULT_TIMEOUT,
    **kwargs: Any,
) -> None:
    """``torch.distributed.init_process_group`` from the ``env://`` variables, on a store
    namespaced by the restart round (see the module docstring)."""
    env = os.environ
    rank = int(env["RANK"])
    world = int(env["WORLD_SIZE"])
    host = env["MASTER_ADDR"]
    port = int(env["MASTER_PORT"])
    agent_hosts_store = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    base = dist.TCPStore(  # type: ignore[attr-defined]
        host,
        port,
        world_size=world,
        is_master=(rank == 0 and not agent_hosts_store),
        timeout=timeout,
        wait_for_workers=False,
    )
    store = dist.PrefixStore(round_prefix(), base)  # type: ignore[attr-defined]
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=world, timeout=timeout, **kwargs
    )
    progress.current().mark(Milestone.RENDEZVOUS)
