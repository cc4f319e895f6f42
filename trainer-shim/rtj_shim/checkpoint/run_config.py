"""The configuration guard on resume (issue 43 section 4). Pure: no torch, no I/O.

Every manifest records what defines the run (``extra.run_config``): the world size and
parallel layout, the hyperparameters the user declares (``Checkpointer(..., config=...)``:
any JSON-able mapping) and the model's parameter names and shapes, with the history of the
changes accepted at earlier resumes. A resume compares the saved record with the run's own:

- a world-size or layout change is allowed (the restore reshards what it can and refuses
  what it cannot) and recorded;
- any other difference (a learning rate, a layer's shape, a parameter added or removed)
  fails the resume naming the differing keys, unless the user declares it
  (``allow_config_change=["lr", "params.model.head"]``), and is then recorded.

A key is dotted: ``world_size``, ``layout``, ``config.<key>[.<nested key>]``,
``params.<object>.<parameter>`` (compared within the objects both records hold: adding or
dropping a whole object is ``restore(strict=...)``'s to allow). A declared name matches a
key, any key under it, and for the user's own config its name without ``config.``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

RUN_CONFIG_EXTRA = "run_config"
"""The key of ``Manifest.extra`` that holds the step's run configuration."""
RESHARDABLE = ("world_size", "layout")
"""Keys whose change the restore handles itself (it reshards or refuses): always allowed."""
MAX_HISTORY = 64


class ConfigMismatch(ValueError):
    """A resume whose run configuration differs from the checkpoint's in undeclared keys."""

    def __init__(self, step: int, changes: Iterable[ConfigChange]) -> None:
        self.changes = tuple(changes)
        listed = "; ".join(c.describe() for c in self.changes)
        names = sorted({c.key for c in self.changes})
        super().__init__(
            f"resume of step {step} refused: the run's configuration differs from the "
            f"checkpoint's in {listed}. If the change is intended, declare it: "
            f"Checkpointer(..., allow_config_change={names!r})"
        )


@dataclass(frozen=True)
class ConfigChange:
    """One key's value in the checkpoint (``saved``) and in this run (``now``); a key absent
    on one side reads as None there."""

    key: str
    saved: Any
    now: Any

    def describe(self) -> str:
        return f"{self.key} ({_show(self.saved)} in the checkpoint, {_show(self.now)} now)"

    def encode(self) -> dict[str, Any]:
        return {"key": self.key, "saved": self.saved, "now": self.now}

    @classmethod
    def parse(cls, data: object, where: str) -> ConfigChange:
        if not isinstance(data, Mapping) or not isinstance(data.get("key"), str):
            raise ValueError(f"{where}: expected an object with a string 'key', got {data!r}")
        return cls(data["key"], data.get("saved"), data.get("now"))


@dataclass(frozen=True)
class AcceptedChange:
    """Changes accepted when an attempt resumed ``step``: recorded in every later manifest."""

    step: int
    attempt: str
    changes: tuple[ConfigChange, ...]

    def encode(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "attempt": self.attempt,
            "changes": [c.encode() for c in self.changes],
        }

    @classmethod
    def parse(cls, data: object, where: str) -> AcceptedChange:
        if not isinstance(data, Mapping):
            raise ValueError(f"{where}: expected an object, got {type(data).__name__}")
        step, changes = data.get("step"), data.get("changes")
        if not isinstance(step, int) or isinstance(step, bool) or not isinstance(changes, list):
            raise ValueError(f"{where}: expected an integer 'step' and a list 'changes'")
        parsed = tuple(
            ConfigChange.parse(c, f"{where}.changes[{i}]") for i, c in enumerate(changes)
        )
        return cls(step, str(data.get("attempt", "")), parsed)


@dataclass(frozen=True)
class RunConfig:
    """What defines the run, as a manifest records it."""

    world_size: int
    layout: str
    config: Mapping[str, Any] = field(default_factory=dict)
    params: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    history: tuple[AcceptedChange, ...] = ()

    def encode(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "layout": self.layout,
            "config": dict(self.config),
            "params": {name: list(shape) for name, shape in sorted(self.params.items())},
            "history": [h.encode() for h in self.history],
        }

    @classmethod
    def parse(cls, data: object, where: str = f"extra.{RUN_CONFIG_EXTRA}") -> RunConfig:
        """The record in a manifest; ValueError naming the field that is not as expected."""
        if not isinstance(data, Mapping):
            raise ValueError(f"{where}: expected an object, got {type(data).__name__}")
        world, layout = data.get("world_size"), data.get("layout")
        if not isinstance(world, int) or isinstance(world, bool) or world < 1:
            raise ValueError(f"{where}.world_size: expected a positive integer, got {world!r}")
        if not isinstance(layout, str):
            raise ValueError(f"{where}.layout: expected a string, got {layout!r}")
        config, params, history = (
            data.get("config", {}),
            data.get("params", {}),
            data.get("history", []),
        )
        if not isinstance(config, Mapping):
            raise ValueError(f"{where}.config: expected an object, got {type(config).__name__}")
        if not isinstance(params, Mapping) or not all(_is_shape(s) for s in params.values()):
            raise ValueError(f"{where}.params: expected an object of integer lists (shapes)")
        if not isinstance(history, list):
            raise ValueError(f"{where}.history: expected a list, got {type(history).__name__}")
        return cls(
            world,
            layout,
            dict(config),
            {str(k): tuple(v) for k, v in params.items()},
            tuple(AcceptedChange.parse(h, f"{where}.history[{i}]") for i, h in enumerate(history)),
        )

    def keyed(self) -> dict[str, Any]:
        """Every compared key and its value (the history is not compared)."""
        keys: dict[str, Any] = {"world_size": self.world_size, "layout": self.layout}
        keys.update(_flatten("config", self.config))
        keys.update({f"params.{name}": list(shape) for name, shape in self.params.items()})
        return keys


def user_config(config: Mapping[str, Any] | None) -> dict[str, Any]:
    """The user's declared hyperparameters as they will be recorded: a JSON round trip, so
    what is compared at a resume is what was saved. ValueError naming ``config`` and what is
    not JSON-able (a tensor, a NaN, a non-string key)."""
    if config is None:
        return {}
    if not isinstance(config, Mapping):
        raise ValueError(f"config: expected a mapping of JSON values, got {type(config).__name__}")
    try:
        text = json.dumps(config, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"config: expected JSON values (numbers, strings, lists, dicts): {exc}"
        ) from None
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def allowed_changes(names: Iterable[str]) -> frozenset[str]:
    """The keys the user declares may change (``allow_config_change``); ValueError naming the
    option when it is a bare string (a common slip: ``"lr"`` for ``["lr"]``) or holds
    anything but non-empty strings."""
    if isinstance(names, str | bytes):
        raise ValueError(
            f"allow_config_change: expected a list of keys, got the string {names!r} "
            f"(write [{names!r}])"
        )
    listed = list(names)
    bad = [n for n in listed if not isinstance(n, str) or not n]
    if bad:
        raise ValueError(f"allow_config_change: expected non-empty strings, got {bad!r}")
    return frozenset(listed)


def with_run_config(extra: dict[str, Any], record: Mapping[str, Any] | None) -> dict[str, Any]:
    """A manifest's ``extra`` recording the run's configuration (unchanged without one)."""
    return extra if record is None else {**extra, RUN_CONFIG_EXTRA: dict(record)}


def differences(saved: RunConfig, now: RunConfig) -> list[ConfigChange]:
    """Every key whose value differs, in key order. Parameters are compared within the
    objects both records hold: an object added to the code since, or one no longer passed,
    is the restore's ``strict`` rule's to allow or refuse, not a configuration change."""
    a, b = saved.keyed(), now.keyed()
    both = _objects_of(a) & _objects_of(b)
    return [
        ConfigChange(key, a.get(key), b.get(key))
        for key in sorted(set(a) | set(b))
        if not _same(a.get(key), b.get(key))
        and (not key.startswith("params.") or _object_of(key) in both)
    ]


def declared(key: str, allowed: Collection[str]) -> bool:
    """Whether the user declared a change of ``key``: the key itself, a prefix of it at a dot,
    or a config key named without its ``config.`` prefix."""
    names = {key, *(key[:i] for i, ch in enumerate(key) if ch == ".")}
    if key.startswith("config."):
        bare = key[len("config.") :]
        names |= {bare, *(bare[:i] for i, ch in enumerate(bare) if ch == ".")}
    return bool(names & set(allowed))


def check_resume(
    saved: RunConfig | None, now: RunConfig, allowed: Collection[str], *, step: int, attempt: str
) -> RunConfig:
    """The record this run publishes after resuming ``step`` from a checkpoint whose record is
    ``saved``: its history plus the changes accepted now. ConfigMismatch naming every
    undeclared change. A checkpoint without a record (written before the guard) is not
    compared: there is nothing to compare with."""
    if saved is None:
        return now
    changes = differences(saved, now)
    refused = [c for c in changes if c.key not in RESHARDABLE and not declared(c.key, allowed)]
    if refused:
        raise ConfigMismatch(step, refused)
    history = saved.history
    if changes:
        history = (*history, AcceptedChange(step, attempt, tuple(changes)))[-MAX_HISTORY:]
    return RunConfig(now.world_size, now.layout, now.config, now.params, history)


def _object_of(key: str) -> str:
    return key.split(".", 2)[1]


def _objects_of(keyed: Mapping[str, Any]) -> set[str]:
    return {_object_of(k) for k in keyed if k.startswith("params.")}


def _flatten(prefix: str, value: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, item in value.items():
        name = f"{prefix}.{key}"
        if isinstance(item, Mapping) and item:
            out.update(_flatten(name, item))
        else:
            out[name] = item
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return bool(type(a) is type(b) and a == b) or (
        isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool)
        and not isinstance(b, bool) and a == b
    )  # fmt: skip


def _is_shape(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(d, int) and d >= 0 for d in value)


def _show(value: Any) -> str:
    text = "absent" if value is None else json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."
