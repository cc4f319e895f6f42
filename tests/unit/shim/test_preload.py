"""Which commands a warm standby can run, and the module list (`rtj_shim.agent.preload`)."""

from __future__ import annotations

import pytest

from rtj_shim.agent.preload import PythonCommand, parse_modules, split_command


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["python", "train.py", "--steps", "9"],
         PythonCommand("python", (), ("train.py", "--steps", "9"))),
        (["/usr/bin/python3.11", "-u", "-m", "pkg.train", "-x"],
         PythonCommand("/usr/bin/python3.11", ("-u",), ("-m", "pkg.train", "-x"))),
        (["python3", "-X", "dev", "-W", "error", "-c", "print(1)", "a"],
         PythonCommand("python3", ("-X", "dev", "-W", "error"), ("-c", "print(1)", "a"))),
        (["python", "-Xdev", "-mpkg"], PythonCommand("python", ("-Xdev",), ("-m", "pkg"))),
        (["python", "-u", "--", "train.py"], None),  # not an option we place
        (["python"], None),  # the program from stdin
        (["python", "-"], None),
        (["python", "-m"], None),
        (["python", "-X"], None),
        (["torchrun", "--nproc-per-node=8", "train.py"], None),
        (["sh", "-c", "python train.py"], None),
        (["pythonista", "train.py"], None),
        ([], None),
    ],
)  # fmt: skip
def test_split_command(argv: list[str], expected: PythonCommand | None) -> None:
    assert split_command(argv) == expected


def test_parse_modules_names_the_bad_one() -> None:
    assert parse_modules(" torch, rtj_shim.torch ,") == ("torch", "rtj_shim.torch")
    assert parse_modules("") == ()
    with pytest.raises(ValueError, match=r"--preload: 'os; rm' is not a module name"):
        parse_modules("torch,os; rm")
