"""`rtj run`'s flags that switch an operator signal off (parsed as the chart passes them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rtj_operator.main import main, parser


def test_node_leases_are_watched_unless_switched_off() -> None:
    assert parser().parse_args([]).watch_node_leases is True
    assert parser().parse_args(["--no-watch-node-leases"]).watch_node_leases is False
    assert parser().parse_args(["--watch-node-leases"]).watch_node_leases is True


def test_a_kubeconfig_that_cannot_be_loaded_is_one_line_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not a traceback (issue 44): the file, and what is wrong with it, on one line."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    broken = tmp_path / "kubeconfig"
    broken.write_text("apiVersion: v1\nkind: Config\nclusters: [\n")
    for path, why in ((tmp_path / "missing", "No configuration found"), (broken, "")):
        assert main(["--kubeconfig", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"rtj run: cannot load the kubeconfig {path}: "), err
        assert why in err and err.count("\n") == 1 and "Traceback" not in err
