"""`spec` of a ResilientTrainingJob: the CRD's OpenAPI schema is generated from these models.

Validation lives twice on purpose: CEL rules (`x-kubernetes-validations`) make the API
server reject a bad object with a field-level message, and the matching pydantic validator
keeps objects built in Python (tests, the CLI) to the same rules.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from rtj_operator.api.base import ApiModel, cel, validations
from rtj_operator.api.keys import DEFAULT_PROGRESS_PORT, DEFAULT_TAINT_KEY, MAX_REPLICAS
from rtj_operator.api.schemas import KUBERNETES_VERSION

DEFAULT_XID_CODES = (
    46, 48, 54, 62, 64, 74, 79, 95, 109, 110, 119, 120, 136, 140, 143,
    144, 145, 146, 147, 148, 149, 150, 151, 155, 156, 158,
)  # fmt: skip
"""NVIDIA XIDs whose catalog immediate action takes the GPU out of service (reset the GPU,
restart the machine or VM, the XID 48 / NVLink workflows, check the mechanicals): the XID
catalog's list, `rtj_operator.policy.xid.catalog_quarantine_codes()`. Application XIDs
(13, 31, 43, 94, ...) and informational ones (63, 92) never quarantine."""

DEFAULT_XID_CONDITION_TYPES = ("SysLogsXIDError", "GpuXidError")
"""Node condition types NVSentinel's syslog monitor sets (current and older name)."""

SHIM_DEADLINE_SECONDS = 30
"""The shim's default emergency-save deadline; pods get this plus a margin to stop."""

URI_SCHEMES = ("s3://", "file://")

IMMUTABLE_RULE = "self == oldSelf"
"""A CEL transition rule: the API server evaluates it on updates only (`oldSelf` is the stored
value), so it makes a field immutable once created. Kubeflow Trainer's TrainJob marks its
immutable fields the same way (`pkg/apis/trainer/v1alpha1/trainjob_types.go`)."""

SUSPENDED = "(has(self.suspend) && self.suspend) || (has(oldSelf.suspend) && oldSelf.suspend)"
"""True when the job is suspended before or after the update (a CEL fragment over the spec):
what the next attempt runs may change only then, as Kubeflow Trainer allows its
runtimePatches to change only when the TrainJob is suspended before or after the update
(`pkg/runtime/framework/plugins/jobset/jobset.go`) and a batch Job's pod template
scheduling directives only while it is suspended."""


def _unchanged_optional(field: str) -> str:
    """CEL: an optional spec field is neither set, unset nor changed (a rule on the field
    itself would not see it being set or removed: transition rules run only where both the
    old and the new object have the value)."""
    return (
        f"has(self.{field}) == has(oldSelf.{field}) "
        f"&& (!has(self.{field}) || self.{field} == oldSelf.{field})"
    )


SPEC_TRANSITION_RULES = (
    cel(
        _unchanged_optional("runId"),
        "runId is immutable: it names the run in the checkpoint store (a new run id would "
        "start a second writer beside the first)",
        ".runId",
    ),
    cel(
        f"{SUSPENDED} || self.replicas == oldSelf.replicas",
        "replicas may change only while the job is suspended (set spec.suspend: true in the "
        "same or an earlier update); the next attempt after the resume has the new size",
        ".replicas",
    ),
    cel(
        f"{SUSPENDED} || ({_unchanged_optional('spares')})",
        "spares may change only while the job is suspended (set spec.suspend: true in the "
        "same or an earlier update); the next attempt after the resume has them",
        ".spares",
    ),
    cel(
        f"{SUSPENDED} || self.template == oldSelf.template",
        "template may change only while the job is suspended (set spec.suspend: true in the "
        "same or an earlier update): a restart must not silently run other code",
        ".template",
    ),
    cel(
        f"{SUSPENDED} || ({_unchanged_optional('trainerContainer')})",
        "trainerContainer may change only while the job is suspended",
        ".trainerContainer",
    ),
)
"""Rules over the old and the new spec (`self`/`oldSelf` are the spec). The API server
evaluates them on every update; pydantic cannot (it sees one object), so they live only here
and are tested against a real API server (tests/integration/operator/test_lifecycle_cluster.py)."""


class Retention(ApiModel):
    """Which verified steps the trainer-side GC keeps (the operator never deletes data)."""

    keep_last: int = Field(default=3, ge=1, le=1000, description="Newest verified steps kept.")
    keep_every: int | None = Field(
        default=None, ge=1, description="Also keep every step divisible by this (milestones)."
    )


FAST_TIER_MIN_KEEP = 2
"""rtj_shim.fast_tier.MIN_KEEP, copied (the API may not import rtj_shim.fast_tier, which
imports rtj_shim.storage; a unit test holds them equal): ranks publish a fast step moments
apart, so the one before it must still be on every rank."""

SIZE_PATTERN = r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[kMGTPE])?$"
"""A size in bytes as Kubernetes writes one (`512Mi`, `8Gi`, `1G`, `1500000000`): the part
of the resource.Quantity grammar (api/schemas/openapi.QUANTITY_PATTERN) with no sign, no
exponent and no fraction-of-a-unit suffix (m, u, n)."""

DRAIN_MULTIPLE = (
    "fastTier.drainEverySteps must be a multiple of fastTier.everySteps: only fast steps "
    "can be drained"
)
SPARES_NEED_REPLACING = (
    "spec.spares needs spec.recovery.inPlace: true and spec.recovery.inPlaceMaxReplacedPods "
    ">= 1: a spare takes the rank of a pod replaced while the others restart in place"
)
PRELOAD_NEEDS_IN_PLACE = (
    "spec.recovery.inPlacePreload needs spec.recovery.inPlace: true: the standby interpreter "
    "is the supervisor's, which runs only for restarts in place"
)
MODULE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
"""A dotted Python module name (rtj_shim.preload.MODULE_NAME, which the API may not import;
a unit test holds them equal)."""
FAST_TIER_NEEDS_IN_PLACE = (
    "spec.checkpoint.fastTier needs spec.recovery.inPlace: true: only a restart inside the "
    "same pods finds the fast tier again"
)


class FastTier(ApiModel):
    """The fast checkpoint tier (issue 16): every `everySteps` steps each rank also saves
    its state into a pod-local emptyDir, so a restart in place loses at most those steps
    (the durable store stays the fallback). With `peerReplicas` another pod keeps a copy,
    which a pod replaced on another node copies back. With `drainEverySteps` the progress
    sidecar of the pod holding rank 0 publishes those fast steps to the durable store."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": validations(
            cel(
                "!has(self.drainEverySteps) || self.drainEverySteps % self.everySteps == 0",
                DRAIN_MULTIPLE,
                ".drainEverySteps",
            )
        )
    }

    every_steps: int = Field(
        ge=1,
        description="Steps between fast-tier saves (each rank's copy in its own pod).",
    )
    keep: int = Field(
        default=FAST_TIER_MIN_KEEP,
        ge=FAST_TIER_MIN_KEEP,
        le=100,
        description="Fast steps each rank keeps (at least 2: while one rank has published a "
        "step and another not yet, the one before must still be on both).",
    )
    medium: Literal["Memory", "Disk"] = Field(
        default="Memory",
        description="Memory: a memory-backed emptyDir (tmpfs; its contents count against the "
        "pod's memory limit). Disk: the node's disk (the kubelet's emptyDir storage).",
    )
    size_limit: str | None = Field(
        default=None,
        max_length=64,
        pattern=SIZE_PATTERN,
        description="The emptyDir's sizeLimit (e.g. 64Gi): keep + 1 copies of the training "
        "state (a new step is written before the oldest goes) times the ranks per pod, "
        "twice that with peerReplicas (the source's copies too). "
        "Unset: no limit beyond the medium's.",
    )
    peer_replicas: int = Field(
        default=1,
        ge=0,
        le=1,
        description="Copies of each pod's fast-tier steps kept in another pod's fast-tier "
        "volume (a ring over the pods' completion indexes, holder and source on different "
        "nodes where the placement allows), so a pod re-created on another node after its "
        "node was lost resumes from a fast step too. 0: none. The volume's sizeLimit must "
        "hold both (the pod's own steps and its source's).",
    )
    drain_every_steps: int | None = Field(
        default=None,
        ge=1,
        description="Publish every fast step that is a multiple of this to the durable store "
        "(checkpoint.uri), from the fast tier's bytes, by the progress sidecar of the pod "
        "holding rank 0 (the other ranks' files read from their pods' sidecars), beside "
        "the trainers: a hung trainer does not stop it. A multiple of everySteps. Steps the "
        "trainer saves durably itself (a multiple of its own save interval) are left to it; "
        "a trainer that also saves on a time or metric schedule is not drained. The sidecars "
        "get the store's credentials (checkpoint.credentialsSecret). Unset: no drain.",
    )

    @model_validator(mode="after")
    def _drain_multiple(self) -> FastTier:
        if self.drain_every_steps is not None and self.drain_every_steps % self.every_steps:
            raise ValueError(DRAIN_MULTIPLE)
        return self


class Checkpoint(ApiModel):
    """Where checkpoints live and how often the trainer promises to write one."""

    uri: str = Field(
        min_length=1,
        max_length=1024,
        description="Checkpoint root: s3://bucket/prefix or file:///path on a shared volume. "
        "Immutable: a job resumes only from its own store (create a new job for another).",
        json_schema_extra=validations(
            cel(
                "self.startsWith('s3://') || self.startsWith('file://')",
                "checkpoint.uri must start with s3:// or file://",
            ),
            cel(
                IMMUTABLE_RULE,
                "checkpoint.uri is immutable: the next attempt would resume "
                "from another store (create a new job for another store)",
            ),
        ),
    )
    planned_interval_seconds: int = Field(
        default=600, ge=1, description="Planned seconds between checkpoints (age alert)."
    )
    retention: Retention = Field(default_factory=Retention, json_schema_extra={"default": {}})
    credentials_secret: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        description="Secret whose keys become env of the trainer and the resume init "
        "container (e.g. AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL_S3).",
    )
    emergency_save_seconds: int = Field(
        default=SHIM_DEADLINE_SECONDS,
        ge=0,
        le=3600,
        description="Seconds the trainer may spend on an emergency save after SIGTERM; "
        "pods get this plus a margin as terminationGracePeriodSeconds.",
    )
    resolver_image: str | None = Field(
        default=None,
        min_length=1,
        description="Image for the resume init container (default: the trainer's image, "
        "which must contain rtj-shim).",
    )
    fast_tier: FastTier | None = Field(
        default=None,
        description="A fast checkpoint tier in each pod (needs recovery.inPlace: only a "
        "restart inside the same pods finds it again). Takes effect with the next attempt.",
    )

    @field_validator("uri")
    @classmethod
    def _scheme(cls, uri: str) -> str:
        if not uri.startswith(URI_SCHEMES):
            raise ValueError("checkpoint.uri must start with s3:// or file://")
        return uri


class Backoff(ApiModel):
    """Exponential delay before a restart: initial * 2^(failures so far), capped at max."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": validations(
            cel(
                "!has(self.initialSeconds) || !has(self.maxSeconds) "
                "|| self.initialSeconds <= self.maxSeconds",
                "backoff.initialSeconds must be <= backoff.maxSeconds",
            )
        )
    }

    initial_seconds: int = Field(default=10, ge=0, le=86400)
    max_seconds: int = Field(default=600, ge=0, le=86400)

    @model_validator(mode="after")
    def _ordered(self) -> Backoff:
        if self.initial_seconds > self.max_seconds:
            raise ValueError("backoff.initialSeconds must be <= backoff.maxSeconds")
        return self


class FailurePolicy(ApiModel):
    """Restart budgets. The operator owns every restart; JobSet's own restarts stay off."""

    max_restarts: int = Field(
        default=5, ge=0, le=1000, description="Whole-group restarts for infrastructure failures."
    )
    backoff: Backoff = Field(default_factory=Backoff, json_schema_extra={"default": {}})
    user_error_restarts: int = Field(
        default=0, ge=0, le=100, description="Restarts allowed for user-category failures."
    )
    count_preemptions: bool = Field(
        default=False, description="Whether preemptions spend maxRestarts."
    )


class NodeHealth(ApiModel):
    """How GPU faults are recognized on nodes, and how a bad node is quarantined."""

    taint_key: str = Field(
        default=DEFAULT_TAINT_KEY,
        min_length=1,
        max_length=316,
        description="Ignored: the taint key is the platform's (operator nodeHealth.taintKey).",
    )
    taint_effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = Field(
        default="NoSchedule",
        description="Used only when no stronger than the platform's nodeHealth.taintEffect.",
    )
    quarantine_ttl_seconds: int | None = Field(
        default=None,
        ge=60,
        le=30 * 86400,
        description="Opt-in: remove this job's taint from a quarantined node this many seconds "
        "after it was set (unset: the node stays tainted until an administrator acts).",
    )
    xid_codes: list[Annotated[int, Field(ge=0)]] = Field(
        default_factory=lambda: list(DEFAULT_XID_CODES),
        max_length=256,
        description="GPU XID codes that quarantine a node: narrows the platform's list "
        "(operator nodeHealth.xidCodes); left at the default, the platform's list applies.",
        json_schema_extra={"default": list(DEFAULT_XID_CODES)},
    )
    xid_label_keys: list[str] = Field(
        default_factory=list,
        max_length=32,
        description="Node label keys whose value lists XID codes: narrows the platform's "
        "nodeHealth.xidLabelKeys (empty: the platform's).",
    )
    xid_condition_types: list[str] = Field(
        default_factory=lambda: list(DEFAULT_XID_CONDITION_TYPES),
        max_length=32,
        description="Node condition types whose message carries XID codes (NVSentinel "
        "SysLogsXIDError): narrows the platform's nodeHealth.xidConditionTypes.",
        json_schema_extra={"default": list(DEFAULT_XID_CONDITION_TYPES)},
    )


class Stragglers(ApiModel):
    """Ranks slower than the rest: busy time per step above the others' median / ratio for
    `windows` consecutive polls."""

    action: Literal["Report", "ReplaceNode"] = Field(
        default="Report",
        description="Report: a condition, an Event and a metric. ReplaceNode: also keep the "
        "next attempt off the straggler's node (after the next restart, whatever its cause; "
        "a straggler never restarts the job by itself).",
    )
    ratio: float = Field(
        default=0.7,
        ge=0.05,
        le=0.99,
        description="A rank is slow when its busy time per step exceeds the median of the "
        "other ranks' divided by this (0.7: more than ~1.43x).",
    )
    windows: int = Field(
        default=3, ge=1, le=100, description="Consecutive slow polls before a rank is reported."
    )


class ProgressMonitoring(ApiModel):
    """Rank progress: each worker pod gets a progress server (a native sidecar) that the
    operator polls; a rank that stops making progress is a Hang, a slow one a straggler."""

    enabled: bool = Field(
        default=True,
        description="Render the progress sidecar and poll it (false: no hang or straggler "
        "detection; failures are seen only when a pod ends).",
    )
    port: int = Field(
        default=DEFAULT_PROGRESS_PORT,
        ge=1024,
        le=65535,
        description="The sidecar's port (change it for hostNetwork pods that share a node).",
    )
    hang_timeout_seconds: int | None = Field(
        default=None,
        ge=10,
        le=86400,
        description="A rank with no progress in its section for this long is a Hang. Unset: "
        "automatic, timeoutFactor x the observed step time (never below 30 s nor the longest "
        "recent step), saves timeoutFactor x the longest save observed.",
    )
    timeout_factor: float = Field(
        default=5.0, ge=2.0, le=100.0, description="Safety factor of the automatic timeout."
    )
    startup_grace_seconds: int = Field(
        default=600,
        ge=0,
        le=86400,
        description="Allowance before a rank's first steps (start-up, compilation, restore, "
        "the first save) in automatic mode; with hangTimeoutSeconds the larger of the two.",
    )
    stragglers: Stragglers = Field(default_factory=Stragglers, json_schema_extra={"default": {}})


class Recovery(ApiModel):
    """How a failure is recovered from (issue 15)."""

    in_place: bool = Field(
        default=False,
        description="Restart in place: the trainer's command runs under `rtj-shim supervise` "
        "(the trainer image must have rtj-shim on its PATH, as any image using rtj_shim "
        "does), and a failure that implicates no node (a rank's process dying, a hang) "
        "stops the trainers of every pod and starts them again inside the same pods from "
        "the newest verified step: no pod re-created, no Kueue re-admission, the queue "
        "position kept. Needs progress monitoring (the sidecar carries the orders) and a "
        "trainer container with a command. Takes effect with the next attempt.",
    )
    in_place_deadline_seconds: int = Field(
        default=60,
        ge=10,
        le=3600,
        description="An in-place restart that has not stopped and started every pod within "
        "this long falls back to re-creating the whole world.",
    )
    in_place_max_replaced_pods: int = Field(
        default=1,
        ge=0,
        le=64,
        description="A failure that implicates a node (a GPU fault, a lost node) replaces only "
        "the pods on it, and an eviction (a drain, a NoExecute taint, the Eviction API) only "
        "the evicted pods, when they are at most this many: a faulty node is quarantined, the "
        "pods are deleted and created again by their Job elsewhere (same index, no Kueue "
        "re-admission), and every other pod restarts in place. More implicated pods, or 0, "
        "re-create the whole world.",
    )
    in_place_preload: list[Annotated[str, Field(pattern=MODULE_PATTERN, max_length=200)]] = Field(
        default_factory=list,
        max_length=32,
        description="Modules a warm standby interpreter imports ahead of each restart "
        "in place (for example [torch]): the supervisor keeps one per pod, and a "
        "restarted generation, a warm spare's first run included, starts in it with "
        "its imports done instead of in a new interpreter. Only for a trainer command "
        "that runs a Python interpreter directly (`python train.py`, `python -m pkg`, "
        "which then reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT as torchrun "
        "would set them); any other command (torchrun, a shell) starts cold, and the "
        "supervisor says so in the pod's log. Costs one idle interpreter's memory per "
        "pod. Needs inPlace. Takes effect with the next attempt.",
    )


class Provenance(ApiModel):
    """Identity of what is being trained, stamped into every checkpoint manifest."""

    code_commit: str | None = Field(default=None, max_length=256)
    image_digest: str | None = Field(default=None, max_length=256)
    dataset_snapshot: str | None = Field(default=None, max_length=1024)


SPEC_RULES = (
    cel(
        "!has(self.checkpoint.fastTier) || (has(self.recovery) && has(self.recovery.inPlace) "
        "&& self.recovery.inPlace)",
        FAST_TIER_NEEDS_IN_PLACE,
        ".checkpoint.fastTier",
    ),
    cel(
        "!has(self.recovery) || !has(self.recovery.inPlacePreload) || "
        "size(self.recovery.inPlacePreload) == 0 || (has(self.recovery.inPlace) && "
        "self.recovery.inPlace)",
        PRELOAD_NEEDS_IN_PLACE,
        ".recovery.inPlacePreload",
    ),
    cel(
        "!has(self.spares) || self.spares == 0 || (has(self.recovery) && "
        "has(self.recovery.inPlace) && self.recovery.inPlace && "
        "(!has(self.recovery.inPlaceMaxReplacedPods) || "
        "self.recovery.inPlaceMaxReplacedPods >= 1))",
        SPARES_NEED_REPLACING,
        ".spares",
    ),
)
"""Rules across spec fields (the matching pydantic validator is on the spec model)."""


class ResilientTrainingJobSpec(ApiModel):
    """A synchronous multi-node training job kept alive through machine faults."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": validations(*SPEC_RULES, *SPEC_TRANSITION_RULES)
    }

    replicas: int = Field(
        ge=1,
        le=MAX_REPLICAS,
        description="Worker pods, one per node. May change only while the job is suspended "
        "(the next attempt has the new size).",
    )
    spares: int = Field(
        default=0,
        ge=0,
        le=64,
        description="Warm spares: pods admitted with the workers (Kueue counts them in the "
        "quota), started and idle, their trainer held by `rtj-shim supervise`. When a pod is "
        "replaced (a GPU fault, a lost node: spec.recovery.inPlaceMaxReplacedPods), a spare "
        "on another node takes its rank at once, with no wait for the Job controller to "
        "create the pod again (10 s of back-off, doubling per failure of the index), and the "
        "pod created again becomes a spare. Needs spec.recovery.inPlace. May change only "
        "while the job is suspended.",
    )
    queue_name: str = Field(
        min_length=1,
        max_length=63,
        description="Kueue LocalQueue: the whole group is admitted or none of it. A change "
        "applies to the next attempt's JobSet.",
    )
    template: dict[str, Any] = Field(
        description="Worker PodTemplateSpec (the user's image and command). The API server "
        f"validates it against the PodTemplateSpec schema of Kubernetes {KUBERNETES_VERSION} "
        "(`kubectl explain rtj.spec.template`): an unknown field is refused by strict field "
        "validation (kubectl's default) and dropped otherwise, a wrongly typed one is refused. "
        "May change only while the job is suspended. The operator fills only what it leaves "
        "unset, and keeps every explicit value: automountServiceAccountToken false; pod "
        "seccompProfile RuntimeDefault; pod runAsNonRoot true unless the pod or any container "
        "sets runAsUser or runAsNonRoot (a root image needs runAsUser: 0); per container "
        "allowPrivilegeEscalation false unless privileged or adding CAP_SYS_ADMIN, and "
        "capabilities.drop [ALL] unless it sets capabilities, is privileged or runs as root "
        "by choice (docs/operations.md).",
        # The schema itself is the vendored Kubernetes one (rtj_operator.api.schemas), put in
        # place by crdgen; the model keeps a plain dict, deep-copied into each JobSet.
        json_schema_extra=validations(
            cel(
                "has(self.spec) && has(self.spec.containers) && size(self.spec.containers) > 0",
                "template.spec.containers must list at least one container",
            )
        ),
    )
    trainer_container: str | None = Field(
        default=None,
        min_length=1,
        description="Container running the trainer (default: the first container). May "
        "change only while the job is suspended.",
    )
    master_port: int = Field(default=29500, ge=1, le=65535)
    run_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        description="Run id in the checkpoint root (default: <namespace>.<name>). Immutable.",
    )
    checkpoint: Checkpoint
    failure_policy: FailurePolicy = Field(
        default_factory=FailurePolicy, json_schema_extra={"default": {}}
    )
    node_health: NodeHealth = Field(default_factory=NodeHealth, json_schema_extra={"default": {}})
    progress: ProgressMonitoring = Field(
        default_factory=ProgressMonitoring, json_schema_extra={"default": {}}
    )
    recovery: Recovery = Field(default_factory=Recovery, json_schema_extra={"default": {}})
    provenance: Provenance = Field(default_factory=Provenance, json_schema_extra={"default": {}})
    suspend: bool = Field(
        default=False,
        description="True: run nothing. A running attempt is stopped (its JobSet and pods "
        "deleted, no restart budget spent) and phase is Suspended; false again resumes from "
        "the newest verified step without backoff. The activeDeadlineSeconds clock stops "
        "and starts again from zero at the next admission (as a batch Job's).",
    )
    active_deadline_seconds: int | None = Field(
        default=None,
        ge=1,
        description="Seconds the job may be active, counted from the first admission by "
        "Kueue (again from the first admission after a resume), restarts included; then "
        "the job fails for good (reason DeadlineExceeded, category user). A change applies "
        "at once.",
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        description="Delete the job this many seconds after it Succeeded or Failed "
        "(foreground: its JobSets go first; its quarantines are released as on any "
        "deletion). Unset: never. A change applies at once.",
    )

    @field_validator("template")
    @classmethod
    def _has_containers(cls, template: dict[str, Any]) -> dict[str, Any]:
        spec = template.get("spec")
        containers = spec.get("containers") if isinstance(spec, dict) else None
        if not isinstance(containers, list) or not containers:
            raise ValueError("template.spec.containers must list at least one container")
        return template

    @model_validator(mode="after")
    def _fast_tier_in_place(self) -> ResilientTrainingJobSpec:
        if self.checkpoint.fast_tier is not None and not self.recovery.in_place:
            raise ValueError(FAST_TIER_NEEDS_IN_PLACE)
        if self.recovery.in_place_preload and not self.recovery.in_place:
            raise ValueError(PRELOAD_NEEDS_IN_PLACE)
        if self.spares and not (
            self.recovery.in_place and self.recovery.in_place_max_replaced_pods >= 1
        ):
            raise ValueError(SPARES_NEED_REPLACING)
        return self
