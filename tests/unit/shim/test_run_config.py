"""rtj_shim.checkpoint.run_config: the configuration guard's pure rules (issue 43 section 4)."""

from __future__ import annotations

import math
import re

import pytest

from rtj_shim.checkpoint.manifest import Manifest
from rtj_shim.checkpoint.run_config import (
    RUN_CONFIG_EXTRA,
    ConfigMismatch,
    RunConfig,
    allowed_changes,
    check_resume,
    declared,
    differences,
    user_config,
    with_run_config,
)

SAVED = RunConfig(
    2,
    "replicated",
    {"lr": 0.001, "optim": {"betas": [0.9, 0.95], "eps": 1e-8}, "batch": 32},
    {"model.0.weight": (32, 8), "model.0.bias": (32,)},
)


def _now(**changes: object) -> RunConfig:
    fields = {"world_size": 2, "layout": "replicated", "config": dict(SAVED.config),
              "params": dict(SAVED.params)}  # fmt: skip
    fields.update(changes)
    return RunConfig(**fields)  # type: ignore[arg-type]


def test_the_same_run_resumes_with_nothing_recorded() -> None:
    assert differences(SAVED, _now()) == []
    record = check_resume(SAVED, _now(), frozenset(), step=10, attempt="2.0")
    assert record.history == ()


def test_an_undeclared_hyperparameter_change_is_refused_naming_the_key_and_both_values() -> None:
    now = _now(config={**SAVED.config, "lr": 0.002})
    with pytest.raises(ConfigMismatch) as err:
        check_resume(SAVED, now, frozenset(), step=10, attempt="2.0")
    message = str(err.value)
    assert "config.lr (0.001 in the checkpoint, 0.002 now)" in message
    assert "allow_config_change=['config.lr']" in message
    assert [c.key for c in err.value.changes] == ["config.lr"]


def test_a_nested_key_a_removed_key_and_a_shape_are_each_named() -> None:
    config = {"lr": 0.001, "optim": {"betas": [0.9, 0.999], "eps": 1e-8}}  # batch removed
    params = {"model.0.weight": (64, 8), "model.0.bias": (32,), "model.2.weight": (1, 64)}
    with pytest.raises(ConfigMismatch) as err:
        check_resume(SAVED, _now(config=config, params=params), frozenset(), step=3, attempt="1")
    assert [c.key for c in err.value.changes] == [
        "config.batch",
        "config.optim.betas",
        "params.model.0.weight",
        "params.model.2.weight",
    ]
    assert "config.batch (32 in the checkpoint, absent now)" in str(err.value)


def test_a_declared_change_is_accepted_and_recorded_in_the_history() -> None:
    now = _now(config={**SAVED.config, "lr": 0.002}, world_size=4)
    record = check_resume(SAVED, now, frozenset({"lr"}), step=10, attempt="3.0")
    (accepted,) = record.history
    assert (accepted.step, accepted.attempt) == (10, "3.0")
    assert {c.key: (c.saved, c.now) for c in accepted.changes} == {
        "config.lr": (0.001, 0.002),
        "world_size": (2, 4),
    }
    again = RunConfig.parse(record.encode())  # what the next manifest records reads back
    assert again == record
    later = check_resume(again, again, frozenset(), step=20, attempt="4.0")
    assert later.history == record.history  # kept, nothing new


def test_world_size_and_layout_changes_need_no_declaration_and_are_recorded() -> None:
    record = check_resume(SAVED, _now(world_size=1, layout="sharded"), frozenset(), step=5,
                          attempt="2")  # fmt: skip
    assert [c.key for c in record.history[0].changes] == ["layout", "world_size"]


def test_declared_names_match_a_key_a_prefix_at_a_dot_or_a_bare_config_key() -> None:
    assert declared("config.lr", {"lr"})
    assert declared("config.optim.betas", {"optim"})
    assert declared("config.optim.betas", {"config.optim"})
    assert declared("params.model.2.weight", {"params.model"})
    assert not declared("config.lr_warmup", {"lr"})
    assert not declared("params.model.0.weight", {"model"})


def test_a_checkpoint_without_a_record_is_not_compared() -> None:
    now = _now(config={"lr": 1.0})
    assert check_resume(None, now, frozenset(), step=1, attempt="1") is now


def test_the_users_config_must_be_json_and_names_the_option() -> None:
    assert user_config({"lr": 1e-3, "sizes": (1, 2)}) == {"lr": 1e-3, "sizes": [1, 2]}
    assert user_config(None) == {}
    with pytest.raises(ValueError, match="config: expected JSON values"):
        user_config({"lr": math.nan})
    with pytest.raises(ValueError, match="config: expected JSON values"):
        user_config({"device": object()})
    with pytest.raises(ValueError, match="config: expected a mapping"):
        user_config([("lr", 1)])  # type: ignore[arg-type]


def test_allow_config_change_as_a_bare_string_is_refused() -> None:
    with pytest.raises(ValueError, match=r"allow_config_change: .*write \['lr'\]"):
        allowed_changes("lr")
    with pytest.raises(ValueError, match="non-empty strings"):
        allowed_changes(["lr", ""])
    assert allowed_changes(("lr", "params")) == {"lr", "params"}


@pytest.mark.parametrize(
    ("record", "field"),
    [
        ({"world_size": 0, "layout": "replicated"}, "world_size"),
        ({"world_size": 2, "layout": 3}, "layout"),
        ({"world_size": 2, "layout": "replicated", "params": {"w": [2, "x"]}}, "params"),
        ({"world_size": 2, "layout": "replicated", "history": [{"step": "1"}]}, "history[0]"),
        ([], "run_config"),
    ],
)
def test_a_damaged_record_is_an_error_naming_the_field(record: object, field: str) -> None:
    with pytest.raises(ValueError, match=re.escape(field)):
        RunConfig.parse(record)


def test_a_manifest_keeps_the_record_in_extra() -> None:
    extra = with_run_config({"torch": {}}, SAVED.encode())
    manifest = Manifest.model_validate(
        {
            "run_id": "r",
            "step": 1,
            "world_size": 2,
            "created_at": "2026-12-05T00:00:00Z",
            "files": [],
            "extra": extra,
        }
    )
    assert RunConfig.parse(manifest.extra[RUN_CONFIG_EXTRA]) == SAVED
    assert with_run_config({"a": 1}, None) == {"a": 1}


def test_an_object_added_or_dropped_whole_is_left_to_the_strict_rule() -> None:
    added = {**SAVED.params, "probe.weight": (4, 4)}
    assert differences(SAVED, _now(params=added)) == []
    assert differences(_now(params=added), SAVED) == []
    grown = {**SAVED.params, "model.4.weight": (1, 32)}  # a layer of a model both hold
    assert [c.key for c in differences(SAVED, _now(params=grown))] == ["params.model.4.weight"]
