"""The soak's CPU accounting: a process's component from its command line, and the sums."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from bench import cpu_account
from bench.cpu_account import component

VENV = "/repo/.venv/bin"


def test_each_process_of_a_soak_has_its_component() -> None:
    assert (
        component([f"{VENV}/python", f"{VENV}/torchrun", "--nnodes=2", "examples/ddp_train.py"])
        == "torchrun agent"
    )
    assert component([sys.executable, "-m", "torch.distributed.run", "--standalone",
                      "examples/ddp_train.py"]) == "torchrun agent"  # fmt: skip
    assert component([f"{VENV}/python", f"{VENV}/rtj-shim", "supervise", "--control-dir", "/c",
                      "--", "python", "examples/ddp_train.py"]) == "rtj-shim supervise"  # fmt: skip
    assert component([f"{VENV}/python", "-u", "examples/ddp_train.py", "--steps=10"]) == "trainer"
    standby = [f"{VENV}/python", "-m", "rtj_shim.agent.preload", "examples/ddp_train.py"]
    assert component(standby, waiting=True) == "fork server / warm standby (waiting)"
    assert component(standby) == "trainer (forked or handed over warm)"
    assert component([f"{VENV}/python", f"{VENV}/rtj-shim", "progress-server", "--dir", "/p"]) == (
        "rtj-shim progress-server"
    )
    assert component([f"{VENV}/python", "-m", "rtj_operator", "run"]) == "operator"
    assert component([f"{VENV}/python", "-m", "e2e.podrunner", "--kubeconfig", "k"]) == "pod runner"
    assert component([f"{VENV}/python", "-m", "moto.server", "-H", "127.0.0.1"]) == (
        "S3 server (moto)"
    )
    assert component(["/root/.cache/rtj/bin/kube-apiserver", "--etcd-servers=x"]) == (
        "control plane: kube-apiserver"
    )
    assert component(["/root/.cache/rtj/bin/kube-apiserver-v1.35.4", "--etcd-servers=x"]) == (
        "control plane: kube-apiserver"
    )  # the harness's binaries carry their version (e2e/cluster/build.py)
    assert component(["/root/.cache/rtj/bin/etcd-v3.6.5"]) == "control plane: etcd"
    assert component(["/usr/sbin/sshd", "-D"]) is None
    assert component([]) is None


def test_totals_sum_per_component_largest_first() -> None:
    ticks = cpu_account.TICKS
    got = cpu_account.totals([("trainer", 3 * ticks), ("operator", ticks), ("trainer", ticks)])
    assert got == {"trainer": 4.0, "operator": 1.0}
    assert list(got) == ["trainer", "operator"]
    rows = cpu_account.markdown_rows({"(a)": got, "(b)": {"trainer": 2.5}})
    assert rows[2] == "| trainer | 4.0 | 2.5 |"
    assert rows[3] == "| operator | 1.0 | - |"
    assert rows[-1] == "| **all** | **5.0** | **2.5** |"


def test_the_sampler_counts_a_busy_child_started_after_it(tmp_path: Path) -> None:
    sampler = cpu_account.CpuSampler(every=0.2)
    sampler.start()
    busy = "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass\ntime.sleep(0.5)\n"  # noqa: E501
    script = tmp_path / "ddp_train.py"
    script.write_text(busy)
    child = subprocess.Popen([sys.executable, str(script)])
    child.wait(timeout=30)
    time.sleep(0.1)
    got = sampler.stop()
    assert 0.5 <= got.get("trainer", 0.0) <= 1.5, got
    assert "harness" in got
