"""The chart installed into the harness cluster (e2e.cluster; fixtures from the root conftest),
and the operator run as a local process under the chart's ServiceAccount."""

from __future__ import annotations

import sys
from pathlib import Path

_TESTS = Path(__file__).resolve().parents[2]
# shared helpers (tests/ has no packages): the chart renderer and the operator process
for _helpers in (_TESTS / "unit" / "chart", _TESTS / "integration" / "operator"):
    if str(_helpers) not in sys.path:
        sys.path.insert(0, str(_helpers))
