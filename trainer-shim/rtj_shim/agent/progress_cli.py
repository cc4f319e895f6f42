"""The in-pod commands: ``rtj-shim progress-server``, ``heartbeat`` and ``supervise``
(registered by rtj_shim.cli).

``progress-server --dir DIR --port PORT``: serve the ranks' progress records in DIR as
``GET /progress`` (JSON, rtj_shim.agent.progress_server) until SIGTERM or SIGINT. Prints one
JSON line ``{"listening": {"host": ..., "port": ...}, "dir": ...}`` once it accepts
connections (``--port 0``: any free port, the one chosen is in that line). With
``RTJ_SIGNED_READS=1`` (and the job's ``RTJ_CONTROL_KEY``) it answers only signed reads
(`rtj_shim.agent.progress_server.Reads`); with ``RTJ_SEALED_ANSWERS=1`` (and ``RTJ_POD_NAME``,
``RTJ_POD_ATTEMPT``) it seals its answers to reads carrying a nonce
(`rtj_shim.wire.answer_seal`).

``heartbeat --step N [--section NAME]``: coarse progress for a job that does not use
rtj_shim in Python, called from its shell loop. Completes step N when it is new (the time
since the previous new step is recorded as N's duration, divided by the steps between),
then sets the section. The record carries the calling shell's pid. Without
``RTJ_PROGRESS_DIR`` (or ``--dir``) it does nothing; a record it cannot write is reported
on stderr and still exits 0: progress reporting never fails the job.

``progress-get [--host ADDR] [--port PORT]``: print this pod's ``GET /progress`` (JSON),
signed with ``$RTJ_CONTROL_KEY`` where set, as the operator signs its reads: for a person
in the sidecar's container (``kubectl exec ... -c rtj-progress -- rtj-shim progress-get``),
where the job's sidecar answers only signed reads. Exits 1 with the answer on stderr unless
it is 200.

``supervise [--control-dir DIR] -- COMMAND ...``: run the trainer's command and restart it
inside the pod when the operator orders it (rtj_shim.agent.supervisor); the progress server
with the same ``--control-dir`` takes the orders (``POST /control``).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path
from types import FrameType
from typing import Any

from rtj_shim.agent import preflight, preload
from rtj_shim.agent.progress_handler import Reads
from rtj_shim.agent.progress_server import ProgressServer
from rtj_shim.agent.supervisor import Supervisor
from rtj_shim.errors import UsageError
from rtj_shim.fast import fast_tier
from rtj_shim.fast.drain_sidecar import Drainer
from rtj_shim.fast.peer_replica import request_headers
from rtj_shim.progress import ENV_DIR, Progress
from rtj_shim.wire import answer_seal
from rtj_shim.wire.progress_record import RecordError

ENV_PORT = "RTJ_PROGRESS_PORT"
ENV_CONTROL_DIR = "RTJ_CONTROL_DIR"
ENV_CONTROL_KEY = "RTJ_CONTROL_KEY"
ENV_JOB_UID = "RTJ_JOB_UID"
ENV_SIGNED_READS = "RTJ_SIGNED_READS"
ENV_SEALED_ANSWERS = "RTJ_SEALED_ANSWERS"
ENV_POD_NAME = "RTJ_POD_NAME"
ENV_POD_ATTEMPT = "RTJ_POD_ATTEMPT"
ENV_POD_IP = "RTJ_POD_IP"
DEFAULT_PORT = 9478
PROGRESS_PATH = "/progress"


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port in [0, 65535], got {value}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {value}")
    return value


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``progress-server`` and ``heartbeat`` to the ``rtj-shim`` subcommands."""
    env_dir = os.environ.get(ENV_DIR) or None
    server = sub.add_parser("progress-server", help="serve the ranks' progress records")
    server.add_argument(
        "--dir",
        type=Path,
        default=env_dir,
        required=env_dir is None,
        help=f"the records' directory (default: ${ENV_DIR})",
    )
    server.add_argument(
        "--port",
        type=_port,
        default=_port(os.environ.get(ENV_PORT) or str(DEFAULT_PORT)),
        help=f"TCP port (default: ${ENV_PORT} or {DEFAULT_PORT}; 0: any free port)",
    )
    server.add_argument("--host", default="0.0.0.0", help="address to bind (default: all)")  # noqa: S104
    server.add_argument(
        "--control-dir",
        type=Path,
        default=os.environ.get(ENV_CONTROL_DIR) or None,
        help=f"take restart orders for the pod's supervisor here (default: ${ENV_CONTROL_DIR}; "
        f"orders are checked against ${ENV_CONTROL_KEY} and ${ENV_JOB_UID})",
    )
    server.add_argument(
        "--fast-tier-dir",
        type=Path,
        default=os.environ.get(fast_tier.ENV_DIR) or None,
        help=f"report the newest fast checkpoint step every rank here holds (default: "
        f"${fast_tier.ENV_DIR})",
    )

    get = sub.add_parser("progress-get", help="print this pod's progress (a signed read)")
    get.add_argument(
        "--host",
        default=os.environ.get(ENV_POD_IP) or "127.0.0.1",
        help=f"the sidecar's address (default: ${ENV_POD_IP}, as the sidecar listens)",
    )
    get.add_argument(
        "--port",
        type=_port,
        default=_port(os.environ.get(ENV_PORT) or str(DEFAULT_PORT)),
        help=f"default: ${ENV_PORT} or {DEFAULT_PORT}",
    )

    sup = sub.add_parser(
        "supervise", help="run the trainer's command; restart it in place when ordered"
    )
    sup.add_argument(
        "--control-dir",
        type=Path,
        default=os.environ.get(ENV_CONTROL_DIR) or env_dir,
        required=not (os.environ.get(ENV_CONTROL_DIR) or env_dir),
        help=f"orders and reports (default: ${ENV_CONTROL_DIR}, else ${ENV_DIR})",
    )
    sup.add_argument(
        "--grace", type=float, default=10.0, help="SIGTERM to SIGKILL when the pod ends, seconds"
    )
    sup.add_argument(
        "--stop-grace",
        type=float,
        default=3.0,
        help="SIGTERM to SIGKILL for an ordered stop (an in-place restart), seconds",
    )
    sup.add_argument(
        "--order-deadline",
        type=float,
        default=60.0,
        help="after the command fails, wait this long for a restart order, then exit with "
        "its code (the pod fails as without a supervisor)",
    )
    sup.add_argument(
        "--preload",
        default="",
        metavar="MODULE,...",
        help="keep a warm interpreter with these modules imported for the next generation "
        "(a Python interpreter's command only; others start cold)",
    )
    sup.add_argument(
        "--preload-fork",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="fork each generation's trainer from one interpreter per pod that imported the "
        "modules once (default); --no-preload-fork: a fresh standby interpreter per "
        "generation, for modules that are not fork-safe (they start threads or a GPU context)",
    )
    sup.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")

    beat = sub.add_parser("heartbeat", help="report a step (and section) from a shell loop")
    beat.add_argument("--step", required=True, type=_count, help="steps completed")
    beat.add_argument("--section", default=None, help="the section the job is in now")
    beat.add_argument("--dir", type=Path, default=env_dir, help=f"default: ${ENV_DIR}")
    beat.add_argument("--rank", type=_count, default=None, help="default: $RANK or 0")
    beat.add_argument("--local-rank", type=_count, default=None, help="default: $LOCAL_RANK")


def reads_from_env(env: Mapping[str, str]) -> Reads:
    """``RTJ_SIGNED_READS=1``: only signed reads, which need the job's key (UsageError
    without it: a sidecar that could answer nobody would blind the operator silently)."""
    if env.get(ENV_SIGNED_READS, "") != "1":
        return Reads.OPEN
    if not env.get(ENV_CONTROL_KEY):
        raise UsageError(f"progress-server: ${ENV_SIGNED_READS}=1 needs ${ENV_CONTROL_KEY}")
    return Reads.SIGNED


def answerer_from_env(env: Mapping[str, str]) -> answer_seal.Answerer | None:
    """``RTJ_SEALED_ANSWERS=1``: this pod (``RTJ_POD_NAME``, ``RTJ_POD_ATTEMPT``) seals its
    answers with the job's key (UsageError where one is missing: the operator would count
    every unsealed answer as no answer)."""
    if env.get(ENV_SEALED_ANSWERS, "") != "1":
        return None
    missing = [n for n in (ENV_CONTROL_KEY, ENV_POD_NAME, ENV_POD_ATTEMPT) if not env.get(n)]
    if missing:
        raise UsageError(f"progress-server: ${ENV_SEALED_ANSWERS}=1 needs ${', $'.join(missing)}")
    return answer_seal.Answerer(env[ENV_POD_NAME], env[ENV_POD_ATTEMPT])


def progress_server(args: argparse.Namespace) -> int:
    reads = reads_from_env(os.environ)
    answerer = answerer_from_env(os.environ)
    server = ProgressServer(
        args.dir,
        args.host,
        args.port,
        control_dir=args.control_dir,
        fast_tier_dir=args.fast_tier_dir,
        control_key=os.environ.get(ENV_CONTROL_KEY, ""),
        job_uid=os.environ.get(ENV_JOB_UID, ""),
        drainer=Drainer.from_env(
            args.fast_tier_dir, os.environ.get(ENV_CONTROL_KEY, ""), os.environ
        ),
        reads=reads,
        answerer=answerer,
    )

    def stop(signum: int, frame: FrameType | None) -> None:
        # never raise from the handler: a SystemExit raised while a request is being handed
        # to its thread was swallowed by socketserver and the server went on serving (a
        # flake found under load); shut down from another thread, as serve_forever needs
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    try:
        line = {"listening": {"host": args.host, "port": server.port}, "dir": str(args.dir)}
        sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def progress_get(args: argparse.Namespace) -> int:
    key = os.environ.get(ENV_CONTROL_KEY, "")
    headers = request_headers(key, "GET", PROGRESS_PATH, time.time()) if key else {}
    conn = http.client.HTTPConnection(args.host, args.port, timeout=10)
    try:
        conn.request("GET", PROGRESS_PATH, headers=headers)
        response = conn.getresponse()
        status, body = response.status, response.read()
    except (OSError, http.client.HTTPException) as exc:
        status, body = 0, f"{type(exc).__name__}: {exc}".encode()
    finally:
        conn.close()
    if status != 200:
        answer = body.decode(errors="replace").strip()
        print(f"rtj-shim: {args.host}:{args.port}: HTTP {status}: {answer}", file=sys.stderr)
        return 1
    sys.stdout.write(body.decode())
    return 0


def heartbeat(args: argparse.Namespace) -> int:
    if args.dir is None:
        return 0
    rank = args.rank if args.rank is not None else int(os.environ.get("RANK") or 0)
    local = args.local_rank
    if local is None:
        local = int(os.environ.get("LOCAL_RANK") or rank)
    try:
        progress = Progress(args.dir, rank, local, pid=os.getppid(), reuse=True)
        progress.heartbeat(args.step, args.section)
        progress.close(exited=False)
    except (OSError, RecordError, ValueError) as exc:
        print(f"rtj-shim: heartbeat not recorded: {exc}", file=sys.stderr)
    return 0


def supervise(args: argparse.Namespace) -> int:
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        raise UsageError("supervise: expected the trainer's command after --")
    return Supervisor(
        argv,
        args.control_dir,
        grace=args.grace,
        stop_grace=args.stop_grace,
        order_deadline=args.order_deadline,
        preload_modules=_modules(args.preload),
        preload_fork=args.preload_fork,
    ).run()


def _modules(text: str) -> tuple[str, ...]:
    try:
        return preload.parse_modules(text)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "progress-server": progress_server,
    "progress-get": progress_get,
    "heartbeat": heartbeat,
    "supervise": supervise,
}


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    commands: MutableMapping[str, Any],
) -> None:
    """The one call rtj_shim.cli makes: add the parsers, and their handlers to
    ``commands`` (its name -> handler table, whose inferred type is not ours to widen)."""
    add_parsers(sub)
    preflight.add_parser(sub)
    commands.update(COMMANDS)
    commands["preflight"] = preflight.main
