"""The supervisor's standby keeper (`rtj_shim.standby`): when it starts a standby, and that
any failure makes every later generation start cold, said once."""

from __future__ import annotations

import os
import sys
import time

from rtj_shim.standby import StandbyKeeper


def _keeper(argv: list[str], modules: list[str], said: list[str]) -> StandbyKeeper:
    return StandbyKeeper(argv, modules, dict(os.environ), said.append)


def test_a_command_that_is_not_python_starts_cold_and_says_so() -> None:
    said: list[str] = []
    keeper = _keeper(["torchrun", "train.py"], ["json"], said)
    assert said == ["--preload: torchrun is not a Python interpreter; every generation starts cold"]
    assert keeper.keep(wanted=True) is False
    assert keeper.take({}) is None
    assert keeper.report() is None


def test_without_modules_nothing_is_kept() -> None:
    said: list[str] = []
    keeper = _keeper([sys.executable, "-c", "pass"], [], said)
    assert keeper.keep(wanted=True) is False
    assert keeper.take({}) is None and said == []


def test_only_a_wanted_standby_is_started_and_it_turns_ready() -> None:
    said: list[str] = []
    keeper = _keeper([sys.executable, "-c", "pass"], ["json"], said)
    try:
        assert keeper.keep(wanted=False) is False
        assert keeper.report() is None
        assert keeper.keep(wanted=True) is True
        assert keeper.report() == "importing"
        deadline = time.monotonic() + 30
        while keeper.report() != "ready" and time.monotonic() < deadline:
            keeper.keep(wanted=True)
            time.sleep(0.05)
        assert keeper.report() == "ready"
        proc = keeper.proc
        assert proc is not None and proc.returncode is None
    finally:
        keeper.drop()
    assert keeper.report() is None and said == []


def test_a_standby_whose_import_fails_is_given_up_on_for_good() -> None:
    said: list[str] = []
    keeper = _keeper([sys.executable, "-c", "pass"], ["no_such_module_rtj"], said)
    assert keeper.keep(wanted=True) is True
    deadline = time.monotonic() + 30
    while keeper.report() is not None and time.monotonic() < deadline:
        keeper.keep(wanted=True)
        time.sleep(0.05)
    assert keeper.report() is None
    assert len(said) == 1 and "before it was used: later generations start cold" in said[0]
    assert keeper.keep(wanted=True) is False  # never again
    assert keeper.take({}) is None
