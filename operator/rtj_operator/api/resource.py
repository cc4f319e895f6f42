"""The whole ResilientTrainingJob object as handlers receive it (metadata + spec + status)."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rtj_operator.api.base import ApiModel
from rtj_operator.api.compat import without_unknown
from rtj_operator.api.keys import API_VERSION, KIND, MAX_NAME_LENGTH
from rtj_operator.api.spec import ResilientTrainingJobSpec
from rtj_operator.api.status import ResilientTrainingJobStatus

NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
NAME_RULE = (
    f"size(self.metadata.name) <= {MAX_NAME_LENGTH} && self.metadata.name.matches('{NAME_PATTERN}')"
)
NAME_MESSAGE = (
    f"metadata.name must be a DNS-1035 label of at most {MAX_NAME_LENGTH} characters "
    "(JobSet, Service and pod names of every attempt derive from it)"
)


class ObjectMeta(BaseModel):
    """The part of metadata the operator reads; everything else is ignored."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    name: str
    namespace: str = "default"
    uid: str = ""
    generation: int = 0
    labels: dict[str, str] = Field(default_factory=dict)
    finalizers: list[str] = Field(default_factory=list)
    deletion_timestamp: str | None = Field(default=None, alias="deletionTimestamp")
    creation_timestamp: datetime | None = Field(default=None, alias="creationTimestamp")

    @field_validator("name")
    @classmethod
    def _dns_label(cls, name: str) -> str:
        if len(name) > MAX_NAME_LENGTH or not re.match(NAME_PATTERN, name):
            raise ValueError(NAME_MESSAGE)
        return name


class ResilientTrainingJob(ApiModel):
    model_config = ApiModel.model_config | ConfigDict(extra="ignore")

    api_version: str = API_VERSION
    kind: str = KIND
    metadata: ObjectMeta
    spec: ResilientTrainingJobSpec
    status: ResilientTrainingJobStatus = Field(default_factory=ResilientTrainingJobStatus)

    @classmethod
    def from_object(cls, body: dict[str, Any]) -> ResilientTrainingJob:
        """Parse the object as the API server returns it (status may be absent). Fields a
        newer CRD added are set aside, not refused (`api.compat`): the job is still run."""
        known, _ = without_unknown(cls, {**body, "status": body.get("status") or {}})
        return cls.model_validate(known)

    @classmethod
    def unknown_fields(cls, body: dict[str, Any]) -> tuple[str, ...]:
        """The fields of `body` this operator does not know (written by a newer CRD)."""
        return without_unknown(cls, body)[1]

    @property
    def run_id(self) -> str:
        """Run id in the checkpoint root: stable across attempts and across re-creation."""
        return self.spec.run_id or f"{self.metadata.namespace}.{self.metadata.name}"
