"""The pod status the runner writes, as a kubelet would (pure)."""

from __future__ import annotations

from typing import Any

from e2e.podrunner.status import PodRun, exit_code, phase, render_status, tail, termination

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:00:05Z"


def pod() -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "uid": "u"},
        "spec": {
            "initContainers": [{"name": "init", "image": "i"}],
            "containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}],
        },
    }


def term(rc: int, **kw: Any) -> dict[str, Any]:
    args: dict[str, Any] = dict(
        returncode=rc, started_at=T0, finished_at=T1, message_file=b"", log=b"",
        policy="File", container_id="local://n/1",
    )  # fmt: skip
    args.update(kw)
    return termination(**args)


def test_lifecycle_phases_with_restart_policy_never() -> None:
    run = PodRun.of(pod(), T0)
    assert phase(run) == "Pending"
    run.start("init", T0)
    assert phase(run) == "Pending"
    run.finish("init", term(0))
    run.start("a", T0)
    run.start("b", T0)
    status = render_status(run, pod(), T1)
    assert status["phase"] == "Running"
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"
    run.finish("a", term(0))
    assert phase(run) == "Running", "b still runs"
    run.finish("b", term(1))
    status = render_status(run, pod(), T1)
    assert status["phase"] == "Failed"
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready == {"type": "Ready", "status": "False", "reason": "PodCompleted",
                     "lastTransitionTime": T1}  # fmt: skip


def test_a_failed_init_container_fails_the_pod() -> None:
    run = PodRun.of(pod(), T0)
    run.finish("init", term(3, message_file=b"checkpoint step 200 failed verification"))
    status = render_status(run, pod(), T1)
    assert status["phase"] == "Failed"
    (init,) = status["initContainerStatuses"]
    assert init["state"]["terminated"]["message"] == "checkpoint step 200 failed verification"
    assert all("waiting" in c["state"] for c in status["containerStatuses"])


def test_a_terminal_phase_waits_for_the_sidecars_to_stop() -> None:
    """An init container failed after a sidecar started: the pod is done, but the kubelet
    keeps the phase it reported until the sidecar has stopped (status_manager.go
    mergePodStatus, v1.27+), with the failed init container's state already shown."""
    spec = {
        "metadata": {"name": "p", "uid": "u"},
        "spec": {
            "initContainers": [
                {"name": "side", "image": "s", "restartPolicy": "Always"},
                {"name": "check", "image": "c"},
            ],
            "containers": [{"name": "main", "image": "m"}],
        },
    }
    run = PodRun.of(spec, T0)
    run.start("side", T0)
    run.start("check", T0)
    assert render_status(run, spec, T1)["phase"] == "Pending"
    run.finish("check", term(2))
    assert phase(run) == "Failed"
    held = render_status(run, spec, T1, "Pending")
    assert held["phase"] == "Pending", "the sidecar still runs"
    assert held["initContainerStatuses"][1]["state"]["terminated"]["exitCode"] == 2
    run.finish("side", term(0))
    assert render_status(run, spec, T1, "Pending")["phase"] == "Failed"


def test_all_zero_exits_succeed() -> None:
    run = PodRun.of(pod(), T0)
    for name in ("init", "a", "b"):
        run.finish(name, term(0))
    assert phase(run) == "Succeeded"


def test_termination_reasons_signals_and_messages() -> None:
    assert exit_code(-9) == 137 and exit_code(2) == 2
    killed = term(-9)
    assert killed["exitCode"] == 137 and killed["signal"] == 9 and killed["reason"] == "Error"
    assert term(0)["reason"] == "Completed" and "message" not in term(0)
    assert term(137, oom=True)["reason"] == "OOMKilled"
    log = b"".join(f"line {i}\n".encode() for i in range(200))
    fallback = term(1, log=log, policy="FallbackToLogsOnError")
    assert fallback["message"].startswith("line 120") and fallback["message"].endswith("line 199")
    assert "message" not in term(1, log=log, policy="File"), "File policy: no log fallback"
    assert term(1, log=log, message_file=b"own", policy="FallbackToLogsOnError")["message"] == "own"


def test_tail_is_bounded() -> None:
    assert len(tail(b"x" * 10_000)) == 2048


def test_on_failure_a_failed_main_container_restarts_and_the_pod_stays_running() -> None:
    body = pod()
    body["spec"]["restartPolicy"] = "OnFailure"
    run = PodRun.of(body, T0)
    assert run.restart_policy == "OnFailure"
    run.finish("init", term(0))
    run.start("a", T0)
    run.start("b", T0)
    run.finish("a", term(0))
    run.finish("b", term(3))
    assert phase(run) == "Running", "b is restarted in the pod"
    run.back_off("b", "back-off 1s restarting failed container=b")
    status = render_status(run, body, T1)
    assert status["phase"] == "Running"
    b = status["containerStatuses"][1]
    assert b["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert b["lastState"]["terminated"]["exitCode"] == 3
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False", "a container in back-off is not ready"
    run.start("b", T1)
    assert run.get("b").restart_count == 1 and phase(run) == "Running"
    run.finish("b", term(0))
    assert phase(run) == "Succeeded"


def test_on_failure_a_deleted_pod_whose_container_failed_is_failed() -> None:
    body = pod()
    body["spec"]["restartPolicy"] = "OnFailure"
    run = PodRun.of(body, T0)
    run.finish("init", term(0))
    run.start("a", T0)
    run.start("b", T0)
    run.finish("a", term(0))
    run.finish("b", term(137))
    run.back_off("b", "back-off")
    run.terminal = True  # deleted: nothing restarts
    assert phase(run) == "Failed"
    never = PodRun.of(pod(), T0)
    assert never.restart_policy == "Never", "absent: run as Never"
