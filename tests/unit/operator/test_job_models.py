"""A job's object is parsed once per version (`rtj_operator.job_models`): with many jobs the
periodic loops parsed every job again each round (37% of the operator's CPU in a fault window
at 600 jobs, issue 49)."""

from __future__ import annotations

from unittest import mock

import pytest
from pydantic import ValidationError
from rtj_world import rtj_raw

from rtj_operator.api import ResilientTrainingJob
from rtj_operator.job_models import JobModels

KEY = ("team-a", "llm")


def counting_parses() -> mock._patch[mock.MagicMock]:
    return mock.patch.object(
        ResilientTrainingJob, "from_object", side_effect=ResilientTrainingJob.from_object
    )


def test_the_object_cached_now_is_parsed_once_and_its_model_handed_out_again() -> None:
    models, raw = JobModels(), rtj_raw({"phase": "Running", "attempt": 2})
    with counting_parses() as parse:
        first, parsed_now = models.parse(KEY, raw)
        again, parsed_again = models.parse(KEY, raw)
    assert parse.call_count == 1
    assert again is first and (parsed_now, parsed_again) == (True, False)
    assert first.status.attempt == 2


def test_a_replaced_object_is_parsed_again_even_with_equal_content() -> None:
    """Identity is the version: the controller replaces a changed job's object, never edits
    it, so a new object (equal or not) is read afresh and a stale model is never served."""
    models = JobModels()
    old, _ = models.parse(KEY, rtj_raw({"phase": "Running", "attempt": 2}))
    new, parsed_now = models.parse(KEY, rtj_raw({"phase": "Restarting", "attempt": 3}))
    assert parsed_now and new is not old
    assert (new.status.attempt, new.status.phase.value) == (3, "Restarting")
    same, parsed_now = models.parse(KEY, rtj_raw({"phase": "Restarting", "attempt": 3}))
    assert parsed_now and same == new and same is not new


def test_jobs_are_kept_apart_and_a_forgotten_one_is_parsed_again() -> None:
    models, raw = JobModels(), rtj_raw()
    a, _ = models.parse(KEY, raw)
    b, parsed_now = models.parse(("team-b", "llm"), raw)
    assert parsed_now and b is not a and len(models) == 2
    models.forget(KEY)
    assert len(models) == 1
    assert models.parse(KEY, raw)[1] is True


def test_an_unreadable_object_raises_and_leaves_the_last_good_model_unserved() -> None:
    models = JobModels()
    good = rtj_raw()
    models.parse(KEY, good)
    bad = rtj_raw()
    bad["spec"]["replicas"] = "many"
    with pytest.raises(ValidationError, match="replicas"):
        models.parse(KEY, bad)
    with pytest.raises(ValidationError, match="replicas"):
        models.parse(KEY, bad)  # not cached as good: it is refused again, never served
    assert models.parse(KEY, good)[1] is False
