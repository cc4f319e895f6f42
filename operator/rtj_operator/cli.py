"""`rtj`: the operator's offline tools.

    rtj classify --pods PODS.json [--nodes NODES.json] [--events EVENTS.json] [--rtj RTJ.yaml]
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
from rtj_operator.api.resource import ResilientTrainingJob
from rtj_operator.api.spec import NodeHealth
from rtj_operator.policy.classify import classify_failure, no_failure_json

EXIT_OK, EXIT_STALE, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """Input the command cannot use; reported on stderr with exit code 2."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rtj", description="Resilient Training Operator tools.")
    sub = parser.add_subparsers(dest="command", required=True)

    cls = sub.add_parser("classify", help="classify a failed attempt from kubectl JSON")
    cls.add_argument("--pods", required=True, type=Path, help="kubectl get pods -o json")
    cls.add_argument("--nodes", type=Path, default=None, help="kubectl get nodes -o json")
    cls.add_argument("--events", type=Path, default=None, help="kubectl get events -o json")
    cls.add_argument("--rtj", type=Path, default=None, help="the job (its nodeHealth settings)")
    cls.add_argument("--now", default=None, help="RFC 3339 time to judge at (default: now)")

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


def _items(path: Path | None) -> list[dict[str, Any]] | None:
    """The objects of a Kubernetes List (or a single object) as kubectl prints them."""
    if path is None:
        return None
    data = _load(path)
    if isinstance(data, dict) and isinstance(data.get("items"), list):
        return [item for item in data["items"] if isinstance(item, dict)]
    if isinstance(data, dict) and "metadata" in data:
        return [data]
    raise UsageError(f"{path}: expected a Kubernetes List (kubectl get ... -o json)")


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
    pods = _items(args.pods) or []
    result = classify_failure(
        pods,
        _items(args.nodes),
        _items(args.events) or [],
        _now(args.now),
        node_health=_node_health(args.rtj),
    )
    body = result.to_json() if result is not None else no_failure_json()
    sys.stdout.write(json.dumps(body, indent=2) + "\n")
    return EXIT_OK


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
