"""The shim's modules that moved into wings import under their old names for one release, as
the same module objects, with a DeprecationWarning (`rtj_shim._moved`)."""

from __future__ import annotations

import importlib
import subprocess
import sys

from rtj_shim import _moved


def test_every_old_name_maps_to_a_module_that_exists() -> None:
    for old, new in _moved.MOVED.items():
        assert importlib.util.find_spec(new) is not None, f"{old} -> {new}"
        assert _moved.new_name(old) == new


def test_names_that_did_not_move_are_left_alone() -> None:
    for name in ("rtj_shim", "rtj_shim.torch", "rtj_shim.progress", "rtj_shim.cli", "os.path"):
        assert _moved.new_name(name) is None
    assert _moved.new_name("rtj_shim.storage.s3") == "rtj_shim.checkpoint.storage.s3"


def test_an_old_name_is_the_same_module_with_a_warning() -> None:
    code = (
        "import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
        "import rtj_shim.fast.fast_tier as new\n"
        "try:\n"
        "    import rtj_shim.fast_tier\n"
        "except DeprecationWarning as w:\n"
        "    print('warned:', w)\n"
        "warnings.simplefilter('ignore')\n"
        "import rtj_shim.fast_tier as old\n"
        "from rtj_shim import peer_pull\n"
        "import rtj_shim.storage.base as base\n"
        "from rtj_shim.checkpoint.storage import base as base2\n"
        "print(old is new, peer_pull.__name__, base is base2)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out[0].startswith("warned: rtj_shim.fast_tier has moved to rtj_shim.fast.fast_tier")
    assert out[1] == "True rtj_shim.fast.peer_pull True"


def test_python_dash_m_with_an_old_name_runs_the_new_module() -> None:
    def run(module: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-W", "ignore", "-m", module, "--help"]
        return subprocess.run(argv, capture_output=True, text=True, check=False)

    old, new = run("rtj_shim.preload"), run("rtj_shim.agent.preload")
    assert "rtj_shim.agent.preload" in new.stdout + new.stderr
    assert (old.returncode, old.stdout, old.stderr) == (new.returncode, new.stdout, new.stderr)
