"""Names shared with the cluster: API identity, labels, annotations, env, container names.

Every string another component reads (Kueue, JobSet, the Job controller, the shim, kubectl)
lives here once, so a typo cannot split the contract between writer and reader.
"""

from __future__ import annotations

from typing import Final

# --- the ResilientTrainingJob API -------------------------------------------------------
GROUP: Final = "training.resilient.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "ResilientTrainingJob"
LIST_KIND: Final = "ResilientTrainingJobList"
PLURAL: Final = "resilienttrainingjobs"
SINGULAR: Final = "resilienttrainingjob"
SHORT_NAMES: Final = ("rtj",)
CRD_NAME: Final = f"{PLURAL}.{GROUP}"

# --- JobSet (sigs.k8s.io/jobset, API v1alpha2; fields checked against release v0.8) -----
JOBSET_API_VERSION: Final = "jobset.x-k8s.io/v1alpha2"
JOBSET_KIND: Final = "JobSet"
WORKER_REPLICATED_JOB: Final = "worker"
"""replicatedJobs[].name; pods are named <jobset>-worker-0-<index>-<suffix>."""
SPARE_REPLICATED_JOB: Final = "spare"
"""replicatedJobs[].name of the warm spares (spec.spares): <jobset>-spare-0-<index>-<suffix>."""
REPLICATED_JOB_LABEL: Final = "jobset.sigs.k8s.io/replicatedjob-name"
"""Set by the JobSet controller on its Jobs and their pods: the replicated Job's name
(sigs.k8s.io/jobset api/jobset/v1alpha2/jobset_types.go, ReplicatedJobNameKey, v0.11.1)."""

# --- labels and annotations other controllers own ---------------------------------------
KUEUE_QUEUE_LABEL: Final = "kueue.x-k8s.io/queue-name"
JOB_COMPLETION_INDEX: Final = "batch.kubernetes.io/job-completion-index"
JOB_INDEX_FAILURE_COUNT: Final = "batch.kubernetes.io/job-index-failure-count"
"""Set by the Job controller on each pod of a Job with backoffLimitPerIndex: how often the
pod's index failed before (kubernetes pkg/controller/job/indexed_job_utils.go, v1.35)."""
ENV_INDEX_FAILURES: Final = "RTJ_INDEX_FAILURES"
"""rtj_shim.agent.supervisor.ENV_INDEX_FAILURES: > 0 marks a replacement pod, held until ordered."""
ENV_SPARE: Final = "RTJ_SPARE"
"""rtj_shim.agent.supervisor.ENV_SPARE: "1" marks a warm spare, held until a run order names its
rank."""
JOBSET_NAME_LABEL: Final = "jobset.sigs.k8s.io/jobset-name"
JOBSET_UID_LABEL: Final = "jobset.sigs.k8s.io/jobset-uid"
"""Set by the JobSet controller on its Jobs and their pods (labelAndAnnotateObject in
sigs.k8s.io/jobset pkg/controllers/jobset_controller.go, v0.11.1)."""
HOSTNAME_TOPOLOGY: Final = "kubernetes.io/hostname"

# --- labels and annotations this operator owns ------------------------------------------
CONTROLLER_NAME: Final = f"{GROUP}/rtj-operator"
"""This operator's name in `spec.managedBy`: a job whose managedBy is set to another value is
left to that controller (Kueue's MultiKueue: `kueue.x-k8s.io/multikueue`), as JobSet leaves a
JobSet whose managedBy is not `jobset.sigs.k8s.io/jobset-controller`."""
JOB_LABEL: Final = f"{GROUP}/job"
ATTEMPT_LABEL: Final = f"{GROUP}/attempt"
RESUME_STEP_ANNOTATION: Final = f"{GROUP}/resume-step"
DEFAULT_TAINT_KEY: Final = f"{GROUP}/unhealthy"
QUARANTINE_OWNERS_ANNOTATION: Final = f"{GROUP}/quarantined-by"
"""On a quarantined node: which jobs (by uid) hold each of our taints (JSON), so several jobs
can quarantine one node and each lifts only its own claim."""
RELEASE_FINALIZER: Final = f"{GROUP}/release-quarantines"
"""On a job that holds quarantine claims: deleting it lifts them first."""

# --- containers, volumes, paths ---------------------------------------------------------
RESUME_INIT_CONTAINER: Final = "rtj-resume"
RESUME_VOLUME: Final = "rtj-resume"
RESUME_DIR: Final = "/var/run/rtj"
DEFAULT_RESUME_FILE: Final = f"{RESUME_DIR}/resume.json"
TERMINATION_LOG: Final = "/dev/termination-log"
PROGRESS_SIDECAR: Final = "rtj-progress"
"""The native sidecar (init container, restartPolicy Always) serving the ranks' progress."""
PROGRESS_VOLUME: Final = "rtj-progress"
PROGRESS_DIR: Final = "/var/run/rtj-progress"
PROGRESS_PORT_NAME: Final = "rtj-progress"
DEFAULT_PROGRESS_PORT: Final = 9478
SUPERVISED_ANNOTATION: Final = "training.resilient.dev/supervised"
"""On pods whose trainer runs under `rtj-shim supervise` (spec.recovery.inPlace)."""
PEER_REPLICA_ANNOTATION: Final = "training.resilient.dev/peer-replica"
"""On pods whose progress sidecar keeps a peer replica (spec.checkpoint.fastTier.peerReplicas):
only those are sent replica assignments (a pod rendered before has a read-only fast tier)."""
CONTROL_VOLUME: Final = "rtj-control"
CONTROL_DIR: Final = "/var/run/rtj-control"
"""Restart orders and the supervisor's reports (spec.recovery.inPlace, rtj_shim.wire.control)."""
FAST_TIER_VOLUME: Final = "rtj-fast-tier"
FAST_TIER_DIR: Final = "/var/run/rtj-fast-tier"
"""Each rank's fast-tier copies of its state (spec.checkpoint.fastTier, rtj_shim.fast.fast_tier):
a volume of its own, not under RESUME_DIR (mounted read-only in the trainer, where no mount
point can be made)."""

# --- environment the shim and the trainer read ------------------------------------------
ENV_RUN_ID: Final = "RTJ_RUN_ID"
ENV_ATTEMPT: Final = "RTJ_ATTEMPT"
ENV_CODE_COMMIT: Final = "RTJ_CODE_COMMIT"
ENV_IMAGE_DIGEST: Final = "RTJ_IMAGE_DIGEST"
ENV_DATASET_SNAPSHOT: Final = "RTJ_DATASET_SNAPSHOT"
ENV_RESUME_FILE: Final = "RTJ_RESUME_FILE"
ENV_CHECKPOINT_URI: Final = "RTJ_CHECKPOINT_URI"
ENV_RESUME_STEP: Final = "RTJ_RESUME_STEP"
ENV_KEEP_LAST: Final = "RTJ_KEEP_LAST"
ENV_KEEP_EVERY: Final = "RTJ_KEEP_EVERY"
ENV_MAX_WRITE_BYTES_PER_SECOND: Final = "RTJ_MAX_WRITE_BYTES_PER_SECOND"
ENV_PROTECT_STEP: Final = "RTJ_PROTECT_STEP"
ENV_EMERGENCY_SAVE_SECONDS: Final = "RTJ_EMERGENCY_SAVE_SECONDS"
ENV_MASTER_ADDR: Final = "MASTER_ADDR"
ENV_MASTER_PORT: Final = "MASTER_PORT"
ENV_WORLD_SIZE: Final = "WORLD_SIZE"
ENV_NNODES: Final = "NNODES"
ENV_NODE_RANK: Final = "NODE_RANK"
ENV_RANK: Final = "RANK"
ENV_PROGRESS_DIR: Final = "RTJ_PROGRESS_DIR"
"""Where each rank writes its progress record (rtj_shim.progress): the progress volume."""
ENV_CONTROL_DIR: Final = "RTJ_CONTROL_DIR"
ENV_CONTROL_KEY: Final = "RTJ_CONTROL_KEY"
ENV_JOB_UID: Final = "RTJ_JOB_UID"
ENV_SIGNED_READS: Final = "RTJ_SIGNED_READS"
"""``1``: the sidecar answers only reads signed with the job's key
(rtj_shim.agent.progress_server)."""
ENV_SEALED_ANSWERS: Final = "RTJ_SEALED_ANSWERS"
"""``1``: the sidecar seals its answers to the operator's nonce with its pod name and attempt
(``RTJ_POD_NAME``, ``RTJ_POD_ATTEMPT``; rtj_shim.wire.answer_seal), and the poller counts only
sealed answers from it."""
ENV_POD_NAME: Final = "RTJ_POD_NAME"
ENV_POD_ATTEMPT: Final = "RTJ_POD_ATTEMPT"
ENV_POD_IP: Final = "RTJ_POD_IP"
"""The sidecar's listen address (downward API status.podIP)."""
ENV_FAST_TIER_DIR: Final = "RTJ_FAST_TIER_DIR"
ENV_FAST_EVERY_STEPS: Final = "RTJ_FAST_EVERY_STEPS"
ENV_FAST_KEEP: Final = "RTJ_FAST_KEEP"
"""rtj_shim.fast.fast_tier.ENV_DIR, ENV_EVERY_STEPS and ENV_KEEP, copied: the API and policy may
not import rtj_shim.fast.fast_tier (it imports rtj_shim.checkpoint.storage, which the import-linter
contract keeps out of them); a unit test holds the copies equal."""

# --- limits derived from names ----------------------------------------------------------
MAX_NAME_LENGTH: Final = 36
"""<name>-a<attempt>-worker-0-<index>-<5 chars> must stay a 63-character DNS label
for attempts up to 99999 and up to 9999 replicas (JobSet's webhook rejects longer)."""
MAX_REPLICAS: Final = 9999
