"""`rtj`: the operator's offline tools.

    rtj classify --pods PODS.json [--nodes NODES.json] [--events EVENTS.json ...] [--rtj RTJ.yaml]
                 [--output json|yaml|text]
    rtj crds --check | --write [--path crds/resilienttrainingjobs.yaml]
    rtj run [OPTIONS]          run the operator (see `rtj run --help`)

Exit codes: 0 success (`classify` included when nothing failed); 1 `crds --check` found the
file stale; 2 usage error (unreadable or malformed input).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from rtj_operator import crdgen
from rtj_operator.api.detection_spec import NodeHealth
from rtj_operator.api.resource import ResilientTrainingJob
from rtj_operator.policy.classify import Classification, classify_failure, no_failure_json

EXIT_OK, EXIT_STALE, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """Input the command cannot use; reported on stderr with exit code 2."""


def operator_version() -> str:
    """The installed distribution's version (the chart's appVersion names the same)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("resilient-training-operator")
    except PackageNotFoundError:  # run from a source tree without installing
        return "unknown (not installed)"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rtj", description="Resilient Training Operator tools.")
    parser.add_argument("--version", action="version", version=f"rtj {operator_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    cls = sub.add_parser(
        "classify",
        help="classify a failed attempt from kubectl JSON",
        description="Every file is what `kubectl get ... -o json` (or -o yaml) prints: a List "
        "or one object. Items are sorted by their kind, so `kubectl get pods,nodes -o json` and "
        "core/v1 and events.k8s.io/v1 Events in one file are fine; an event seen through both "
        "APIs counts once.",
    )
    cls.add_argument(
        "--pods",
        required=True,
        type=Path,
        action="append",
        help="kubectl get pods -o json (repeatable)",
    )
    cls.add_argument(
        "--nodes",
        type=Path,
        action="append",
        default=None,
        help="kubectl get nodes -o json (repeatable; without it a missing node proves nothing)",
    )
    cls.add_argument(
        "--events",
        type=Path,
        action="append",
        default=None,
        help="kubectl get events -o json and/or kubectl get events.events.k8s.io "
        "-o json (repeatable)",
    )
    cls.add_argument("--rtj", type=Path, default=None, help="the job (its nodeHealth settings)")
    cls.add_argument("--now", default=None, help="RFC 3339 time to judge at (default: now)")
    cls.add_argument(
        "--output",
        "-o",
        choices=("json", "yaml", "text"),
        default="json",
        help="json (the contract), yaml (the same) or text (which signal decided, and why)",
    )

    sub.add_parser("run", help="run the operator (rtj run --help)", add_help=False)

    crds = sub.add_parser("crds", help="check or write the generated CRD")
    mode = crds.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    mode.add_argument("--write", action="store_true", help="regenerate the file")
    crds.add_argument("--path", type=Path, default=crdgen.CRD_PATH)
    return parser


def _load(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None


def _items(path: Path) -> list[dict[str, Any]]:
    """The objects of a Kubernetes List (or a single object) as kubectl prints them."""
    data = _load(path)
    if isinstance(data, dict) and isinstance(data.get("items"), list):
        return [item for item in data["items"] if isinstance(item, dict)]
    if isinstance(data, dict) and "metadata" in data:
        return [data]
    raise UsageError(f"{path}: expected a Kubernetes List (kubectl get ... -o json)")


_KINDS = {"Pod": "pods", "Node": "nodes", "Event": "events"}


def _inputs(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    """Every item of every file, by kind (an item without one counts as its flag's kind);
    an Event listed through both core/v1 and events.k8s.io/v1 is kept once."""
    found: dict[str, list[dict[str, Any]]] = {"pods": [], "nodes": [], "events": []}
    for flag in found:
        for path in getattr(args, flag) or []:
            for i, item in enumerate(_items(path)):
                kind = item.get("kind")
                if kind is not None and kind not in _KINDS:  # a job, a JobSet: not evidence
                    raise UsageError(
                        f"{path}: item {i} is a {kind}; expected Pods, Nodes or Events "
                        "(kubectl get pods,nodes,events -o json)"
                    )
                found[_KINDS.get(str(kind), flag)].append(item)
    seen: set[tuple[str, str]] = set()
    events = []
    for event in found["events"]:
        meta = event.get("metadata") or {}
        key = (
            str(meta.get("namespace", "")),
            str(meta.get("uid") or meta.get("name") or id(event)),
        )
        if key not in seen:
            seen.add(key)
            events.append(event)
    found["events"] = events
    return found


def _node_health(path: Path | None) -> NodeHealth:
    if path is None:
        return NodeHealth()
    try:
        return ResilientTrainingJob.from_object(_load(path)).spec.node_health
    except ValueError as exc:
        raise UsageError(f"{path}: not a valid ResilientTrainingJob: {exc}") from None


def _now(text: str | None) -> datetime:
    if text is None:
        return datetime.now(timezone.utc)
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"--now: expected an RFC 3339 time, got {text!r}") from None


def _classify(args: argparse.Namespace) -> int:
    found = _inputs(args)
    nodes = found["nodes"] if args.nodes is not None or found["nodes"] else None
    result = classify_failure(
        found["pods"], nodes, found["events"], _now(args.now), node_health=_node_health(args.rtj)
    )
    if args.output == "text":
        sys.stdout.write(_text(result, nodes is not None))
        return EXIT_OK
    body = result.to_json() if result is not None else no_failure_json()
    if args.output == "yaml":
        sys.stdout.write(yaml.safe_dump(body, sort_keys=False))
        return EXIT_OK
    sys.stdout.write(json.dumps(body, indent=2) + "\n")
    return EXIT_OK


def _text(result: Classification | None, nodes_read: bool) -> str:
    """What an SRE reads first: the class, the rank, the signal that decided, and why."""
    if result is None:
        return "no failed pod: nothing to classify\n"
    first, decided = result.first_failed, result.decided_by
    lines = [
        f"class:      {result.failure_class.value} ({result.category.value}"
        f"{', retried' if result.retryable else ', not retried'})"
    ]
    if first is not None:
        lines.append(
            f"first:      rank {first.rank} (node rank {first.node_rank}), pod "
            f"{first.pod} on {first.node or '?'}, exit {first.exit_code}, "
            f"at {first.finished_at.isoformat() if first.finished_at else '?'}"
        )
    if decided is not None:
        lines.append(f"decided by: {decided.signal} [{decided.source}]")
        lines.append(f"why:        {decided.rule}")
    quarantine = ", ".join(result.nodes_to_quarantine) or "none"
    lines.append(f"quarantine: {quarantine}" + ("" if nodes_read else " (no nodes given)"))
    lines.append("evidence:")
    lines += [f"  - {line}" for line in result.evidence]
    return "\n".join(lines) + "\n"


def _crds(args: argparse.Namespace) -> int:
    expected = crdgen.render_crd_yaml()
    if args.write:
        args.path.parent.mkdir(parents=True, exist_ok=True)
        args.path.write_text(expected, encoding="utf-8")
        print(f"rtj: wrote {args.path}")
        return EXIT_OK
    try:
        current = args.path.read_text(encoding="utf-8")
    except OSError:
        current = None
    if current != expected:
        print(f"rtj: {args.path} is stale; run `make crds`", file=sys.stderr)
        return EXIT_STALE
    print(f"rtj: {args.path} is up to date")
    return EXIT_OK


_COMMANDS = {"classify": _classify, "crds": _crds}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["run"]:  # the operator itself: its own options, imported only when asked
        from rtj_operator.main import main as run_operator

        return run_operator(argv[1:])
    args = _parser().parse_args(argv)
    try:
        return _COMMANDS[args.command](args)
    except UsageError as exc:
        print(f"rtj: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
