"""The shim's modules that moved into wings, still importable under their old names for one
release (``rtj_shim.fast.fast_tier`` is ``rtj_shim.fast.fast_tier``), with a DeprecationWarning.

A finder placed first on ``sys.meta_path`` answers an old name with the module under its new
one (the same object: a monkeypatch or an ``isinstance`` check sees one module), so nothing
is loaded twice, submodules of a moved package included (``rtj_shim.checkpoint.storage.s3``).
``python -m`` with an old name runs the new module's code.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from types import CodeType, ModuleType

WINGS: dict[str, tuple[str, ...]] = {
    "checkpoint": (
        "protocol", "manifest", "layout", "verification", "verifier", "selection",
        "retention", "pruning", "lineage", "resolver", "run_config", "storage",
    ),
    "wire": ("control", "answer_seal", "drain_order", "progress_record", "pod_env"),
    "fast": ("fast_tier", "peer_pull", "peer_replica", "peer_serve", "drain", "drain_sidecar"),
    "agent": (
        "supervisor", "doorbell", "warm", "standby", "preload", "http_gate",
        "progress_server", "progress_handler", "progress_cli", "progress_report",
    ),
}  # fmt: skip
MOVED: dict[str, str] = {
    f"rtj_shim.{name}": f"rtj_shim.{wing}.{name}" for wing, names in WINGS.items() for name in names
}


def new_name(old: str) -> str | None:
    """The module's name now, for a name it had before the move; None for any other name."""
    head, _, rest = old.partition(".")
    if head != "rtj_shim" or not rest:
        return None
    top = "rtj_shim." + rest.split(".", 1)[0]
    moved = MOVED.get(top)
    return None if moved is None else moved + old[len(top) :]


class _Alias(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} has moved to {self.new}; the old name is removed in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(self.new)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module under its new name has already run."""

    def get_code(self, fullname: str) -> CodeType | None:
        spec = importlib.util.find_spec(self.new)
        loader = None if spec is None else spec.loader
        if not isinstance(loader, importlib.abc.InspectLoader):
            return None
        return loader.get_code(self.new)


class MovedModules(importlib.abc.MetaPathFinder):
    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        new = new_name(fullname)
        if new is None:
            return None
        return importlib.util.spec_from_loader(fullname, _Alias(new))


def install() -> None:
    if not any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedModules())
