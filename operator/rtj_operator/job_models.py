"""The controller's jobs parsed once per version: a job's object as cached is parsed into its
model the first time it is read, and the same model is handed out until the cached object is
replaced.

Every reconcile, progress round and checkpoint refresh reads a job's model. Parsing one
(`ResilientTrainingJob.from_object`: the unknown-field pass and pydantic's validation) was
the largest share of the operator's CPU with many jobs: 37% of a fault window at 600 jobs
(`bench.operator_scale_jobs --profile`), because the periodic loops parse every job, fault or
none. The controller replaces a job's cached object (a new dict) whenever it changes and never
edits one in place, so an object's identity is its version: a model is kept with the object
it came from and reused while that object is the one cached. The models are frozen.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from rtj_operator.api.resource import ResilientTrainingJob


class JobModels:
    """Parsed jobs by key, each with the cached object it was parsed from."""

    def __init__(self) -> None:
        self._parsed: dict[Hashable, tuple[dict[str, Any], ResilientTrainingJob]] = {}

    def parse(self, key: Hashable, raw: dict[str, Any]) -> tuple[ResilientTrainingJob, bool]:
        """The model of `raw`, the object cached for `key`, and whether it was parsed now
        (`raw` is not the object the kept model came from: what is derived from the model,
        such as its metrics, is due again). Raises pydantic's ValidationError as
        `from_object` does (nothing is kept then)."""
        held = self._parsed.get(key)
        if held is not None and held[0] is raw:
            return held[1], False
        model = ResilientTrainingJob.from_object(raw)
        self._parsed[key] = (raw, model)
        return model, True

    def forget(self, key: Hashable) -> None:
        self._parsed.pop(key, None)

    def __len__(self) -> int:
        return len(self._parsed)
