"""The base of every status record: read back ignoring unknown fields, so that a field
another tool adds (or a newer operator wrote) never makes the job unreadable."""

from __future__ import annotations

from pydantic import ConfigDict

from rtj_operator.api.base import ApiModel


class StatusModel(ApiModel):
    model_config = ApiModel.model_config | ConfigDict(extra="ignore")
