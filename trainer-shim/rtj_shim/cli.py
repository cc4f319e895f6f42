"""``rtj-shim``: publish, resolve, verify, list and garbage-collect checkpoints.

Exit codes: 0 success (``resolve`` included when there is no checkpoint); 1 the named step
is invalid or the request was refused; 2 usage error; 3 the store cannot be read or written.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from rtj_shim import output
from rtj_shim.agent import progress_cli
from rtj_shim.checkpoint.layout import MAX_STEP, validate_attempt
from rtj_shim.checkpoint.manifest import Framework
from rtj_shim.checkpoint.protocol import CommitProtocol, StepMetadata
from rtj_shim.checkpoint.pruning import prune
from rtj_shim.checkpoint.resolver import describe_steps, resolve
from rtj_shim.checkpoint.retention import RetentionPolicy
from rtj_shim.checkpoint.storage import open_store
from rtj_shim.checkpoint.verification import Depth, Share
from rtj_shim.checkpoint.verifier import verify_step
from rtj_shim.errors import Refused, ShimError, StoreError, UsageError
from rtj_shim.wire.resume_file import ResumeFile

EXIT_OK, EXIT_INVALID, EXIT_USAGE, EXIT_STORE = 0, 1, 2, 3  # argparse also exits 2


def _step(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a step number, got {text!r}") from None
    if not 0 <= value <= MAX_STEP:
        raise argparse.ArgumentTypeError(f"expected a step in [0, {MAX_STEP}], got {value}")
    return value


def _attempt(text: str) -> str:
    try:
        return validate_attempt(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _output_option(command: argparse.ArgumentParser) -> None:
    command.add_argument("-o", "--output", choices=output.FORMATS, default="json",
                         help="json (the default) or yaml")  # fmt: skip


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rtj-shim")
    except PackageNotFoundError:  # run from a source tree without installing
        return "unknown (not installed)"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rtj-shim", description="Verified checkpoints: commit protocol, resume, retention."
    )
    parser.add_argument("--version", action="version", version=f"rtj-shim {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    root_help = "checkpoint root: a path, file://PATH or s3://BUCKET/PREFIX"

    commit = sub.add_parser("commit", help="publish the files under DIR as step N")
    commit.add_argument("--root", required=True, help=root_help)
    _output_option(commit)
    commit.add_argument("--step", required=True, type=_step)
    commit.add_argument("--from", dest="source", required=True, type=Path, metavar="DIR")
    commit.add_argument(
        "--run-id",
        default=None,
        help="run owning the root (default: RTJ_RUN_ID or the root's existing run)",
    )
    commit.add_argument("--world-size", type=_positive, default=1)
    commit.add_argument(
        "--attempt",
        type=_attempt,
        default=os.environ.get("RTJ_ATTEMPT", "0"),
        help="writer attempt (default: RTJ_ATTEMPT or 0)",
    )
    commit.add_argument("--framework", default="external", help="framework name for the manifest")

    res = sub.add_parser("resolve", help="the newest step that verifies")
    res.add_argument("--root", required=True, help=root_help)
    _output_option(res)
    res.add_argument("--step", type=_step, default=None, help="check only this step")
    res.add_argument("--deep", action="store_true", help="also check every file's sha256")
    res.add_argument(
        "--deep-share",
        type=_share,
        default=None,
        metavar="INDEX/COUNT",
        help="with --deep, hash only this verifier's share of the files (every file is "
        "hashed by exactly one of COUNT verifiers; the rest get a size check)",
    )
    res.add_argument(
        "--write",
        type=Path,
        default=None,
        metavar="FILE",
        help="also write the result to FILE atomically",
    )
    res.add_argument("--workers", type=_positive, default=None, help="hashing threads")
    res.add_argument(
        "--termination-log",
        type=Path,
        default=None,
        metavar="FILE",
        help="also write a compact result (or the error) for the pod status, at most 4096 "
        "bytes (Kubernetes' limit); init containers pass /dev/termination-log",
    )

    ver = sub.add_parser("verify", help="verify one step")
    ver.add_argument("--root", required=True, help=root_help)
    _output_option(ver)
    ver.add_argument("--step", required=True, type=_step)
    ver.add_argument("--deep", action="store_true")
    ver.add_argument("--workers", type=_positive, default=None)

    ls = sub.add_parser("ls", help="every step with its state and age")
    ls.add_argument("--root", required=True, help=root_help)
    ls.add_argument("-o", "--output", choices=("text", *output.FORMATS), default="text",
                    help="text (a table; the default), json or yaml")  # fmt: skip
    ls.add_argument("--json", dest="output", action="store_const", const="json",
                    help="the same as -o json")  # fmt: skip

    gc = sub.add_parser("gc", help="delete steps outside the retention policy")
    gc.add_argument("--root", required=True, help=root_help)
    _output_option(gc)
    gc.add_argument("--keep-last", required=True, type=_positive)
    gc.add_argument("--keep-every", type=_positive, default=None)
    gc.add_argument("--protect", type=_step, nargs="*", default=[], metavar="STEP")
    gc.add_argument("--dry-run", action="store_true")
    progress_cli.register(sub, _COMMANDS)  # progress-server, heartbeat
    return parser


def _print(data: object, args: argparse.Namespace) -> None:
    sys.stdout.write(output.render(data, getattr(args, "output", None) or "json"))


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``path`` so a reader sees the old content or the new, never a torn file."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with tmp.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(path)


def _commit(args: argparse.Namespace) -> int:
    protocol = CommitProtocol(
        open_store(args.root, "--root"), run_id=args.run_id, attempt=args.attempt
    )
    metadata = StepMetadata.from_env(
        world_size=args.world_size, framework=Framework(name=args.framework)
    )
    result = protocol.publish_directory(args.step, args.source, metadata)
    _print(result.to_json(), args)
    return EXIT_OK


TERMINATION_MESSAGE_LIMIT = 4096


def termination_message(body: dict[str, object], limit: int = TERMINATION_MESSAGE_LIMIT) -> bytes:
    """Compact JSON that fits the kubelet's limit; trims ``skipped`` before anything else."""
    body = dict(body)
    listed = body.get("skipped")
    skipped = list(listed) if isinstance(listed, list) else []
    while True:
        raw = json.dumps(body, separators=(",", ":")).encode()
        if len(raw) <= limit or not skipped:
            break
        skipped.pop()
        body["skipped"] = skipped
        body["skipped_truncated"] = True
    if len(raw) > limit:
        message = str(body.get("error", ""))[: limit // 2]
        raw = json.dumps({"error": message, "truncated": True}, separators=(",", ":")).encode()
    return raw


def _resolve(args: argparse.Namespace) -> int:
    try:
        return _resolve_and_report(args)
    except (StoreError, UsageError) as exc:
        if args.termination_log is not None:
            _write_termination_log(args.termination_log, ResumeFile(error=str(exc)).encode())
        raise


def _write_termination_log(path: Path, body: dict[str, object]) -> None:
    try:
        path.write_bytes(termination_message(body))
    except OSError as exc:  # the resolution itself stands; only the report is lost
        print(f"rtj-shim: note: cannot write {path}: {exc.strerror}", file=sys.stderr)


def _share(text: str) -> Share:
    try:
        return Share.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _resolve_and_report(args: argparse.Namespace) -> int:
    depth = Depth.DEEP if args.deep else Depth.SHALLOW
    resolution = resolve(
        open_store(args.root, "--root"),
        depth,
        step=args.step,
        workers=args.workers,
        share=args.deep_share,
    )
    if resolution.hint_problem:
        print(f"rtj-shim: note: {resolution.hint_problem}", file=sys.stderr)
    for skipped in resolution.skipped:
        print(f"rtj-shim: skipped step {skipped.step}: {skipped.reason}", file=sys.stderr)
    body = ResumeFile.of_resolution(resolution).encode()
    if args.write is not None:
        write_atomically(args.write, (json.dumps(body, indent=2) + "\n").encode())
    if args.termination_log is not None:
        _write_termination_log(args.termination_log, body)
    _print(body, args)
    if args.step is not None and resolution.step is None:
        return EXIT_INVALID
    return EXIT_OK


def _verify(args: argparse.Namespace) -> int:
    depth = Depth.DEEP if args.deep else Depth.SHALLOW
    store = open_store(args.root, "--root")
    if not store.root_exists():
        _print({"step": args.step, "valid": False, "reason": f"{store.uri} does not exist"}, args)
        return EXIT_INVALID
    published = {d.name.step for d in store.list_step_dirs() if not d.name.in_progress}
    if args.step not in published:
        reason = f"step {args.step} is not published under {store.uri}"
        _print({"step": args.step, "valid": False, "reason": reason}, args)
        return EXIT_INVALID
    verdict = verify_step(store, args.step, depth, args.workers)
    _print({"step": verdict.step, "valid": verdict.valid, "reason": verdict.reason}, args)
    return EXIT_OK if verdict.valid else EXIT_INVALID


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def _ls(args: argparse.Namespace) -> int:
    now = time.time()
    rows = []
    for listing in describe_steps(open_store(args.root, "--root")):
        modified = listing.entry.modified
        rows.append(
            {
                "step": listing.entry.name.step,
                "dir": str(listing.entry.name),
                "state": listing.label,
                "age_seconds": None if modified is None else round(max(0.0, now - modified), 3),
                "reason": listing.state.reason,
            }
        )
    if args.output in output.FORMATS:
        _print(rows, args)
        return EXIT_OK
    print(f"{'STEP':>12}  {'STATE':<12} {'AGE':>5}  DIR")
    for row in rows:
        age = row["age_seconds"]
        shown = _age(age if isinstance(age, float) else None)
        line = f"{row['step']:>12}  {row['state']:<12} {shown:>5}  {row['dir']}"
        if row["state"] == "broken":
            line += f"  ({row['reason']})"
        print(line)
    return EXIT_OK


def _gc(args: argparse.Namespace) -> int:
    policy = RetentionPolicy(args.keep_last, args.keep_every, frozenset(args.protect))
    result = prune(open_store(args.root, "--root"), policy, dry_run=args.dry_run)
    if result.failed:
        _name, why = result.failed[0]
        raise StoreError(f"{why} ({len(result.failed)} step(s) not deleted)")
    _print({"dry_run": args.dry_run, **result.plan.to_json()}, args)
    return EXIT_OK


_COMMANDS = {"commit": _commit, "resolve": _resolve, "verify": _verify, "ls": _ls, "gc": _gc}


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _COMMANDS[args.command](args)
    except StoreError as exc:
        print(f"rtj-shim: store error: {exc}", file=sys.stderr)
        return EXIT_STORE
    except UsageError as exc:
        print(f"rtj-shim: usage error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Refused as exc:
        print(f"rtj-shim: refused: {exc}", file=sys.stderr)
        return EXIT_INVALID
    except ShimError as exc:
        print(f"rtj-shim: error: {exc}", file=sys.stderr)
        return EXIT_INVALID


if __name__ == "__main__":
    sys.exit(main())
