"""The supervisor's warm-interpreter keeper (`rtj_shim.agent.standby`): the fork server that
imports once and forks every trainer, the fall back to a standby per generation when it
ends, and that a failed import makes every later generation start cold, said once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest

from rtj_shim.agent import preload, warm
from rtj_shim.agent.standby import StandbyKeeper
from rtj_shim.agent.warm import ForkedTrainer


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


def test_a_warm_interpreter_whose_import_fails_is_given_up_on_for_good() -> None:
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


# writes its pid, parent's pid and the environment's RTJ_GENERATION to OUT-<generation>.json
WRITES = """
import json, os, sys
out = sys.argv[1] + "-" + os.environ["RTJ_GENERATION"] + ".json"
body = {"pid": os.getpid(), "sid": os.getsid(0), "decimal": "decimal" in sys.modules,
        "stdin": sys.stdin.read(), "env": dict(os.environ)}
open(out + ".tmp", "w").write(json.dumps(body)); os.replace(out + ".tmp", out)
"""


def _ready(keeper: StandbyKeeper) -> None:
    deadline = time.monotonic() + 30
    while keeper.report() != "ready" and time.monotonic() < deadline:
        keeper.keep(wanted=True)
        time.sleep(0.05)
    assert keeper.report() == "ready"


def _written(path: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    body: dict[str, Any] = json.loads(Path(path).read_text())
    return body


def _fork_server(
    tmp_path: Path, said: list[str]
) -> tuple[StandbyKeeper, subprocess.Popen[bytes], str]:
    """A keeper whose fork server is ready (each trainer writes ``<out>-<generation>.json``)."""
    out = str(tmp_path / "gen")
    keeper = _keeper([sys.executable, "-c", WRITES, out], ["decimal"], said)
    try:
        _ready(keeper)
        server = keeper.proc
        assert server is not None
    except BaseException:
        keeper.drop()
        raise
    return keeper, server, out


def test_the_fork_server_imports_once_and_forks_every_trainer(tmp_path: Path) -> None:
    said: list[str] = []
    keeper, server, out = _fork_server(tmp_path, said)
    try:
        trainers = [keeper.take({"RTJ_GENERATION": str(g), "PATH": os.environ["PATH"]})
                    for g in (0, 1)]  # fmt: skip
        bodies = [_written(f"{out}-{g}.json") for g in (0, 1)]
        for trainer, body in zip(trainers, bodies, strict=True):
            assert isinstance(trainer, ForkedTrainer) and trainer.pid == body["pid"]
            assert body["decimal"] and body["stdin"] == "", "imported before; stdin empty"
            assert body["sid"] == body["pid"], "a session of its own"
            assert set(body["env"]) == {"RTJ_GENERATION", "PATH"}, "only the given environment"
        assert bodies[0]["pid"] != bodies[1]["pid"] != server.pid
        assert keeper.proc is server and server.poll() is None, "one server for every generation"
        assert keeper.report() == "ready" and said == []
    finally:
        keeper.drop()
    assert server.returncode is not None, "dropped: the server ended"


def test_a_fork_server_that_ends_leaves_later_generations_to_standbys(tmp_path: Path) -> None:
    said: list[str] = []
    keeper, server, out = _fork_server(tmp_path, said)
    try:
        server.kill()
        server.wait(10)
        assert keeper.keep(wanted=True) is True
        assert said == ["the fork server ended (-9): each later generation starts from a "
                        "standby of its own"]  # fmt: skip
        _ready(keeper)  # a standby now, started because one is wanted
        standby = keeper.proc
        child = keeper.take({"RTJ_GENERATION": "1"})
        assert child is standby, "the standby became the trainer"
        assert _written(f"{out}-1.json")["pid"] == standby.pid
        assert child.wait() == 0
    finally:
        keeper.drop()


def test_a_server_with_cuda_initialized_refuses_to_fork(monkeypatch: pytest.MonkeyPatch) -> None:
    assert preload.fork_refusal() is None  # this process: no CUDA context
    cuda = types.SimpleNamespace(is_initialized=lambda: True)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    assert preload.fork_refusal() == (
        "CUDA is initialized in the fork server (a forked child cannot use it)"
    )


def test_a_fork_that_fails_after_the_order_sweeps_strays_before_a_standby_trains(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server took the generation's environment but never said a pid (here: stopped;
    in life, killed between its fork and its answer): a trainer it may have forked must be
    ended (the supervisor's sweep) before the standby's trains in its place."""
    monkeypatch.setattr(warm, "FORK_WAIT_SECONDS", 0.5)
    said: list[str] = []
    swept: list[int] = []
    out = str(tmp_path / "gen")
    keeper = StandbyKeeper(
        [sys.executable, "-c", WRITES, out], ["decimal"], dict(os.environ), said.append,
        sweep=lambda: swept.append(len(said)),
    )  # fmt: skip
    try:
        _ready(keeper)
        server = keeper.proc
        assert server is not None
        server.send_signal(signal.SIGSTOP)
        child = keeper.take({"RTJ_GENERATION": "0", "PATH": os.environ["PATH"]})
        assert said == ["the fork server could not fork the trainer (-9): each later "
                        "generation starts from a standby of its own"]  # fmt: skip
        assert swept == [1], "swept once, after the server was given up"
        assert child is not None and not isinstance(child, ForkedTrainer)
        assert _written(f"{out}-0.json")["pid"] == child.pid and child.wait() == 0
    finally:
        keeper.drop()


def test_no_fork_before_a_server_started_means_a_standby_per_generation() -> None:
    said: list[str] = []
    keeper = _keeper([sys.executable, "-c", "pass"], ["json"], said)
    keeper.no_fork("this process cannot be a child subreaper")
    keeper.no_fork("said once")
    assert said == ["no fork server: this process cannot be a child subreaper; each generation "
                    "starts from a standby of its own"]  # fmt: skip
    try:
        _ready(keeper)
        assert keeper.source == "from its warm standby"
    finally:
        keeper.drop()


def test_a_handed_over_standby_leaves_no_descriptor_open() -> None:
    said: list[str] = []
    keeper = _keeper([sys.executable, "-c", "pass"], ["json"], said)
    keeper.no_fork("standbys")
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        _ready(keeper)
        child = keeper.take({"PATH": os.environ["PATH"]})
        assert child is not None and child.wait() == 0
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_gpu_device_open_in_the_server_refuses_the_fork(tmp_path: Path) -> None:
    fds = tmp_path / "fd"
    fds.mkdir()
    (fds / "3").symlink_to("/dev/nvidiactl")
    (fds / "4").symlink_to("/dev/nvidia-uvm")
    (fds / "5").symlink_to("/tmp/other")
    assert preload.gpu_devices_open(str(fds)) == ["/dev/nvidia-uvm", "/dev/nvidiactl"]
    assert preload.fork_refusal(str(fds)) == (
        "the fork server has /dev/nvidia-uvm, /dev/nvidiactl open (a GPU context a forked "
        "child cannot use)"
    )
    (fds / "3").unlink()
    (fds / "4").unlink()
    assert preload.fork_refusal(str(fds)) is None
