"""bench.write_limit on a tiny state: three runs side by side, each row of the report."""

from __future__ import annotations

from pathlib import Path

from bench import write_limit


def test_a_tiny_run_reports_the_baseline_and_both_saves(tmp_path: Path) -> None:
    out = tmp_path / "write-limit.md"
    argv = ["--state-mib", "12", "--limit-mib", "4", "--step-ms", "5", "--repeat", "1",
            "--markdown", str(out)]  # fmt: skip
    assert write_limit.main(argv) == 0
    rows = [line for line in out.read_text().splitlines() if line.startswith("| ")][1:]
    assert [r.split(" | ")[0] for r in rows] == ["| no save", "| save, no limit",
                                                "| save, 4 MiB/s"]  # fmt: skip
    no_save, *saves = rows
    assert no_save.split(" | ")[3] == "-" and all(r.split(" | ")[3].endswith(" s") for r in saves)
