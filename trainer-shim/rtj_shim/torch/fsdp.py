"""Sharded state (FSDP, FSDP2 ``fully_shard``) through ``torch.distributed.checkpoint``.

Saving: every rank writes its shards with DCP's ``FileSystemWriter`` into a local staging
directory (rank 0 also writes DCP's ``.metadata``); the Checkpointer then streams those
files into the step's in-progress area with ``StepWriter.copy_file`` (hashed while copied)
under ``dcp/`` and publishes them with everything else. Loading reads ``dcp/`` with DCP's
``FileSystemReader`` (from the root directly on a filesystem, from a verified local copy
for object stores); DCP re-shards onto whatever world size and mesh the job has now.

``torch.distributed.checkpoint`` is imported by the functions that use it, not with this
module: it pulls in DTensor, FX and sympy, about 2 CPU-seconds that every trainer start paid
(and a third of ``import rtj_shim.torch``) whether or not it has a sharded state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from rtj_shim.torch.state import SHARDED, Entry, module_for_optimizer, unwrap

DCP_DIR = "dcp"


def sharded_state(entries: list[Entry]) -> dict[str, Any]:
    """The DCP state dict of every sharded entry (references to live shards, not copies)."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    state: dict[str, Any] = {}
    for entry in entries:
        if entry.placement != SHARDED:
            continue
        if entry.kind == "module":
            state[f"model.{entry.name}"] = get_model_state_dict(unwrap(entry.obj))
        else:
            module = module_for_optimizer(entry.obj, entries)
            state[f"optim.{entry.name}"] = get_optimizer_state_dict(module, entry.obj)
    return state


def save_local(state: dict[str, Any], directory: Path, group: Any) -> list[tuple[str, Path]]:
    """Collective: write this rank's DCP files into ``directory``; return (relpath, path)."""
    from torch.distributed.checkpoint.filesystem import FileSystemWriter
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    directory.mkdir(parents=True, exist_ok=True)
    dcp_save(state, storage_writer=FileSystemWriter(str(directory)), process_group=group)
    files = sorted(p for p in directory.rglob("*") if p.is_file())
    return [(f"{DCP_DIR}/{p.relative_to(directory).as_posix()}", p) for p in files]


def load_into(entries: list[Entry], directory: Path, group: Any) -> None:
    """Collective: load the DCP checkpoint in ``directory`` into every sharded entry."""
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
    )
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    state = sharded_state(entries)
    dcp_load(state, storage_reader=FileSystemReader(str(directory)), process_group=group)
    for entry in entries:
        if entry.placement != SHARDED:
            continue
        if entry.kind == "module":
            set_model_state_dict(unwrap(entry.obj), state[f"model.{entry.name}"])
        else:
            module: nn.Module = module_for_optimizer(entry.obj, entries)
            set_optimizer_state_dict(module, entry.obj, state[f"optim.{entry.name}"])
