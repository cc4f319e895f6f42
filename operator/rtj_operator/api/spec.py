"""`spec` of a ResilientTrainingJob: the CRD's OpenAPI schema is generated from these models.

Validation lives twice on purpose: CEL rules (`x-kubernetes-validations`) make the API
server reject a bad object with a field-level message, and the matching pydantic validator
keeps objects built in Python (tests, the CLI) to the same rules.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator

from rtj_operator.api.base import ApiModel, cel, validations
from rtj_operator.api.checkpoint_spec import CREDENTIALS_DEPRECATED, Checkpoint
from rtj_operator.api.detection_spec import (
    TAINT_KEY_DEPRECATED,
    NodeHealth,
    Preflight,
    ProgressMonitoring,
)
from rtj_operator.api.elastic_spec import (
    ELASTIC_MIN_ABOVE_REPLICAS,
    ELASTIC_NEEDS_REPLACING,
    ELASTIC_RULES,
    ELASTIC_WAIT_PAST_DEADLINE,
    Elastic,
)
from rtj_operator.api.keys import CONTROLLER_NAME, DEFAULT_TAINT_KEY, MAX_REPLICAS
from rtj_operator.api.schemas import KUBERNETES_VERSION

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
        _unchanged_optional("managedBy"),
        "managedBy is immutable: the controller that manages the job is chosen when it is "
        "created (create a new job for another)",
        ".managedBy",
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


MANAGED_BY_PATTERN = (
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
    r"/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
"""A domain-prefixed path (`kueue.x-k8s.io/multikueue`), as a batch Job's spec.managedBy."""


SPARES_NEED_REPLACING = (
    "spec.spares needs spec.recovery.inPlace: true and spec.recovery.inPlaceMaxReplacedPods "
    ">= 1: a spare takes the rank of a pod replaced while the others restart in place"
)
PRELOAD_NEEDS_IN_PLACE = (
    "spec.recovery.inPlacePreload needs spec.recovery.inPlace: true: the standby interpreter "
    "is the supervisor's, which runs only for restarts in place"
)
MODULE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
"""A dotted Python module name (rtj_shim.agent.preload.MODULE_NAME, which the API may not import;
a unit test holds them equal)."""
FAST_TIER_NEEDS_IN_PLACE = (
    "spec.checkpoint.fastTier needs spec.recovery.inPlace: true: only a restart inside the "
    "same pods finds the fast tier again"
)


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

    initial_seconds: int = Field(
        default=10,
        ge=0,
        le=86400,
        description="Wait before the first restart; doubled after each failure, up to maxSeconds.",
    )
    max_seconds: int = Field(
        default=600, ge=0, le=86400, description="The longest wait between restarts."
    )

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
    silent_data_corruption_restarts: int = Field(
        default=3,
        ge=0,
        le=100,
        description="Restarts after the trainers refused a suspect state (SilentDataCorruption: "
        "replicas that diverged, a loss or gradient norm far outside its recent values), each "
        "from the newest published step and away from the suspect pod's node; a budget of "
        "their own, not maxRestarts: a job whose trainers keep suspecting new machines is "
        "more likely broken itself, and fails with SilentDataCorruptionBudgetExhausted.",
    )


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

    code_commit: str | None = Field(
        default=None,
        max_length=256,
        description="Recorded in every checkpoint's manifest (RTJ_CODE_COMMIT).",
    )
    image_digest: str | None = Field(
        default=None,
        max_length=256,
        description="Recorded in every checkpoint's manifest (RTJ_IMAGE_DIGEST).",
    )
    dataset_snapshot: str | None = Field(
        default=None,
        max_length=1024,
        description="Recorded in every checkpoint's manifest (RTJ_DATASET_SNAPSHOT).",
    )


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
    *ELASTIC_RULES,
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
    queue_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        description="Kueue LocalQueue: Kueue admits the whole group or none of it (quota, "
        "queueing, preemption). Unset (clusters without Kueue): each attempt's JobSet is "
        "created running, with no queue label, and gang scheduling is then JobSet's alone: "
        "no quota and no all-or-nothing admission; the pods are scheduled one by one, and "
        "a group that does not fit waits partly placed (reported by the Stalled condition). "
        "A change applies to the next attempt's JobSet.",
    )
    managed_by: str | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        pattern=MANAGED_BY_PATTERN,
        description="The controller that reconciles this job (a domain-prefixed path). Unset "
        f"or {CONTROLLER_NAME}: this operator. Any other value (Kueue's MultiKueue: "
        "kueue.x-k8s.io/multikueue) leaves the job to that controller: this operator "
        "creates nothing for it and writes nothing to it, not even its status (MultiKueue "
        "runs it on a worker cluster and copies the status back), as JobSet and the batch "
        "Job do. Immutable.",
    )
    template: dict[str, Any] = Field(
        description="Worker PodTemplateSpec (the user's image and command). The API server "
        f"validates it against the PodTemplateSpec schema of Kubernetes {KUBERNETES_VERSION} "
        "(`kubectl explain rtj.spec.template`): an unknown field is refused by strict field "
        "validation (kubectl's default) and dropped otherwise, a wrongly typed one is refused. "
        "May change only while the job is suspended. The operator fills only what it leaves "
        "unset, and keeps every explicit value: automountServiceAccountToken false; pod "
        "seccompProfile RuntimeDefault; no runAsNonRoot (a root image runs as root; where the "
        "namespace's Pod Security is restricted set spec.template.spec.securityContext."
        "runAsNonRoot true and a non-root runAsUser); per container "
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
    master_port: int = Field(
        default=29500,
        ge=1,
        le=65535,
        description="Rendezvous port on rank 0's pod (MASTER_PORT, torchrun's --master-port).",
    )
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
    preflight: Preflight = Field(default_factory=Preflight, json_schema_extra={"default": {}})
    progress: ProgressMonitoring = Field(
        default_factory=ProgressMonitoring, json_schema_extra={"default": {}}
    )
    recovery: Recovery = Field(default_factory=Recovery, json_schema_extra={"default": {}})
    elastic: Elastic = Field(default_factory=Elastic, json_schema_extra={"default": {}})
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

    @property
    def managed_elsewhere(self) -> bool:
        """spec.managedBy names another controller: this operator leaves the job alone."""
        return self.managed_by is not None and self.managed_by != CONTROLLER_NAME

    def deprecations(self) -> tuple[str, ...]:
        """What this spec sets of the deprecated fields: one message per field, naming
        what replaces it (the operator posts each as a Warning Event)."""
        found = []
        if self.checkpoint.credentials_secret is not None:
            found.append(CREDENTIALS_DEPRECATED)
        if self.node_health.taint_key != DEFAULT_TAINT_KEY:  # the CRD default is not a use
            found.append(TAINT_KEY_DEPRECATED)
        return tuple(found)

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
        self._elastic_rules()
        return self

    def _elastic_rules(self) -> None:
        low = self.elastic.min_replicas
        if low is not None and low > self.replicas:
            raise ValueError(ELASTIC_MIN_ABOVE_REPLICAS)
        if low is None or low >= self.replicas:
            return
        recovery = self.recovery
        if not (recovery.in_place and recovery.in_place_max_replaced_pods >= 1):
            raise ValueError(ELASTIC_NEEDS_REPLACING)
        if self.elastic.wait_for_replacement_seconds >= recovery.in_place_deadline_seconds:
            raise ValueError(ELASTIC_WAIT_PAST_DEADLINE)

    @property
    def elastic_minimum(self) -> int:
        """The fewest pods the job trains on (spec.replicas: not elastic)."""
        return self.elastic.minimum(self.replicas)
