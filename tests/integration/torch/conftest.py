"""Fixtures for the PyTorch state layer's integration tests.

The loopback S3 server lives beside the shim's tests; it is loaded by path (tests/ has no
packages) under the same module name, so both directories share one server per session.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def _load_s3server() -> ModuleType:
    if "s3server" in sys.modules:
        return sys.modules["s3server"]
    path = Path(__file__).resolve().parents[1] / "shim" / "s3server.py"
    spec = importlib.util.spec_from_file_location("s3server", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["s3server"] = module
    spec.loader.exec_module(module)
    return module


_s3server = _load_s3server()
s3_server = _s3server.s3_server
s3_root = _s3server.s3_root
