"""What ``import rtj_shim.torch`` costs a trainer's start: torch and the shim, not
``torch.distributed.checkpoint`` (DTensor, FX, sympy: about 2 CPU-seconds here), which only
a sharded (FSDP) state needs and which the shim imports when it saves or loads one."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch.distributed.checkpoint", "torch.distributed.tensor", "torch.distributed.fsdp")


def test_importing_the_shim_and_registering_a_plain_module_leaves_dcp_unimported() -> None:
    probe = (
        "import sys, torch\n"
        "from rtj_shim.torch.state import is_sharded_module\n"
        "assert not is_sharded_module(torch.nn.Linear(2, 2))\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_a_module_sharded_by_fully_shard_is_still_recognised() -> None:
    """FSDP2 on one CPU rank (gloo): the script imported the modules, so the check finds them."""
    probe = (
        "import tempfile, torch, torch.distributed as dist\n"
        "from torch.distributed.device_mesh import init_device_mesh\n"
        "from torch.distributed.fsdp import fully_shard\n"
        "from rtj_shim.torch.state import is_sharded_module\n"
        "store = dist.FileStore(tempfile.mktemp(), 1)\n"
        "dist.init_process_group('gloo', store=store, rank=0, world_size=1)\n"
        "model = torch.nn.Sequential(torch.nn.Linear(2, 2))\n"
        "fully_shard(model, mesh=init_device_mesh('cpu', (1,)))\n"
        "print(is_sharded_module(model), is_sharded_module(torch.nn.Linear(2, 2)))\n"
        "dist.destroy_process_group()\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True False", out.stdout + out.stderr
