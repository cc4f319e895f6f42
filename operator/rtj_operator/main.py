"""`rtj run` / `python -m rtj_operator`: run the operator.

    rtj run [--kubeconfig PATH] [--namespace NS ...] [--metrics-port 8080]
            [--leader-elect/--no-leader-elect] [--lease-namespace NS] [--lease-name NAME]

Order: load credentials, serve /metrics, wait to lead (a standby replica waits here),
then run kopf with the controller. Losing the Lease stops the process (exit 1) so the
Deployment restarts it as a standby: a deposed leader never keeps writing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

EXIT_OK, EXIT_LOST_LEASE, EXIT_USAGE = 0, 1, 2


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rtj run", description="Run the Resilient Training Operator.")
    p.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG") or None)
    p.add_argument("--context", default=None)
    p.add_argument(
        "--namespace", "-n", action="append", default=[], help="watch only these (default: all)"
    )
    p.add_argument("--metrics-port", type=int, default=8080, help="0 disables /metrics")
    p.add_argument("--metrics-addr", default="0.0.0.0")  # noqa: S104
    p.add_argument(
        "--health-port",
        type=int,
        default=8081,
        help="/healthz (the event loop and the controller's loops alive) and /readyz (a "
        "standby, or a leader with synced caches); 0 disables",
    )
    p.add_argument("--health-addr", default="0.0.0.0")  # noqa: S104
    p.add_argument("--leader-elect", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--lease-namespace", default=os.environ.get("POD_NAMESPACE", "default"))
    p.add_argument("--lease-name", default="rtj-operator")
    p.add_argument("--lease-duration", type=float, default=15.0)
    p.add_argument("--renew-deadline", type=float, default=10.0)
    p.add_argument("--retry-period", type=float, default=2.0)
    p.add_argument(
        "--identity", default=os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
    )
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--api-threads", type=int, default=32)
    p.add_argument("--resync-seconds", type=float, default=300.0)
    p.add_argument("--checkpoint-refresh-seconds", type=float, default=60.0)
    p.add_argument(
        "--operator-identity-store",
        action="append",
        default=[],
        metavar="URI_PREFIX",
        help="a checkpoint URI prefix (e.g. s3://ckpt-bucket/) the operator may read with its "
        "own credentials for jobs that name no credentialsSecretRef (default: none)",
    )
    p.add_argument("--store-read-timeout", type=float, default=30.0)
    p.add_argument(
        "--resolver-image",
        default=None,
        help="image of the jobs' resume init container and progress sidecar when a job sets "
        "no spec.checkpoint.resolverImage (unset: the trainer's image)",
    )
    p.add_argument(
        "--control-secret-file",
        type=Path,
        default=None,
        help="a file holding the operator's secret for in-place restart orders (the same for "
        "every replica; the chart mounts a Secret). Unset: no job restarts in place",
    )
    p.add_argument(
        "--progress-poll-seconds",
        type=float,
        default=5.0,
        help="how often each running worker pod's progress sidecar is read (0: never: no "
        "hang or straggler detection)",
    )
    p.add_argument(
        "--claim-sweep-seconds",
        type=float,
        default=60.0,
        help="how often quarantine claims on nodes are checked against the jobs that exist; "
        "a claim of a job deleted without releasing it is released (0: never)",
    )
    p.add_argument(
        "--claim-sweep-grace-seconds",
        type=float,
        default=120.0,
        help="how long a claim must have been seen orphaned before a sweep releases it",
    )
    p.add_argument(
        "--watch-node-leases",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="watch kube-node-lease to judge a silent node lost within seconds (off: only the "
        "node lifecycle controller's NotReady verdict counts, after its grace period)",
    )
    p.add_argument(
        "--watch-events",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep the Events the classifier reads from a watch (off: a failure LISTs them, "
        "a read that grows with every Event in its namespace)",
    )
    p.add_argument(
        "--platform-config",
        default=None,
        metavar="PATH",
        help="the platform team's policy (YAML: nodeHealth: taintKey, taintEffect, xidCodes, "
        "xidConditionTypes, xidLabelKeys); jobs may only narrow it",
    )
    p.add_argument("--watch-server-timeout", type=int, default=300)
    p.add_argument("--watch-client-timeout", type=float, default=330.0)
    p.add_argument("--watch-inactivity-timeout", type=float, default=70.0)
    p.add_argument("--log-level", default=os.environ.get("RTJ_LOG_LEVEL", "INFO"))
    p.add_argument(
        "--log-format",
        choices=("json", "text"),
        default=os.environ.get("RTJ_LOG_FORMAT", "json"),
        help="json: one JSON object per line (default); text: for a terminal",
    )
    return p


async def run(args: argparse.Namespace) -> int:
    import kopf

    from rtj_operator import handlers
    from rtj_operator.controller import Controller
    from rtj_operator.health import HEARTBEAT_SECONDS, HealthFacts, HealthServer
    from rtj_operator.kube import Kube
    from rtj_operator.kube_config import load_config
    from rtj_operator.leader import LeaderElector
    from rtj_operator.loop_watch import LoopWatch, log_stall
    from rtj_operator.metrics import Metrics
    from rtj_operator.settings import Settings

    log = logging.getLogger("rtj_operator")
    node_health = args.node_health
    log.info("platform node-health policy: %s", node_health)
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig  # kopf's login reads the same file
    load_config(args.kubeconfig, args.context)
    metrics = Metrics()
    kube = Kube(pool_size=max(args.api_threads * 2, 10), on_request=metrics.record_api_request)
    if args.metrics_port:
        metrics.serve(args.metrics_port, args.metrics_addr)
        log.info("serving /metrics on %s:%d", args.metrics_addr, args.metrics_port)
    facts = HealthFacts(electing=args.leader_elect, resync_seconds=args.resync_seconds)
    health = None
    if args.health_port:
        health = HealthServer(lambda: facts, args.health_port, args.health_addr).start()
        log.info("serving /healthz and /readyz on %s:%d", args.health_addr, health.port)
    running: list[Controller] = []

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    elector: LeaderElector | None = None

    async def heartbeat() -> None:
        """The facts /healthz and /readyz judge, and the operator's own gauges, each second
        from the event loop (a blocked loop stops them: that is what /healthz detects)."""
        while True:
            facts.beat_at = time.monotonic()
            facts.leading = elector.leading if elector is not None else True
            metrics.leader.set(1.0 if facts.leading and running else 0.0)
            for controller in running:
                facts.synced = controller.synced.is_set()
                facts.listed_at = controller.listed_at
                facts.dead_loops = controller.dead_loops()
                metrics.queue_depth.set(len(controller.queue))
            await asyncio.sleep(HEARTBEAT_SECONDS)

    beating = asyncio.create_task(heartbeat(), name="rtj-heartbeat")

    def stalled(seconds: float, line: str) -> None:
        metrics.loop_stall.observe(seconds)
        log_stall(seconds, line)

    watch = LoopWatch(threading.get_ident(), lambda: facts.beat_at, stalled)
    watch.start()
    if args.leader_elect:
        elector = LeaderElector(
            kube, args.lease_namespace, args.lease_name, args.identity,
            duration=args.lease_duration, renew_deadline=args.renew_deadline,
            retry=args.retry_period,
        )  # fmt: skip
        log.info("waiting to lead (lease %s/%s) as %s", args.lease_namespace, args.lease_name,
                 args.identity)  # fmt: skip
        if not await elector.acquire(stop):
            beating.cancel()
            watch.stop()
            if health is not None:
                health.close()
            return EXIT_OK

    controller = Controller(
        kube,
        metrics,
        Settings(
            workers=args.workers,
            api_threads=args.api_threads,
            resync_seconds=args.resync_seconds,
            checkpoint_refresh_seconds=args.checkpoint_refresh_seconds,
            identity=args.identity,
            operator_identity_stores=tuple(args.operator_identity_store),
            node_health=node_health,
            store_read_timeout=args.store_read_timeout,
            progress_poll_seconds=args.progress_poll_seconds,
            claim_sweep_seconds=args.claim_sweep_seconds,
            claim_sweep_grace_seconds=args.claim_sweep_grace_seconds,
            watch_node_leases=args.watch_node_leases,
            watch_events=args.watch_events,
            resolver_image=args.resolver_image,
            preflight=args.preflight,
            intervals=args.intervals,
            control_secret=_control_secret(args.control_secret_file),
        ),
        namespaces=args.namespace or None,
    )
    running.append(controller)
    settings = handlers.make_settings(
        handlers.WatchOptions(
            server_timeout=args.watch_server_timeout,
            client_timeout=args.watch_client_timeout,
            inactivity_timeout=args.watch_inactivity_timeout,
        )
    )
    handlers.quiet_kopf_loggers()

    lost = asyncio.Event()
    holder: asyncio.Task[bool] | None = None
    if elector is not None:

        async def keep_lease() -> bool:
            held = await elector.hold(stop)
            if not held:
                controller.halt()  # before anything else: a deposed leader acts no more
                lost.set()
                stop.set()
            return held

        holder = asyncio.create_task(keep_lease(), name="rtj-lease")
    try:
        await kopf.operator(
            registry=handlers.registry,
            settings=settings,
            standalone=True,
            clusterwide=not args.namespace,
            namespaces=args.namespace,
            memo=kopf.Memo(controller=controller, stop=stop),
            stop_flag=stop,
        )
    finally:
        stop.set()
        beating.cancel()
        watch.stop()
        if health is not None:
            health.close()
        await controller.stop()
        if holder is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await holder
        if elector is not None and not lost.is_set():
            await asyncio.to_thread(elector.release)
    return EXIT_LOST_LEASE if lost.is_set() else EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["run"]:  # `python -m rtj_operator run ...` reads like `rtj run ...`
        argv = argv[1:]
    args = parser().parse_args(argv)
    from rtj_operator.policy.intervals import IntervalPolicy
    from rtj_operator.policy.platform import (
        NodeHealthPolicy,
        PlatformConfigError,
        load_interval_policy,
        load_platform_config,
        load_preflight_policy,
    )
    from rtj_operator.policy.preflight import PreflightPolicy

    args.node_health, args.preflight = NodeHealthPolicy(), PreflightPolicy()
    args.intervals = IntervalPolicy()
    if args.platform_config:
        try:
            with open(args.platform_config, encoding="utf-8") as f:
                text = f.read()
            args.node_health = load_platform_config(text)
            args.preflight = load_preflight_policy(text)
            args.intervals = load_interval_policy(text)
        except (OSError, PlatformConfigError) as exc:
            print(f"rtj run: --platform-config {args.platform_config}: {exc}", file=sys.stderr)
            return EXIT_USAGE
    from rtj_operator.kube_config import KubeconfigError, load_config
    from rtj_operator.logs import configure

    try:  # at start, in one line: no credentials is a setup error, not a traceback
        load_config(args.kubeconfig, args.context)
    except KubeconfigError as exc:
        print(f"rtj run: {exc}", file=sys.stderr)
        return EXIT_USAGE
    configure(args.log_level, args.log_format)
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())


def _control_secret(path: Path | None) -> bytes | None:
    """The control secret's bytes (surrounding whitespace dropped); a file that is missing
    or too short stops the operator at start with the reason, never later."""
    if path is None:
        return None
    secret = path.read_bytes().strip()
    if len(secret) < 16:
        raise SystemExit(f"--control-secret-file {path}: expected at least 16 bytes of secret")
    return secret
