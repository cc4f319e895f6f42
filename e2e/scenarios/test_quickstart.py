"""docs/quickstart.md, command for command, on the local control plane (the doc is the
script): install the chart, make the namespace, the store's Secret and the queue, apply the
job, break it by deleting a worker pod, watch attempt 2 resume from a verified step and
`kubectl wait --for=condition=Complete`, clean up. Every fenced bash line of the doc runs
(with the pinned kubectl and helm, against the harness's kubeconfig) unless a substitution
below names it; each yaml block is written to the file the prose before it names.

What must differ here, each a named substitution matched against exactly one doc line or
block (a doc edit that drops it fails this test):

- NOT_ON_KWOK: `make images` and the two `ctr images import` lines are not run. The
  harness's nodes run no image (tests/integration/chart/test_real_install.py runs them on a
  real node).
- THE_OPERATOR: the chart's two replicas are pods on KWOK nodes, where nothing runs; after
  the doc's `rollout status` the operator runs as a local process in their place, on their
  Lease, watching the quickstart's namespace (as every scenario's operator does, with the
  harness's credentials: the chart's RBAC is tests/integration/chart/test_chart_install.py's).
- STORE_SECRET: the values of the Secret's `--from-literal` keys are the harness's S3
  server's (endpoint, credentials, region); the keys are the doc's.
- BUCKET: `s3://YOUR-BUCKET/` in quickstart.yaml is a fresh bucket of that server.
- RUNNER_FLAVOR: quickstart-queue.yaml's ResourceFlavor gains the label and toleration of
  the pod runner's nodes (e2e/podrunner: the job's pods run there as local processes; the
  python3 and rtj-shim of this checkout's virtualenv stand for the image's).
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from scenario_runner import runner_nodes
from scenario_support import WAIT, condition_true

from e2e.cluster import build
from e2e.operator_proc import REPO, OperatorProcess, client, rtj_status, wait_for
from e2e.podrunner.runner import NODE_LABEL, NODE_LABEL_VALUE, PodRunner
from e2e.s3server import S3Server, aws_env
from rtj_operator.api import keys

pytestmark = [pytest.mark.cluster, pytest.mark.operator, pytest.mark.local_only,
              pytest.mark.timeout(420)]  # fmt: skip

DOC = REPO / "docs" / "quickstart.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
SAVE_AS = re.compile(r"save this as `([\w.-]+)`", re.I)
NS, JOB, RELEASE_NS = "rtj-quickstart", "quickstart", "rtj-system"
SA = "rtj-resilient-training-operator"
STEPS, EVERY = 240, 10
"""As the doc's train.py says (checked below)."""
TAINT = {"key": "e2e.resilient.dev/quickstart", "value": "runner", "effect": "NoSchedule"}

NOT_ON_KWOK = (
    "make images",
    "ctr -n k8s.io images import dist/images/rtj-operator.oci.tar",
    "ctr -n k8s.io images import dist/images/rtj-resolver.oci.tar",
)
ROLLOUT = f"kubectl -n {RELEASE_NS} rollout status deploy/{SA}"
STORE_SECRET = f"kubectl create secret generic quickstart-s3 -n {NS}"
BUCKET = "s3://YOUR-BUCKET/"
BREAK = f"kubectl delete pod -n {NS} -l {keys.JOB_LABEL}={JOB},{keys.JOB_COMPLETION_INDEX}=1"
WAIT_COMPLETE = f"kubectl wait --for=condition=Complete rtj/{JOB} -n {NS} --timeout=10m"
CLEAN_UP = (f"kubectl delete -f {JOB}.yaml", "kubectl delete -f quickstart-queue.yaml",
            f"kubectl delete namespace {NS}", f"helm uninstall rtj -n {RELEASE_NS}",
            f"kubectl delete namespace {RELEASE_NS}")  # fmt: skip


# --- the doc -----------------------------------------------------------------------------


def doc_script(text: str) -> tuple[list[str], dict[str, str]]:
    """The doc's bash commands in order (continuations joined, comments dropped) and its
    files: each yaml block under the name the prose before it gives (`save this as X`)."""
    commands: list[str] = []
    files: dict[str, str] = {}
    at = 0
    for m in FENCE.finditer(text):
        lang, body = m.group(1), m.group(2)
        if lang == "bash":
            for line in body.replace("\\\n", " ").splitlines():
                line = line.split(" # ", 1)[0].strip()
                if line and not line.startswith("#"):
                    commands.append(" ".join(line.split()))
        elif lang == "yaml":
            names = SAVE_AS.findall(text[at : m.start()])
            assert names, f"a yaml block with no `save this as`: {body[:60]!r}"
            files[names[-1]] = body
        at = m.end()
    return commands, files


def once(commands: list[str], line: str) -> str:
    assert commands.count(line) == 1, f"docs/quickstart.md has {line!r} not once"
    return line


def store_secret(command: str, env: dict[str, str]) -> str:
    """STORE_SECRET: the doc's keys, the harness's values."""
    argv = shlex.split(command)
    out = []
    for arg in argv:
        if arg.startswith("--from-literal="):
            key = arg.removeprefix("--from-literal=").split("=", 1)[0]
            assert key in env, f"the doc's Secret has {key}, the harness's store no such value"
            arg = f"--from-literal={key}={env[key]}"
        out.append(arg)
    assert any(a.startswith("--from-literal=AWS_ENDPOINT_URL_S3=") for a in out), command
    return shlex.join(out)


def runner_flavor(queue_yaml: str) -> str:
    """RUNNER_FLAVOR: the doc's ResourceFlavor places the pods on the runner's nodes."""
    docs = list(yaml.safe_load_all(queue_yaml))
    (flavor,) = [d for d in docs if d["kind"] == "ResourceFlavor"]
    flavor["spec"] = {**(flavor.get("spec") or {}), "nodeLabels": {NODE_LABEL: NODE_LABEL_VALUE},
                      "tolerations": [{**TAINT, "operator": "Equal"}]}  # fmt: skip
    return yaml.safe_dump_all(docs)


def expected_state() -> str:
    state = hashlib.sha256(b"seed").hexdigest()
    for step in range(1, STEPS + 1):
        state = hashlib.sha256(f"{state}/{step}".encode()).hexdigest()
    return state


# --- the machine the doc runs on ---------------------------------------------------------


@pytest.fixture
def runner(rtj_cluster: Any, tmp_path: Path) -> Iterator[PodRunner]:
    """Two tainted nodes of the pod runner (the session's KWOK nodes stay for the others)."""
    prefix = f"quickstart-{uuid.uuid4().hex[:4]}-"
    with runner_nodes(rtj_cluster, tmp_path / "runner", nodes=2, prefix=prefix,
                      taint=TAINT) as r:  # fmt: skip
        yield r


def _shell_env(rtj_cluster: Any, tmp: Path) -> dict[str, str]:
    """KUBECONFIG: the harness's; PATH: the pinned kubectl and helm first."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    for name in ("kubectl", "helm"):
        if build.missing([name]):
            build.build([name], quiet=True)
        (bin_dir / name).symlink_to(build.binary_path(name))
    return {**os.environ, "KUBECONFIG": str(rtj_cluster.kubeconfig),
            "PATH": f"{bin_dir}:{os.environ['PATH']}"}  # fmt: skip


def _gone(rtj_cluster: Any, ns: str) -> bool:
    try:
        rtj_cluster.kube.core.read_namespace(ns)
    except k8s.ApiException:
        return True
    return False


def _trainer_logs(runner: PodRunner, attempt: int) -> dict[str, str]:
    """Attempt `attempt`'s trainers' output, by pod directory, as the runner kept it."""
    found = sorted((runner.root / "pods" / NS).glob(f"{JOB}-a{attempt}-*/containers/trainer/log"))
    return {p.parts[-4]: p.read_text(errors="replace") for p in found}


# --- the walk-through --------------------------------------------------------------------


def test_the_quickstart_installs_runs_breaks_and_recovers_a_job_as_written(
    rtj_cluster: Any, s3_server: S3Server, runner: PodRunner, tmp_path: Path
) -> None:
    commands, files = doc_script(DOC.read_text(encoding="utf-8"))
    assert set(files) == {"quickstart-queue.yaml", f"{JOB}.yaml"}, sorted(files)
    assert f"STEPS, EVERY = {STEPS}, {EVERY}" in files[f"{JOB}.yaml"]
    for line in (*NOT_ON_KWOK, ROLLOUT, BREAK, WAIT_COMPLETE, *CLEAN_UP):
        once(commands, line)
    (secret,) = [c for c in commands if c.startswith(STORE_SECRET + " ")]
    assert files[f"{JOB}.yaml"].count(BUCKET) == 1, f"quickstart.yaml names {BUCKET} once"

    work = tmp_path / "checkout"  # the reader's checkout: the chart, the files they saved
    work.mkdir()
    (work / "charts").symlink_to(REPO / "charts")
    bucket = s3_server.create_bucket()
    (work / "quickstart-queue.yaml").write_text(runner_flavor(files["quickstart-queue.yaml"]))
    (work / f"{JOB}.yaml").write_text(files[f"{JOB}.yaml"].replace(BUCKET, f"s3://{bucket}/"))
    env = _shell_env(rtj_cluster, tmp_path)
    store_env = aws_env(s3_server.url, s3_server.allowed)
    operator: list[OperatorProcess] = []

    def sh(command: str, timeout: float = 180) -> str:
        argv = ["bash", "-euo", "pipefail", "-c", command]
        done = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True,
                              timeout=timeout, check=False)  # fmt: skip
        assert done.returncode == 0, f"docs/quickstart.md: {command}\n{done.stdout}{done.stderr}"
        return done.stdout

    def start_operator() -> None:  # THE_OPERATOR
        proc = OperatorProcess(
            rtj_cluster.kubeconfig, NS, tmp_path, lease_name=SA,
            extra=("--lease-namespace", RELEASE_NS, "--lease-name", SA),
        )  # fmt: skip
        operator.append(proc)
        proc.start()

    def running_with_a_checkpoint() -> None:
        """What the doc has the reader wait for before breaking it: Running, and CHECKPOINT
        (a step the operator verified in the bucket) in `kubectl get rtj`."""
        wait_for("Running with a verified checkpoint", lambda: (
            (s := rtj_status(api, NS, JOB)).get("phase") == "Running"
            and (s.get("lastVerifiedCheckpoint") or {}).get("step")
        ), 120)  # fmt: skip
        table = sh(f"kubectl get rtj {JOB} -n {NS}").splitlines()
        assert table[0].split()[:6] == [
            "NAME", "PHASE", "ATTEMPT", "WORKERS", "STEP", "STEPS/S"
        ], table  # fmt: skip
        assert table[1].split()[:3] == [JOB, "Running", "1"], table

    api = client(rtj_cluster.kubeconfig)
    after: dict[str, Callable[[], None]] = {ROLLOUT: start_operator}
    before: dict[str, Callable[[], None]] = {BREAK: running_with_a_checkpoint}
    passed = False
    try:
        for command in commands:
            if command in NOT_ON_KWOK:
                continue
            if command in CLEAN_UP:
                break  # after the checks below
            before.get(command, lambda: None)()
            sh(store_secret(command, store_env) if command == secret else command,
               timeout=660 if command == WAIT_COMPLETE else 180)  # fmt: skip
            after.get(command, lambda: None)()

        status = rtj_status(api, NS, JOB)
        assert condition_true(status, "Complete") and status["phase"] == "Succeeded", status
        assert status["attempt"] == 2, status
        first, second = status["attempts"]
        assert first["failureClass"] == "Unknown", first  # as the doc says
        assert (second.get("resumedFromStep") or 0) >= EVERY, second
        logs = _trainer_logs(runner, 2)
        assert len(logs) == 2, sorted(logs)
        for log in logs.values():  # resumed, not restarted, and the fault-free result
            assert re.search(r"attempt 2: from step [1-9]\d*\b", log), log
            assert f"done, step {STEPS}, state {expected_state()}" in log, log
        passed = True
    finally:
        failed = []  # the doc's clean-up, as written: after a failure, as far as it goes
        for command in (c for c in commands if c in CLEAN_UP):
            try:
                sh(command)
            except AssertionError as exc:
                failed.append(str(exc))
        for ns in (NS, RELEASE_NS):  # the session's other installs start clean
            wait_for(f"namespace {ns} gone", lambda ns=ns: _gone(rtj_cluster, ns), WAIT)
        for proc in operator:
            proc.stop()
            print(f"\n--- {proc.log_path.name} (last 4000 chars) ---\n{proc.log()[-4000:]}")
    assert not (passed and failed), failed
