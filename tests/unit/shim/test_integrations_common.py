"""What every framework integration shares (`rtj_shim.integrations._common`) needs no torch:
an integration for a framework without it (JAX with Orbax) can publish and resolve steps
with it, and the errors the integrations raise are the Checkpointer's."""

from __future__ import annotations

import subprocess
import sys

from rtj_shim.errors import CheckpointError
from rtj_shim.wire.resume_file import DEFAULT_PATH


def test_the_shared_part_of_the_integrations_imports_no_torch() -> None:
    probe = (
        "import sys; import rtj_shim.integrations._common; "
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=120)  # fmt: skip
    assert out.stdout.strip() == "[]", out.stdout


def test_the_integrations_raise_the_checkpointers_error_and_read_its_resume_file() -> None:
    import rtj_shim.torch as rtj_torch
    from rtj_shim.torch.options import DEFAULT_RESUME_FILE

    assert rtj_torch.CheckpointError is CheckpointError
    assert issubclass(rtj_torch.NonFiniteStateError, CheckpointError)
    assert DEFAULT_RESUME_FILE == DEFAULT_PATH == "/var/run/rtj/resume.json"
