"""S3 fixtures for the shim's integration tests (the loopback S3 API server in s3server.py).

tests/ has no packages, so s3server.py is loaded by path and registered as the module
``s3server``: test modules that ``import s3server`` get this same module object.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def _load_s3server() -> ModuleType:
    if "s3server" in sys.modules:
        return sys.modules["s3server"]
    path = Path(__file__).resolve().parent / "s3server.py"
    spec = importlib.util.spec_from_file_location("s3server", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["s3server"] = module
    spec.loader.exec_module(module)
    return module


_s3server = _load_s3server()
s3_server = _s3server.s3_server
s3_root = _s3server.s3_root
s3_admin = _s3server.s3_admin
