"""bench.preflight_cost on one small world: real `rtj-shim preflight` processes beside the
baseline, one row per world size, each preflight verdict a pass."""

from __future__ import annotations

from pathlib import Path

from bench import preflight_cost


def test_a_small_world_is_measured_beside_its_baseline(tmp_path: Path) -> None:
    out = tmp_path / "preflight-cost.md"
    argv = ["--worlds", "2", "--payload-mib", "1", "--repeat", "1", "--markdown", str(out)]
    assert preflight_cost.main(argv) == 0
    (row,) = [line for line in out.read_text().splitlines() if line.startswith("| 2 |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert all(c.endswith(" s") for c in cells[1:4]) and cells[4].endswith("x"), cells
    assert float(cells[2].removesuffix(" s")) > 0
