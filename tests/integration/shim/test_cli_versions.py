"""Both CLIs answer --version with the installed distribution's version, the version the
Helm chart's appVersion names (issue 44)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

CHART = Path(__file__).resolve().parents[3] / "charts" / "resilient-training-operator"


def test_rtj_and_rtj_shim_print_their_version() -> None:
    app = str(yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"])
    for cli in ("rtj", "rtj-shim"):
        exe = Path(sys.executable).with_name(cli)  # the venv's, as `make test` runs it
        assert exe.is_file(), f"{cli} is not installed beside {sys.executable} (make install)"
        done = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"{cli} {app}"
