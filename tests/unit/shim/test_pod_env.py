"""The environment contract, from the library's side (issue 44): what `rtj_shim.wire.pod_env`
says the shim reads, it reads; the table in docs/shim.md lists the contract; the two variables
the Checkpointer takes from the operator parse strictly."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rtj_shim.wire import pod_env
from rtj_shim.wire.pod_env import Reader

SHIM = Path(pod_env.__file__).parents[1]  # the package, every wing
SHIM_DOC = Path(__file__).resolve().parents[3] / "docs" / "shim.md"


def _shim_sources() -> str:
    return "\n".join(p.read_text() for p in sorted(SHIM.rglob("*.py")) if p.name != "pod_env.py")


READ_THROUGH_POD_ENV = (
    pod_env.CHECKPOINT_URI,
    pod_env.EMERGENCY_SAVE_SECONDS,
    pod_env.MAX_WRITE_BYTES_PER_SECOND,
)
"""Read by rtj_shim.wire.pod_env's own functions, which the shim calls."""


def test_every_variable_the_contract_says_the_shim_reads_is_read_by_it() -> None:
    sources = _shim_sources()
    ours = (Reader.CHECKPOINTER, Reader.SUPERVISOR, Reader.FAST_TIER, Reader.PROGRESS)
    unread = [
        v.name
        for v in pod_env.TRAINER_ENV
        if v.reader in ours and f'"{v.name}"' not in sources
        and v.name not in READ_THROUGH_POD_ENV
    ]  # fmt: skip
    assert unread == []


def test_the_shim_docs_table_lists_the_contract() -> None:
    text = SHIM_DOC.read_text()
    section = text.split("### Environment the operator injects", 1)[1].split("\n#", 1)[0]
    listed = set(re.findall(r"`((?:RTJ_|PET_)[A-Z_]+|MASTER_ADDR|MASTER_PORT|WORLD_SIZE|"
                            r"NNODES|NODE_RANK|RANK)`", section))  # fmt: skip
    assert listed == set(pod_env.names())


def test_the_emergency_deadline_is_the_operators_and_parses_strictly() -> None:
    assert pod_env.emergency_save_seconds({}) == pod_env.DEFAULT_EMERGENCY_SAVE_SECONDS
    assert pod_env.emergency_save_seconds({"RTJ_EMERGENCY_SAVE_SECONDS": "10"}) == 10.0
    assert pod_env.emergency_save_seconds({"RTJ_EMERGENCY_SAVE_SECONDS": "0"}) == 0.0
    for bad in ("-3", "ten", "nan", "inf"):
        with pytest.raises(ValueError, match=rf"RTJ_EMERGENCY_SAVE_SECONDS='{bad}'"):
            pod_env.emergency_save_seconds({"RTJ_EMERGENCY_SAVE_SECONDS": bad})


def test_no_root_and_no_uri_is_an_error_naming_both() -> None:
    assert pod_env.checkpoint_uri({"RTJ_CHECKPOINT_URI": "s3://b/r"}) == "s3://b/r"
    with pytest.raises(ValueError, match=r"root: none given and RTJ_CHECKPOINT_URI is not set"):
        pod_env.checkpoint_uri({})
