"""render_jobset(): the JobSet for attempt n, checked field by field against the contract."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from rtj_test_support import NOW, job_body

from rtj_operator.api import FailureClass, QuarantinedNode, ResilientTrainingJob
from rtj_operator.policy.pod_security import root_refusal_hint
from rtj_operator.policy.render import (
    quarantine_taint,
    render_jobset,
    resolver_command,
)
from rtj_operator.policy.worker_env import master_addr

RANK_PATH = "metadata.annotations['batch.kubernetes.io/job-completion-index']"


def _job(quarantined: tuple[str, ...] = (), **spec: Any) -> ResilientTrainingJob:
    body = job_body(**spec)
    body["status"] = {
        "quarantinedNodes": [
            QuarantinedNode(
                node=n, failure_class=FailureClass.GPU_FAULT, attempt=1, since=NOW
            ).to_json()
            for n in quarantined
        ]
    }
    return ResilientTrainingJob.from_object(body)


def _pod(js: dict[str, Any]) -> dict[str, Any]:
    job = js["spec"]["replicatedJobs"][0]["template"]
    return job["spec"]["template"]  # type: ignore[no-any-return]


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_jobset_identity_queue_and_ownership() -> None:
    js = render_jobset(_job(), 3, 12000)
    meta = js["metadata"]
    assert js["apiVersion"] == "jobset.x-k8s.io/v1alpha2" and js["kind"] == "JobSet"
    assert meta["name"] == "llm-a3" and meta["namespace"] == "team-a"
    assert meta["labels"] == {
        "kueue.x-k8s.io/queue-name": "team-a",
        "training.resilient.dev/job": "llm",
        "training.resilient.dev/attempt": "3",
    }
    owner = meta["ownerReferences"][0]
    assert owner["kind"] == "ResilientTrainingJob" and owner["uid"] == "6f1c-uid"
    assert owner["controller"] is True


def test_the_users_kueue_labels_reach_every_attempts_jobset() -> None:
    body = job_body()
    body["metadata"]["labels"] = {
        "kueue.x-k8s.io/priority-class": "urgent",
        "kueue.x-k8s.io/max-exec-time-seconds": "3600",
        "kueue.x-k8s.io/queue-name": "elsewhere",  # spec.queueName decides
        "team": "a",  # not Kueue's: stays on the job
    }
    labels = render_jobset(ResilientTrainingJob.from_object(body), 2, None)["metadata"]["labels"]
    assert labels == {
        "kueue.x-k8s.io/priority-class": "urgent",
        "kueue.x-k8s.io/max-exec-time-seconds": "3600",
        "kueue.x-k8s.io/queue-name": "team-a",
        "training.resilient.dev/job": "llm",
        "training.resilient.dev/attempt": "2",
    }


def test_created_suspended_with_jobset_restarts_off() -> None:
    spec = render_jobset(_job(), 1, None)["spec"]
    assert spec["suspend"] is True
    assert spec["failurePolicy"] == {"maxRestarts": 0}
    assert spec["network"]["enableDNSHostnames"] is True
    job = spec["replicatedJobs"][0]
    assert job["name"] == "worker" and job["replicas"] == 1
    assert job["template"]["spec"]["backoffLimit"] == 0
    assert job["template"]["spec"]["completionMode"] == "Indexed"
    assert job["template"]["spec"]["parallelism"] == job["template"]["spec"]["completions"] == 4
    assert _pod(render_jobset(_job(), 1, None))["spec"]["restartPolicy"] == "Never"


def test_workers_get_stable_rank_and_rendezvous_env() -> None:
    pod = _pod(render_jobset(_job(masterPort=23456), 2, 12000))
    env = _env(pod["spec"]["containers"][0])
    assert env["MASTER_ADDR"] == "llm-a2-worker-0-0.llm-a2" == master_addr("llm-a2")
    assert env["MASTER_PORT"] == "23456"
    assert env["WORLD_SIZE"] == env["NNODES"] == env["PET_NNODES"] == "4"
    for name in ("NODE_RANK", "RANK", "PET_NODE_RANK"):
        assert env[name] == {"fieldRef": {"fieldPath": RANK_PATH}}


def test_torchrun_gets_one_process_per_gpu_unless_the_user_said_otherwise() -> None:
    """PET_NPROC_PER_NODE as Kubeflow Trainer sets it (the job asks for 8 GPUs per pod)."""
    pod = _pod(render_jobset(_job(), 1, None))
    assert _env(pod["spec"]["containers"][0])["PET_NPROC_PER_NODE"] == "8"
    body = job_body()
    trainer = body["spec"]["template"]["spec"]["containers"][0]
    trainer["env"] = [{"name": "PET_NPROC_PER_NODE", "value": "4"}]
    own = _pod(render_jobset(ResilientTrainingJob.from_object(body), 1, None))
    assert _env(own["spec"]["containers"][0])["PET_NPROC_PER_NODE"] == "4"
    del trainer["env"], trainer["resources"]  # a CPU job: torchrun's own default stays
    cpu = _pod(render_jobset(ResilientTrainingJob.from_object(body), 1, None))
    assert "PET_NPROC_PER_NODE" not in _env(cpu["spec"]["containers"][0])


def test_shim_env_and_retention() -> None:
    rtj = _job(
        provenance={
            "codeCommit": "3f2a9c1",
            "imageDigest": "sha256:abc",
            "datasetSnapshot": "ds@7",
        },
        checkpoint={"uri": "file:///mnt/ckpt/llm", "retention": {"keepLast": 5, "keepEvery": 1000}},
    )
    env = _env(_pod(render_jobset(rtj, 4, 11000))["spec"]["containers"][0])
    assert env["RTJ_RUN_ID"] == "team-a.llm" and env["RTJ_ATTEMPT"] == "4"
    assert env["RTJ_CODE_COMMIT"] == "3f2a9c1" and env["RTJ_IMAGE_DIGEST"] == "sha256:abc"
    assert env["RTJ_DATASET_SNAPSHOT"] == "ds@7"
    assert env["RTJ_RESUME_FILE"] == "/var/run/rtj/resume.json"
    assert env["RTJ_CHECKPOINT_URI"] == "file:///mnt/ckpt/llm"
    assert (env["RTJ_KEEP_LAST"], env["RTJ_KEEP_EVERY"]) == ("5", "1000")
    assert env["RTJ_PROTECT_STEP"] == env["RTJ_RESUME_STEP"] == "11000"


def test_operator_env_replaces_stale_user_values() -> None:
    body = job_body()
    body["spec"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": "RTJ_ATTEMPT", "value": "99"},
        {"name": "HF_HOME", "value": "/cache"},
    ]
    env = _pod(render_jobset(ResilientTrainingJob.from_object(body), 2, None))["spec"][
        "containers"
    ][0]["env"]
    names = [e["name"] for e in env]
    assert names.count("RTJ_ATTEMPT") == 1 and _env({"env": env})["RTJ_ATTEMPT"] == "2"
    assert "HF_HOME" in names
    assert "RTJ_RESUME_STEP" not in names  # nothing pinned


def test_resume_init_container_shares_an_empty_dir_with_the_trainer() -> None:
    body = job_body(
        checkpoint={"uri": "s3://ckpt/team-a/llm", "credentialsSecretRef": {"name": "s3-creds"}}
    )
    body["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "data", "mountPath": "/data"}
    ]
    pod = _pod(render_jobset(ResilientTrainingJob.from_object(body), 2, 12000))["spec"]
    init = pod["initContainers"][0]
    assert init["name"] == "rtj-resume"
    # a pinned step: the 4 pods split deep verification, each hashing its share once
    assert init["command"] == [
        "rtj-shim", "resolve", "--root", "s3://ckpt/team-a/llm", "--step", "12000", "--deep",
        "--deep-share", "$(RTJ_VERIFY_SHARE)/4",
        "--write", "/var/run/rtj/resume.json", "--termination-log", "/dev/termination-log",
    ]  # fmt: skip
    assert _env(init)["RTJ_VERIFY_SHARE"] == {"fieldRef": {"fieldPath": RANK_PATH}}
    assert init["image"] == pod["containers"][0]["image"]
    assert init["envFrom"] == [{"secretRef": {"name": "s3-creds"}}]
    assert {"name": "data", "mountPath": "/data"} in init["volumeMounts"]
    assert {"name": "rtj-resume", "emptyDir": {}} in pod["volumes"]
    trainer_mounts = pod["containers"][0]["volumeMounts"]
    assert {"name": "rtj-resume", "mountPath": "/var/run/rtj", "readOnly": True} in trainer_mounts
    assert "envFrom" not in pod["containers"][0] or pod["containers"][0]["envFrom"]


def test_unpinned_resume_lets_the_shim_pick_the_newest_valid_step() -> None:
    assert "--step" not in resolver_command("s3://b/p", None)
    # every pod picks the newest step itself: each hashes everything (all must agree)
    assert "--deep-share" not in resolver_command("file:///mnt/ckpt", None, replicas=4)
    js = render_jobset(_job(), 1, None)
    assert "training.resilient.dev/resume-step" not in js["metadata"]["annotations"]


def test_pod_hardening_and_termination_messages() -> None:
    pod = _pod(
        render_jobset(_job(checkpoint={"uri": "s3://b/p", "emergencySaveSeconds": 120}), 1, 7)
    )
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["terminationGracePeriodSeconds"] == 135
    assert "runAsNonRoot" not in spec["securityContext"], "a root image must start as written"
    trainer = spec["containers"][0]
    assert trainer["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert trainer["securityContext"]["allowPrivilegeEscalation"] is False
    assert trainer["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    # its JSON verdict when it ran; the log's tail (an ImportError) when it crashed before
    # writing one, so a crash is told apart from a corrupt checkpoint
    assert spec["initContainers"][0]["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_user_choices_win_over_defaults() -> None:
    body = job_body()
    tmpl = body["spec"]["template"]["spec"]
    tmpl["terminationGracePeriodSeconds"] = 600
    tmpl["containers"][0]["terminationMessagePolicy"] = "File"
    tmpl["containers"][0]["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
    spec = _pod(render_jobset(ResilientTrainingJob.from_object(body), 1, None))["spec"]
    assert spec["terminationGracePeriodSeconds"] == 600
    assert spec["containers"][0]["terminationMessagePolicy"] == "File"
    assert spec["containers"][0]["securityContext"]["capabilities"] == {"add": ["IPC_LOCK"]}


def test_quarantined_nodes_are_avoided_in_every_node_term() -> None:
    body = job_body()
    body["spec"]["template"]["spec"]["affinity"] = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["h100"]}]},
            {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["h200"]}]},
        ]}}
    }  # fmt: skip
    quarantined = {"node": "gpu-node-011", "failureClass": "GPUFault", "attempt": 1}
    body["status"] = {"quarantinedNodes": [{**quarantined, "since": "2025-03-14T11:20:00Z"}]}
    spec = _pod(render_jobset(ResilientTrainingJob.from_object(body), 2, None))["spec"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    avoid = {"key": "metadata.name", "operator": "NotIn", "values": ["gpu-node-011"]}
    assert len(terms) == 2 and all(avoid in t["matchFields"] for t in terms)
    assert all(t["matchExpressions"] for t in terms)


def test_one_worker_per_node_and_the_quarantine_taint_is_not_tolerated() -> None:
    body = job_body()
    body["spec"]["template"]["spec"]["tolerations"] = [
        {"key": "training.resilient.dev/unhealthy", "operator": "Exists"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    ]
    rtj = ResilientTrainingJob.from_object(body)
    spec = _pod(render_jobset(rtj, 1, None))["spec"]
    assert spec["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    anti = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti == [
        {
            "labelSelector": {"matchLabels": {"jobset.sigs.k8s.io/jobset-name": "llm-a1"}},
            "topologyKey": "kubernetes.io/hostname",
        }
    ]
    assert "nodeAffinity" not in spec["affinity"]
    assert quarantine_taint(rtj) == {
        "key": "training.resilient.dev/unhealthy", "value": "llm", "effect": "NoSchedule",
    }  # fmt: skip


def test_trainer_container_choice_picks_the_resolver_image() -> None:
    body = job_body(trainerContainer="trainer")
    containers = body["spec"]["template"]["spec"]["containers"]
    containers.insert(0, {"name": "sidecar", "image": "busybox:1.36"})
    pod = _pod(render_jobset(ResilientTrainingJob.from_object(body), 1, None))["spec"]
    assert pod["initContainers"][0]["image"] == containers[1]["image"]


@pytest.mark.parametrize("attempt", [1, 2, 17])
def test_render_is_pure_and_repeatable(attempt: int) -> None:
    rtj = _job(("gpu-node-011",))
    before = copy.deepcopy(rtj.model_dump())
    first = render_jobset(rtj, attempt, 500)
    assert render_jobset(rtj, attempt, 500) == first
    assert rtj.model_dump() == before


def test_longest_names_stay_dns_labels() -> None:
    body = job_body(replicas=9999)
    body["metadata"]["name"] = "a" * 36
    js = render_jobset(ResilientTrainingJob.from_object(body), 99999, None)
    pod_name = f"{js['metadata']['name']}-worker-0-9998-abcde"
    assert len(pod_name) <= 63


# --- security defaults: only where the user said nothing (policy/pod_security.py) -------------


def _rendered(template_spec: dict[str, Any], **spec: Any) -> dict[str, Any]:
    body = job_body(**spec)
    body["spec"]["template"]["spec"].update(template_spec)
    return _pod(render_jobset(ResilientTrainingJob.from_object(body), 1, 7))["spec"]  # type: ignore[no-any-return]


def _ours(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in pod["initContainers"] if c["name"] in ("rtj-resume", "rtj-progress")]


def test_a_template_that_says_nothing_runs_as_its_images_user() -> None:
    """No injected runAsNonRoot (the operator cannot see the namespace's Pod Security): a
    root image (NGC, Hugging Face) starts as written; the operator's containers, which
    must stay restricted, run as 65532 since the image's user may be root."""
    pod = _rendered({})
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    # no container-level runAsNonRoot or seccomp: the container inherits the pod's
    assert pod["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
    }  # fmt: skip
    assert len(_ours(pod)) == 2
    for c in _ours(pod):
        sc = c["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]} and sc["runAsUser"] == 65532


def test_a_template_for_a_restricted_namespace_keeps_its_non_root_choice() -> None:
    """Where the namespace requires restricted, the template says runAsNonRoot true (and a
    non-root uid): kept as written, and the operator's containers inherit the pod's user."""
    pod = _rendered({"securityContext": {"runAsNonRoot": True, "runAsUser": 1000}})
    assert pod["securityContext"] == {
        "runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"},
    }  # fmt: skip
    assert pod["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
    }  # fmt: skip
    for c in _ours(pod):
        assert c["securityContext"]["runAsNonRoot"] is True
        assert "runAsUser" not in c["securityContext"], "inherits the pod's uid 1000"


def test_a_root_refusal_names_the_fields_to_change() -> None:
    for message in (
        'violates PodSecurity "restricted:latest": runAsNonRoot != true (pod or container '
        '"trainer" must set securityContext.runAsNonRoot=true)',
        "container has runAsNonRoot and image will run as root (pod: w-0, container: trainer)",
    ):
        hint = root_refusal_hint(message)
        assert hint is not None
        assert "spec.template.spec.securityContext.runAsNonRoot" in hint
        assert "spec.template.spec.securityContext.runAsUser" in hint
    assert root_refusal_hint("exceeded quota: compute-resources") is None


def test_an_explicit_service_account_token_is_kept() -> None:
    assert _rendered({"automountServiceAccountToken": True})["automountServiceAccountToken"]
    assert not _rendered({"automountServiceAccountToken": False})["automountServiceAccountToken"]


def test_a_root_image_the_user_runs_as_root_keeps_running_as_root() -> None:
    """runAsUser 0 on the pod: no runAsNonRoot anywhere on the user's side, no capability
    drop on the root trainer; the operator's containers stay restricted as uid 65532."""
    pod = _rendered({"securityContext": {"runAsUser": 0}})
    assert pod["securityContext"] == {"runAsUser": 0, "seccompProfile": {"type": "RuntimeDefault"}}
    trainer = pod["containers"][0]["securityContext"]
    assert trainer == {"allowPrivilegeEscalation": False}
    for c in _ours(pod):
        sc = c["securityContext"]
        assert (sc["runAsNonRoot"], sc["runAsUser"]) == (True, 65532)
        assert sc["capabilities"] == {"drop": ["ALL"]}
    # the same choice spelled runAsNonRoot: false, or on the trainer container only
    spelled = _rendered({"securityContext": {"runAsNonRoot": False}})
    assert spelled["securityContext"]["runAsNonRoot"] is False
    assert "capabilities" not in spelled["containers"][0]["securityContext"]
    assert all(c["securityContext"]["runAsUser"] == 65532 for c in _ours(spelled))
    own = _rendered({"containers": [{
        "name": "trainer", "image": "nvcr.io/nvidia/pytorch:25.01-py3",
        "securityContext": {"runAsUser": 0},
    }]})  # fmt: skip
    assert "runAsNonRoot" not in own["securityContext"], "it would veto the container's uid 0"
    assert "capabilities" not in own["containers"][0]["securityContext"]
    assert all(c["securityContext"]["runAsUser"] == 65532 for c in _ours(own))


def test_user_init_containers_count_as_saying_who_runs() -> None:
    pod = _rendered({"initContainers": [
        {"name": "chown", "image": "busybox:1.36", "securityContext": {"runAsUser": 0}},
    ]})  # fmt: skip
    assert "runAsNonRoot" not in pod["securityContext"]
    assert pod["initContainers"][-1]["securityContext"] == {"runAsUser": 0}, "left as written"


def test_added_capabilities_are_kept_as_written() -> None:
    """RDMA needs IPC_LOCK: the user's capabilities are theirs (no drop they did not ask for)."""
    pod = _rendered({"containers": [{
        "name": "trainer", "image": "img",
        "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}},
    }]})  # fmt: skip
    assert pod["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False, "capabilities": {"add": ["IPC_LOCK"]},
    }  # fmt: skip


def test_privileged_and_sys_admin_containers_get_no_escalation_default() -> None:
    """The API server refuses allowPrivilegeEscalation false with privileged: true or with
    capabilities.add CAP_SYS_ADMIN (ValidateSecurityContext)."""
    pod = _rendered({"containers": [
        {"name": "trainer", "image": "img", "securityContext": {"privileged": True}},
        {"name": "fuse", "image": "img",
         "securityContext": {"capabilities": {"add": ["CAP_SYS_ADMIN"]}}},
    ]})  # fmt: skip
    assert pod["containers"][0]["securityContext"] == {"privileged": True}
    assert pod["containers"][1]["securityContext"] == {"capabilities": {"add": ["CAP_SYS_ADMIN"]}}


def test_a_pod_level_seccomp_choice_is_not_overridden_per_container() -> None:
    pod = _rendered({"securityContext": {"seccompProfile": {"type": "Unconfined"}}})
    assert pod["securityContext"]["seccompProfile"] == {"type": "Unconfined"}
    assert "seccompProfile" not in pod["containers"][0]["securityContext"]


def test_the_operators_containers_run_as_the_trainers_own_user() -> None:
    pod = _rendered({"containers": [{
        "name": "trainer", "image": "img", "securityContext": {"runAsUser": 1000},
    }]})  # fmt: skip
    assert "runAsNonRoot" not in pod["securityContext"]
    assert all(c["securityContext"]["runAsUser"] == 1000 for c in _ours(pod))
    inherited = _rendered({"securityContext": {"runAsUser": 1000, "runAsNonRoot": True}})
    assert all("runAsUser" not in c["securityContext"] for c in _ours(inherited))
