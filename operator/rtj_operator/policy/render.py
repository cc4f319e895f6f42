"""Render attempt n of a ResilientTrainingJob as one JobSet (jobset.x-k8s.io/v1alpha2). Pure.

The JobSet is created suspended with the Kueue queue label, so Kueue admits the whole group or
none of it; a job without spec.queueName (no Kueue) gets a JobSet with no queue label, created
running (JobSet alone starts the group). JobSet's own restarts are off
(`failurePolicy.maxRestarts: 0`, Job `backoffLimit: 0`, pod `restartPolicy: Never`): the first
failed pod fails the attempt, and the operator decides what happens next. One replicated Job of
`replicas` Indexed pods gives every worker a stable rank (its completion index) and a stable
DNS name through JobSet's headless Service: `<jobset>-worker-0-<index>.<jobset>`. With
spec.spares, a second replicated Job of `spares` pods (`<jobset>-spare-0-<index>`) holds the
warm spares: the workers' pod, its trainer held by its supervisor until an in-place restart
gives it a replaced pod's rank (`policy.spares`).

Nothing here mutates the job; the user's pod template is deep-copied, then completed (the
containers' environment and mounts: `policy.worker_env`).
"""

from __future__ import annotations

import copy
from typing import Any

from rtj_operator.api import keys
from rtj_operator.api.reasons import FailureClass
from rtj_operator.api.resource import ResilientTrainingJob
from rtj_operator.policy import control_key, fast_drain, fast_tier, in_place
from rtj_operator.policy.pod_security import (
    RESTRICTED_CONTAINER,
    operator_container_security,
    pod_security_context,
    service_account_token,
    user_container_security,
)
from rtj_operator.policy.worker_env import (
    env_var,
    field_env,
    field_ref_env,
    progress_mount,
    resume_mount,
    shim_env,
    worker_container,
    worker_env,
)

GRACE_MARGIN_SECONDS = 15
"""Beyond the emergency-save deadline: the upload's last request and process exit."""

RESOLVER_RESOURCES = {
    "requests": {"cpu": "1", "memory": "512Mi"},
    "limits": {"memory": "2Gi"},
}
_RESTRICTED_CONTAINER = RESTRICTED_CONTAINER
"""The operator's own containers (their securityContext; see policy/pod_security.py)."""

Obj = dict[str, Any]

PROGRESS_RESOURCES = {
    "requests": {"cpu": "10m", "memory": "32Mi"},
    "limits": {"memory": "128Mi"},
}
PROGRESS_VOLUME_SIZE = "1Mi"
DRAIN_ENV = frozenset({
    keys.ENV_RUN_ID, keys.ENV_CHECKPOINT_URI, keys.ENV_KEEP_LAST, keys.ENV_KEEP_EVERY,
    keys.ENV_PROTECT_STEP, keys.ENV_MAX_WRITE_BYTES_PER_SECOND,
})  # fmt: skip
"""What the progress sidecar's drain reads of the shim's environment (the store, the run,
the retention it applies after each publish and the write limit, as a trainer's save does)."""
"""912 bytes per rank record (rtj_shim.wire.progress_record): room for ~1,000 ranks per pod."""

ENV_SHARE_INDEX = "RTJ_VERIFY_SHARE"
"""The pod's index (its completion index): which share of the files its init container
hashes."""


def jobset_name(job: str, attempt: int) -> str:
    return f"{job}-a{attempt}"


def quarantine_taint(rtj: ResilientTrainingJob) -> Obj:
    """The taint a quarantined node gets: `<taintKey>=<job name>:<effect>`."""
    health = rtj.spec.node_health
    return {"key": health.taint_key, "value": rtj.metadata.name, "effect": health.taint_effect}


def owner_reference(rtj: ResilientTrainingJob) -> Obj:
    """Deleting the job deletes its JobSets (and so every pod of every attempt)."""
    return {
        "apiVersion": keys.API_VERSION,
        "kind": keys.KIND,
        "name": rtj.metadata.name,
        "uid": rtj.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


KUEUE_LABEL_PREFIX = "kueue.x-k8s.io/"


def kueue_labels(rtj: ResilientTrainingJob) -> dict[str, str]:
    """The Kueue labels the user set on the job (`kueue.x-k8s.io/priority-class`: its
    WorkloadPriorityClass, `kueue.x-k8s.io/max-exec-time-seconds`, ...), carried to every
    attempt's JobSet, where Kueue reads them (the queue name comes from spec.queueName)."""
    return {
        k: v
        for k, v in rtj.metadata.labels.items()
        if k.startswith(KUEUE_LABEL_PREFIX) and k != keys.KUEUE_QUEUE_LABEL
    }


def queue_labels(rtj: ResilientTrainingJob) -> dict[str, str]:
    """The JobSet's Kueue labels: the user's (`kueue_labels`) and the queue's name; no queue
    name without spec.queueName (a Kueue configured to manage such jobs too, with
    manageJobsWithoutQueueName, suspends the JobSet itself, and the attempt waits for it)."""
    queue = rtj.spec.queue_name
    return {**kueue_labels(rtj), **({keys.KUEUE_QUEUE_LABEL: queue} if queue else {})}


def waits_for_kueue(rtj: ResilientTrainingJob) -> bool:
    """Whether the attempt's JobSet is created suspended, for Kueue to admit (spec.queueName
    set), or running (no queue name: JobSet alone)."""
    return rtj.spec.queue_name is not None


def attempt_labels(rtj: ResilientTrainingJob, attempt: int) -> dict[str, str]:
    return {keys.JOB_LABEL: rtj.metadata.name, keys.ATTEMPT_LABEL: str(attempt)}


def render_jobset(
    rtj: ResilientTrainingJob, attempt: int, resume: int | None, control_key: str | None = None
) -> Obj:
    """The JobSet for `attempt`, pinning checkpoint step `resume` (None: newest that verifies);
    with `control_key` and spec.recovery.inPlace, its trainers run under the supervisor."""
    name = jobset_name(rtj.metadata.name, attempt)
    labels = attempt_labels(rtj, attempt)
    replicated = [
        {
            "name": keys.WORKER_REPLICATED_JOB,
            "replicas": 1,
            "template": _job_template(rtj, attempt, resume, name, control_key),
        }
    ]
    if rtj.spec.spares and rtj.spec.recovery.in_place and control_key:
        replicated.append(
            {
                "name": keys.SPARE_REPLICATED_JOB,
                "replicas": 1,
                "template": _spare_job_template(rtj, attempt, resume, name, control_key),
            }
        )
    return {
        "apiVersion": keys.JOBSET_API_VERSION,
        "kind": keys.JOBSET_KIND,
        "metadata": {
            "name": name,
            "namespace": rtj.metadata.namespace,
            "labels": {**queue_labels(rtj), **labels},
            "annotations": _resume_annotation(resume),
            "ownerReferences": [owner_reference(rtj)],
        },
        "spec": {
            "suspend": waits_for_kueue(rtj),
            "failurePolicy": {"maxRestarts": 0},
            "successPolicy": {"operator": "All"},
            "network": {"enableDNSHostnames": True, "subdomain": name},
            "replicatedJobs": replicated,
        },
    }


def _resume_annotation(resume: int | None) -> dict[str, str]:
    return {} if resume is None else {keys.RESUME_STEP_ANNOTATION: str(resume)}


def _job_template(
    rtj: ResilientTrainingJob, attempt: int, resume: int | None, js: str, key: str | None
) -> Obj:
    replicas = rtj.spec.replicas
    template = pod_template(rtj, attempt, resume, js, key)
    spec: Obj = {
        "parallelism": replicas,
        "completions": replicas,
        "completionMode": "Indexed",
        "backoffLimit": 0,
        "template": template,
    }
    if in_place.supervised(template) and rtj.spec.recovery.in_place_max_replaced_pods > 0:
        # a pod the operator deletes (its node quarantined or lost) is created again by the
        # Job, same index, held by its supervisor until ordered: no JobSet or Workload is
        # touched; the index failing more often than the restart budget fails the Job
        del spec["backoffLimit"]
        spec["backoffLimitPerIndex"] = max(1, rtj.spec.failure_policy.max_restarts)
        spec["maxFailedIndexes"] = 0
    return {"metadata": {"labels": attempt_labels(rtj, attempt)}, "spec": spec}


SPARE_BACKOFF_LIMIT = 2**31 - 1
"""A spare that fails is created again by its Job (with the Job controller's back-off, up to
6 min): a spare never fails the JobSet."""


def _spare_job_template(
    rtj: ResilientTrainingJob, attempt: int, resume: int | None, js: str, key: str
) -> Obj:
    """The warm spares' Job: the workers' pod, its trainer held (``RTJ_SPARE=1``) until a
    run order names the rank it takes, and no resolver (its trainer never runs the first
    generation; the run order pins the step it restores, verified as it loads)."""
    template = pod_template(rtj, attempt, resume, js, key)
    spec = template["spec"]
    spec["initContainers"] = [
        c for c in spec["initContainers"] if c.get("name") != keys.RESUME_INIT_CONTAINER
    ]
    trainer = next(c for c in spec["containers"] if c.get("name") == trainer_name(rtj))
    trainer["env"] = [*trainer.get("env", []), env_var(keys.ENV_SPARE, 1)]
    return {
        "metadata": {"labels": attempt_labels(rtj, attempt)},
        "spec": {
            "parallelism": rtj.spec.spares,
            "completions": rtj.spec.spares,
            "completionMode": "Indexed",
            "backoffLimit": SPARE_BACKOFF_LIMIT,
            "template": template,
        },
    }


def pod_template(
    rtj: ResilientTrainingJob, attempt: int, resume: int | None, js: str, key: str | None = None
) -> Obj:
    """The user's pod template, completed with rank env, resume and scheduling rules, and
    security defaults only where the user said nothing (policy/pod_security.py)."""
    template = copy.deepcopy(rtj.spec.template)
    meta = template.setdefault("metadata", {})
    meta["labels"] = {**meta.get("labels", {}), **attempt_labels(rtj, attempt)}
    meta["annotations"] = {**meta.get("annotations", {}), **_resume_annotation(resume)}
    spec = template["spec"]
    env = worker_env(rtj, attempt, resume, js)
    progress = rtj.spec.progress.enabled
    user_sc = spec.get("securityContext")
    containers = [worker_container(c, env, progress) for c in spec["containers"]]
    for c in containers:
        c["securityContext"] = user_container_security(c.get("securityContext"), user_sc)
    trainer = _trainer(rtj, containers)
    ours = [resolver_container(rtj, attempt, resume, trainer)]
    volumes = [{"name": keys.RESUME_VOLUME, "emptyDir": {}}]
    if progress:
        ours.append(progress_sidecar(rtj, trainer, key))
        volumes.append(
            {"name": keys.PROGRESS_VOLUME,
             "emptyDir": {"medium": "Memory", "sizeLimit": PROGRESS_VOLUME_SIZE}}
        )  # fmt: skip
    for c in ours:  # restricted whatever the template says, as a user the rules allow
        c["securityContext"] = operator_container_security(c["securityContext"], trainer, user_sc)
    owned = {c["name"] for c in ours}
    owned_volumes = {v["name"] for v in volumes}
    user_init = [c for c in spec.get("initContainers", []) if c.get("name") not in owned]
    spec.update(
        restartPolicy="Never",
        automountServiceAccountToken=service_account_token(spec),
        terminationGracePeriodSeconds=_grace(rtj, spec.get("terminationGracePeriodSeconds")),
        securityContext=pod_security_context(user_sc, [*spec["containers"], *user_init]),
        containers=containers,
        initContainers=[*ours, *user_init],
        volumes=[
            *(v for v in spec.get("volumes", []) if v.get("name") not in owned_volumes), *volumes
        ],
        affinity=_affinity(spec.get("affinity"), avoided_nodes(rtj, attempt), js),
        # no toleration of the quarantine taint: nodeHealth.taintKey is the platform's key
        # here (reconcile.plan judges the spec by the platform's policy before rendering;
        # the job's own, deprecated taintKey is ignored)
        tolerations=[
            t for t in spec.get("tolerations", []) if t.get("key") != rtj.spec.node_health.taint_key
        ],
    )  # fmt: skip
    if rtj.spec.recovery.in_place and key and in_place.supervise(spec, rtj, trainer["name"]):
        meta["annotations"][keys.SUPERVISED_ANNOTATION] = "true"
        if fast_tier.render(spec, rtj, trainer["name"]):
            if fast_tier.replicated(rtj):
                meta["annotations"][keys.PEER_REPLICA_ANNOTATION] = "true"
            store = [e for e in shim_env(rtj, attempt, resume) if e["name"] in DRAIN_ENV]
            fast_drain.render(spec, rtj, store, trainer)
    return template


def _grace(rtj: ResilientTrainingJob, user: object) -> int:
    """Long enough for the emergency save; a longer one the user chose is kept."""
    needed = rtj.spec.checkpoint.emergency_save_seconds + GRACE_MARGIN_SECONDS
    return max(needed, user) if isinstance(user, int) else needed


def _trainer(rtj: ResilientTrainingJob, containers: list[Obj]) -> Obj:
    wanted = rtj.spec.trainer_container
    return next((c for c in containers if c.get("name") == wanted), containers[0])


def trainer_name(rtj: ResilientTrainingJob) -> str:
    """The trainer container's name (spec.trainerContainer, else the template's first)."""
    containers = (rtj.spec.template.get("spec") or {}).get("containers") or [{}]
    return str(_trainer(rtj, containers).get("name") or "")


MAX_SUSPECT_NODES = 16
"""Nodes suspected of silent data corruption a job keeps avoiding (the newest): a job whose
trainers suspect more is more likely broken itself than unlucky with so many machines."""


def avoided_nodes(rtj: ResilientTrainingJob, attempt: int) -> list[str]:
    """Nodes attempt `attempt` must not use: every node the job quarantined, the node whose
    pod failed the previous attempt's preflight (a slow link: avoided by this job, not
    tainted for anyone else), the node of every pod an earlier attempt's trainers suspected
    of silent data corruption (likewise: the newest MAX_SUSPECT_NODES), and with
    `progress.stragglers.action: ReplaceNode` the nodes of the previous attempt's stragglers
    (likewise)."""
    avoid = {q.node for q in rtj.status.quarantined_nodes}
    avoid |= {
        a.first_failed.node
        for a in rtj.status.attempts
        if a.attempt == attempt - 1 and a.failure_class is FailureClass.PREFLIGHT_FAILED
        and a.first_failed is not None and a.first_failed.node
    }  # fmt: skip
    suspects = [
        a.first_failed.node
        for a in rtj.status.attempts
        if a.attempt < attempt and a.failure_class is FailureClass.SILENT_DATA_CORRUPTION
        and a.first_failed is not None and a.first_failed.suspect and a.first_failed.node
    ]  # fmt: skip
    avoid |= set(suspects[-MAX_SUSPECT_NODES:])
    progress = rtj.status.progress
    if rtj.spec.progress.stragglers.action == "ReplaceNode" and progress is not None:
        avoid |= {s.node for s in progress.stragglers if s.node and s.attempt == attempt - 1}
    return sorted(avoid)


def resolver_command(uri: str, resume: int | None, replicas: int = 1) -> list[str]:
    """`rtj-shim resolve`: re-verify the pinned step from inside the pod, report the result.

    A pinned step is verified deeply *once* by the whole group: pod i hashes its share of
    the files (`--deep-share i/N`, every file by exactly one pod) and checks the size of the
    rest, so a restart reads the checkpoint once instead of N times; one corrupt file fails
    its owner's init container, and with it the attempt (the step is marked bad). An
    unpinned resolution (file:// roots) hashes everything in every pod: each pod picks the
    newest step that verifies, and all must pick the same."""
    pinned = [] if resume is None else ["--step", str(resume)]
    share = [] if resume is None or replicas < 2 else [
        "--deep-share", f"$({ENV_SHARE_INDEX})/{replicas}"
    ]  # fmt: skip
    return [
        "rtj-shim", "resolve", "--root", uri, *pinned, "--deep", *share,
        "--write", keys.DEFAULT_RESUME_FILE, "--termination-log", keys.TERMINATION_LOG,
    ]  # fmt: skip


def resolver_container(
    rtj: ResilientTrainingJob, attempt: int, resume: int | None, trainer: Obj
) -> Obj:
    """The init container: the trainer's image and mounts (file:// roots, credentials)."""
    secret = rtj.spec.checkpoint.credentials_secret_name
    ours = (keys.RESUME_VOLUME, keys.PROGRESS_VOLUME)
    mounts = [m for m in trainer.get("volumeMounts", []) if m.get("name") not in ours]
    container: Obj = {
        "name": keys.RESUME_INIT_CONTAINER,
        "image": rtj.spec.checkpoint.resolver_image or trainer["image"],
        "command": resolver_command(rtj.spec.checkpoint.uri, resume, rtj.spec.replicas),
        "env": [
            *shim_env(rtj, attempt, resume),
            field_env(ENV_SHARE_INDEX, keys.JOB_COMPLETION_INDEX),
        ],
        "volumeMounts": [*mounts, resume_mount(read_only=False)],
        "resources": copy.deepcopy(RESOLVER_RESOURCES),
        "terminationMessagePath": keys.TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",  # a crash shows its traceback
        "securityContext": copy.deepcopy(_RESTRICTED_CONTAINER),
    }
    if secret is not None:
        container["envFrom"] = [{"secretRef": {"name": secret}}]
    return container


def progress_command(port: int) -> list[str]:
    """`rtj-shim progress-server` on the pod's IP (another process than the trainer, so a
    hung or stopped rank keeps being reported; see docs/progress.md)."""
    return [
        "rtj-shim", "progress-server", "--dir", keys.PROGRESS_DIR,
        "--port", str(port), "--host", f"$({keys.ENV_POD_IP})",
    ]  # fmt: skip


def progress_sidecar(rtj: ResilientTrainingJob, trainer: Obj, key: str | None = None) -> Obj:
    """The progress server as a native sidecar (an init container with `restartPolicy:
    Always`, Kubernetes >= 1.29): it starts before the trainer, is restarted if it dies, and
    never keeps a finished pod running. The resolver's image (it has rtj-shim). With the
    job's control key (the operator has a control secret) it holds the key (from the job's
    key Secret, `policy.control_key`) and the job's uid, answers only reads signed with the
    key (``RTJ_SIGNED_READS``: the poller signs every read; an older sidecar image ignores
    it and answers anyone, as before), and seals its answers with its pod name and attempt
    (``RTJ_SEALED_ANSWERS``: the poller counts only sealed answers from such a pod, so a
    sidecar image older than this operator's must not be pinned in
    ``spec.checkpoint.resolverImage``)."""
    port = rtj.spec.progress.port
    signed = (
        [control_key.key_env(rtj.metadata.uid), env_var(keys.ENV_JOB_UID, rtj.metadata.uid),
         env_var(keys.ENV_SIGNED_READS, 1), env_var(keys.ENV_SEALED_ANSWERS, 1),
         field_ref_env(keys.ENV_POD_NAME, "metadata.name"),
         field_ref_env(keys.ENV_POD_ATTEMPT, f"metadata.labels['{keys.ATTEMPT_LABEL}']")]
        if key else []
    )  # fmt: skip
    return {
        "name": keys.PROGRESS_SIDECAR,
        "image": rtj.spec.checkpoint.resolver_image or trainer["image"],
        "restartPolicy": "Always",
        "command": progress_command(port),
        "env": [
            {"name": keys.ENV_POD_IP, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            *signed,
        ],
        "ports": [{"name": keys.PROGRESS_PORT_NAME, "containerPort": port, "protocol": "TCP"}],
        # writable only where it takes the operator's interval (`plannedIntervalSeconds: auto`)
        "volumeMounts": [progress_mount(read_only=not (key and rtj.spec.checkpoint.auto_interval))],
        "resources": copy.deepcopy(PROGRESS_RESOURCES),
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {**copy.deepcopy(_RESTRICTED_CONTAINER), "readOnlyRootFilesystem": True},
    }


def _affinity(current: object, avoid: list[str], js: str) -> Obj:
    """Avoid quarantined nodes (in every OR-ed node term) and put one worker per node.

    One ``metadata.name NotIn`` requirement per node (ANDed within a term): the API server
    takes exactly one value for a node field selector's ``In``/``NotIn`` ("must be only one
    value when `operator` is 'In' or 'NotIn' for node field selector",
    k8s.io/kubernetes pkg/apis/core/validation, validateNodeFieldSelectorRequirement), so a
    list of two made every Job of the attempt invalid (the SDC drill's third attempt)."""
    affinity = copy.deepcopy(current) if isinstance(current, dict) else {}
    if avoid:
        node = affinity.setdefault("nodeAffinity", {})
        required = node.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
        fields = [{"key": "metadata.name", "operator": "NotIn", "values": [n]} for n in avoid]
        terms = required.get("nodeSelectorTerms") or [{}]
        required["nodeSelectorTerms"] = [
            {**t, "matchFields": [*t.get("matchFields", []), *fields]} for t in terms
        ]
    spread = affinity.setdefault("podAntiAffinity", {})
    rules = spread.setdefault("requiredDuringSchedulingIgnoredDuringExecution", [])
    rules.append(
        {
            "labelSelector": {"matchLabels": {keys.JOBSET_NAME_LABEL: js}},
            "topologyKey": keys.HOSTNAME_TOPOLOGY,
        }
    )
    return affinity
