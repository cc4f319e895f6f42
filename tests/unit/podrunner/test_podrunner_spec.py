"""From a pod to local processes: env, $(VAR) expansion, mount paths, rendezvous (pure)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from e2e.podrunner.spec import (
    LOOPBACK,
    LocalProcess,
    PathMap,
    PodDirs,
    PodNotRunnable,
    Sources,
    expand,
    field_ref,
    plan_pod,
    slowed,
)

DIRS = PodDirs(pod=Path("/r/pods/ns/p-1"), node=Path("/r/nodes/n1"), claims=Path("/r/claims"))
SECRETS = {"creds": {"AWS_ACCESS_KEY_ID": "AKIA", "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9"}}
PORTS = {"js-a2": 40123}
INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"


def sources() -> Sources:
    return Sources(
        secrets=lambda name: SECRETS[name],
        config_maps=lambda name: {"mode": "fast"},
        master_port=lambda sub: PORTS[sub],
    )


def pod(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "subdomain": "js-a2",
        "nodeName": "n1",
        "volumes": [{"name": "resume", "emptyDir": {}},
                    {"name": "ckpt", "hostPath": {"path": "/mnt/ckpt"}}],
        "initContainers": [
            {
                "name": "rtj-resume",
                "command": ["rtj-shim", "resolve", "--root", "file:///mnt/ckpt/job",
                            "--write", "/var/run/rtj/resume.json",
                            "--termination-log", "/dev/termination-log"],
                "terminationMessagePath": "/dev/termination-log",
                "envFrom": [{"secretRef": {"name": "creds"}}],
                "volumeMounts": [{"name": "resume", "mountPath": "/var/run/rtj"},
                                 {"name": "ckpt", "mountPath": "/mnt/ckpt"}],
            }
        ],
        "containers": [
            {
                "name": "trainer",
                "command": ["torchrun", "train.py", "--log=$(LOG_DIR)/x", "--rank=$(RANK)",
                            "$$HOME"],
                "env": [
                    {"name": "LOG_DIR", "value": "/var/run/rtj/logs"},
                    {"name": "RANK", "valueFrom": {"fieldRef": {"fieldPath": INDEX}}},
                    {"name": "MASTER_ADDR", "value": "js-a2-worker-0-0.js-a2"},
                    {"name": "MASTER_PORT", "value": "29500"},
                    {"name": "OTHER_HOST", "value": "db.example.com"},
                    {"name": "LIGHTHOUSE", "value": "http://js-a2-lighthouse-0-0.js-a2:29510"},
                    {"name": "FQDN", "value": "js-a2-worker-0-0.js-a2.ns.svc.cluster.local"},
                    {"name": "NOT_A_HOST", "value": "/data/x.js-a2b/y.js-a2.txt"},
                    {"name": "MODE",
                     "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "mode"}}},
                ],
                "volumeMounts": [{"name": "resume", "mountPath": "/var/run/rtj", "readOnly": True}],
            }
        ],
    }  # fmt: skip
    base.update(spec)
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "1",
                     "annotations": {"batch.kubernetes.io/job-completion-index": "1"}},
        "spec": base,
    }  # fmt: skip


def plan(p: dict[str, Any]) -> Any:
    return plan_pod(p, DIRS, sources(), workdir=Path("/repo"), base_env={"PATH": "/venv/bin"})


def test_init_container_paths_map_to_the_pods_volumes_and_termination_log() -> None:
    init, trainer = plan(pod()).processes
    assert init.init and not trainer.init
    assert init.argv == [
        "rtj-shim", "resolve", "--root", "file:///r/nodes/n1/hostpath/mnt/ckpt/job",
        "--write", "/r/pods/ns/p-1/volumes/resume/resume.json",
        "--termination-log", "/r/pods/ns/p-1/containers/rtj-resume/termination-log",
    ]  # fmt: skip
    assert init.termination_log == DIRS.container("rtj-resume") / "termination-log"
    assert init.env["AWS_ACCESS_KEY_ID"] == "AKIA"
    assert init.env["PATH"] == "/venv/bin" and init.cwd == Path("/repo")


def test_env_expansion_downward_api_and_rendezvous_on_loopback() -> None:
    trainer = plan(pod()).processes[1]
    assert trainer.argv == [
        "torchrun", "train.py", "--log=/r/pods/ns/p-1/volumes/resume/logs/x", "--rank=1", "$HOME"
    ]  # fmt: skip
    assert trainer.env["RANK"] == "1" and trainer.env["MODE"] == "fast"
    assert trainer.env["MASTER_ADDR"] == LOOPBACK
    assert trainer.env["MASTER_PORT"] == "40123", "the runner's port for this subdomain"
    assert trainer.env["OTHER_HOST"] == "db.example.com", "only the pod's own subdomain maps"
    assert trainer.env["LIGHTHOUSE"] == f"http://{LOOPBACK}:29510", "a host inside a URL too"
    assert trainer.env["FQDN"] == LOOPBACK
    assert trainer.env["NOT_A_HOST"] == "/data/x.js-a2b/y.js-a2.txt"
    assert trainer.env["HOSTNAME"] == "p"


def test_volume_directories_are_planned() -> None:
    assert plan(pod()).directories == sorted(
        [DIRS.volume("resume"), DIRS.node / "hostpath" / "mnt/ckpt"]
    )


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("/data", "/L"),
        ("/data/x/y", "/L/x/y"),
        ("--out=/data/x", "--out=/L/x"),
        ("file:///data/ckpt", "file:///L/ckpt"),
        ("/database", "/database"),
        ("/other/data", "/other/data"),
        ("cat /data/a; ls /data", "cat /L/a; ls /L"),
        ("/data.bak", "/data.bak"),
    ],
)
def test_paths_map_on_boundaries_only(text: str, want: str) -> None:
    assert PathMap({"/data": Path("/L")})(text) == want


def test_longest_mount_wins() -> None:
    m = PathMap({"/a": Path("/A"), "/a/b": Path("/B")})
    assert m("/a/b/c") == "/B/c" and m("/a/c") == "/A/c"


def test_expand_follows_kubernetes_rules() -> None:
    env = {"A": "1", "B": "x"}
    assert expand("$(A)-$(B)-$(C)-$$(A)", env) == "1-x-$(C)-$(A)"


def test_field_refs() -> None:
    p = pod()
    assert field_ref(p, "metadata.name") == "p"
    assert field_ref(p, "spec.nodeName") == "n1"
    assert field_ref(p, "metadata.labels['missing']") == ""
    with pytest.raises(PodNotRunnable, match=r"limits\.cpu"):
        field_ref(p, "limits.cpu")


def test_unsupported_volume_names_the_field() -> None:
    p = pod(volumes=[{"name": "nfs", "nfs": {"server": "x", "path": "/"}}])
    with pytest.raises(PodNotRunnable, match=r"spec.volumes\[nfs\]: \['nfs'\]"):
        plan(p)


def test_a_container_without_command_cannot_run() -> None:
    p = pod(initContainers=[], containers=[{"name": "c", "image": "x"}])
    with pytest.raises(PodNotRunnable, match=r"containers\[c\].command"):
        plan(p)


def test_secret_volumes_become_files() -> None:
    p = pod(
        initContainers=[],
        volumes=[{"name": "s", "secret": {"secretName": "creds"}}],
        containers=[{"name": "c", "command": ["cat", "/etc/s/AWS_ACCESS_KEY_ID"],
                     "volumeMounts": [{"name": "s", "mountPath": "/etc/s"}]}],
    )  # fmt: skip
    out = plan(p)
    assert out.files[DIRS.volume("s") / "AWS_ACCESS_KEY_ID"] == b"AKIA"
    assert out.processes[0].argv == ["cat", f"{DIRS.volume('s')}/AWS_ACCESS_KEY_ID"]


def test_a_slow_link_throttles_the_preflight_ring_and_nothing_else() -> None:
    def process(argv: list[str]) -> LocalProcess:
        return LocalProcess(container="c", init=True, argv=argv, env={}, cwd=Path("/"),
                            log=Path("/log"), termination_log=Path("/t"),
                            message_policy="File", sidecar=False)  # fmt: skip

    ring = process(["/venv/bin/rtj-shim", "preflight", "--timeout", "60", "--", "dcgmi", "diag"])
    assert slowed(ring, 4e6).argv == [
        "/venv/bin/rtj-shim", "preflight", "--throttle-bytes-per-second=4e+06", "--timeout",
        "60", "--", "dcgmi", "diag",
    ]  # fmt: skip
    for other in (["rtj-shim", "resolve"], ["python3", "train.py", "preflight"], ["rtj-shim"]):
        assert slowed(process(other), 4e6).argv == other
