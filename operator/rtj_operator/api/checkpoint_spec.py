"""`spec.checkpoint` of a ResilientTrainingJob: the store, its retention and the fast tier.

Part of the spec's models (`rtj_operator.api.spec`); the same double validation (CEL for the
API server, pydantic for objects built in Python).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, WithJsonSchema, field_validator, model_validator

from rtj_operator.api.base import ApiModel, cel, validations

SHIM_DEADLINE_SECONDS = 30
"""The shim's default emergency-save deadline; pods get this plus a margin to stop."""

URI_SCHEMES = ("s3://", "file://")

IMMUTABLE_RULE = "self == oldSelf"
"""A CEL transition rule: the API server evaluates it on updates only (`oldSelf` is the stored
value), so it makes a field immutable once created. Kubeflow Trainer's TrainJob marks its
immutable fields the same way (`pkg/apis/trainer/v1alpha1/trainjob_types.go`)."""


AUTO = "auto"
"""`plannedIntervalSeconds: auto`: the operator chooses the interval (`policy.intervals`)."""

PlannedInterval = Annotated[
    int | Literal["auto"],
    WithJsonSchema(
        {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True}
    ),
]
"""Seconds >= 1 or "auto"; an int-or-string in the CRD (as a Deployment's maxSurge is)."""


def _not_count_or_auto(value: object) -> bool:
    """Neither a count >= 1 nor "auto" (a string of digits too: the CRD refuses it)."""
    if isinstance(value, str):
        return value != AUTO
    return isinstance(value, bool) or not isinstance(value, int) or value < 1


class Retention(ApiModel):
    """Which verified steps the trainer-side GC keeps (the operator never deletes data)."""

    keep_last: int = Field(default=3, ge=1, le=1000, description="Newest verified steps kept.")
    keep_every: int | None = Field(
        default=None, ge=1, description="Also keep every step divisible by this (milestones)."
    )


FAST_TIER_MIN_KEEP = 2
"""rtj_shim.fast.fast_tier.MIN_KEEP, copied (the API may not import the fast tier, which
imports rtj_shim.checkpoint.storage; a unit test holds them equal): ranks publish a fast step
moments apart, so the one before it must still be on every rank."""

SIZE_PATTERN = r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[kMGTPE])?$"
"""A size in bytes as Kubernetes writes one (`512Mi`, `8Gi`, `1G`, `1500000000`): the part
of the resource.Quantity grammar (api/schemas/openapi.QUANTITY_PATTERN) with no sign, no
exponent and no fraction-of-a-unit suffix (m, u, n)."""

DRAIN_MULTIPLE = (
    "fastTier.drainEverySteps must be a multiple of fastTier.everySteps: only fast steps "
    "can be drained (a fixed everySteps: a drain cannot follow `auto`)"
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
                "!has(self.drainEverySteps) || (type(self.everySteps) == int && "
                "self.drainEverySteps % self.everySteps == 0)",
                DRAIN_MULTIPLE,
                ".drainEverySteps",
            )
        )
    }

    every_steps: PlannedInterval = Field(
        description="Steps between fast-tier saves (each rank's copy in its own pod), or "
        "`auto`: the operator chooses them from the job's failure rate, the trainers' "
        "measured fast-save cost and step time (`status.checkpointIntervals.fastEverySteps`), "
        "taking effect at each restart (in place: the run order; a new world: its pods).",
        json_schema_extra=validations(
            cel(
                "type(self) == int ? self >= 1 : self == 'auto'",
                "checkpoint.fastTier.everySteps: expected steps >= 1 or 'auto'",
            )
        ),
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
        "get the store's credentials (checkpoint.credentialsSecretRef). Unset: no drain.",
    )

    @field_validator("every_steps", mode="before")
    @classmethod
    def _every(cls, value: object) -> object:
        if _not_count_or_auto(value):
            raise ValueError(
                f"checkpoint.fastTier.everySteps: expected steps >= 1 or 'auto', got {value!r}"
            )
        return value

    @model_validator(mode="after")
    def _drain_multiple(self) -> FastTier:
        if self.drain_every_steps is None:
            return self
        every = self.every_steps
        if not isinstance(every, int) or self.drain_every_steps % every:
            raise ValueError(DRAIN_MULTIPLE)
        return self

    @property
    def auto_every(self) -> bool:
        """Whether the operator chooses the fast interval (`everySteps: auto`)."""
        return self.every_steps == AUTO


class SecretReference(ApiModel):
    """A Secret in the job's own namespace, by name (Kubernetes' LocalObjectReference)."""

    name: str = Field(
        min_length=1,
        max_length=253,
        description="The Secret's name, in the job's namespace.",
    )


CREDENTIALS_CONFLICT = (
    "checkpoint.credentialsSecret (deprecated) and checkpoint.credentialsSecretRef.name name "
    "different Secrets: set only checkpoint.credentialsSecretRef"
)
CREDENTIALS_DEPRECATED = (
    "spec.checkpoint.credentialsSecret is deprecated: use spec.checkpoint.credentialsSecretRef "
    "({name: ...}, the same Secret); the old field is accepted for one more release"
)


class Checkpoint(ApiModel):
    """Where checkpoints live and how often the trainer promises to write one."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": validations(
            cel(
                "!has(self.credentialsSecret) || !has(self.credentialsSecretRef) "
                "|| self.credentialsSecret == self.credentialsSecretRef.name",
                CREDENTIALS_CONFLICT,
                ".credentialsSecretRef",
            )
        )
    }

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
    planned_interval_seconds: PlannedInterval = Field(
        default=600,
        description="Planned seconds between durable checkpoints (the age alert fires beyond "
        "a multiple of it), or `auto`: the operator chooses it from the job's failure rate "
        "and the trainers' measured save cost (Young/Daly, `status.checkpointIntervals`) and "
        'hands it to trainers whose Checkpointer was built with `every_seconds="auto"`.',
        json_schema_extra=validations(
            cel(
                "type(self) == int ? self >= 1 : self == 'auto'",
                "checkpoint.plannedIntervalSeconds: expected seconds >= 1 or 'auto'",
            )
        ),
    )
    retention: Retention = Field(default_factory=Retention, json_schema_extra={"default": {}})
    credentials_secret_ref: SecretReference | None = Field(
        default=None,
        description="Secret (in the job's namespace) whose keys become env of the resume "
        "init container and the fast tier's drain (e.g. AWS_ACCESS_KEY_ID, "
        "AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL_S3); the operator reads the store with them "
        "too. The trainer's container gets them only from its own envFrom (the template's "
        "choice).",
    )
    credentials_secret: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        description="Deprecated: use credentialsSecretRef (this name is read as "
        "credentialsSecretRef.name; a job that sets it gets a Warning Event, reason "
        "DeprecatedField). Setting both with different names is refused. Accepted for one "
        "more release.",
    )
    max_write_bytes_per_second: int | None = Field(
        default=None,
        ge=1,
        description="The most bytes a second each pod's durable saves write (the trainers' "
        "and the fast tier's drain): a save's upload is paced so it never takes more of the "
        "node's network or disk from the all-reduce and the data loader. Unset: no limit. "
        "An emergency save on SIGTERM is never paced (its deadline runs). Takes effect with "
        "the next attempt.",
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

    @field_validator("planned_interval_seconds", mode="before")
    @classmethod
    def _interval(cls, value: object) -> object:
        if _not_count_or_auto(value):
            raise ValueError(
                f"checkpoint.plannedIntervalSeconds: expected seconds >= 1 or 'auto', got {value!r}"
            )
        return value

    @property
    def auto_interval(self) -> bool:
        """Whether the operator chooses the durable interval (`plannedIntervalSeconds: auto`)."""
        return self.planned_interval_seconds == AUTO

    @model_validator(mode="after")
    def _one_credentials_secret(self) -> Checkpoint:
        ref, old = self.credentials_secret_ref, self.credentials_secret
        if ref is not None and old is not None and ref.name != old:
            raise ValueError(CREDENTIALS_CONFLICT)
        return self

    @property
    def credentials_secret_name(self) -> str | None:
        """The credentials Secret's name: credentialsSecretRef's, else the deprecated
        credentialsSecret's (None: the job names none)."""
        if self.credentials_secret_ref is not None:
            return self.credentials_secret_ref.name
        return self.credentials_secret
