"""``python -m e2e.podrunner --kubeconfig K --root DIR [--nodes 3]``: run until SIGTERM."""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path
from types import FrameType

from .runner import NODE_PREFIX, PodRunner


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--root", required=True, type=Path, help="per-pod directories and logs")
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--gpus", type=int, default=8, help="nvidia.com/gpu capacity per node")
    p.add_argument("--prefix", default=NODE_PREFIX, help="node name prefix")
    p.add_argument("--workdir", type=Path, default=Path.cwd(), help="the 'image' filesystem")
    args = p.parse_args()
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    runner = PodRunner(
        args.kubeconfig,
        args.root.resolve(),
        nodes=args.nodes,
        gpus=args.gpus,
        workdir=args.workdir.resolve(),
        prefix=args.prefix,
    )
    thread = threading.Thread(target=runner.run, args=(stop,), daemon=True)
    thread.start()
    while thread.is_alive() and not stop.wait(0.5):
        pass
    stop.set()
    runner.shutdown()  # the watch thread is a daemon: it may be blocked in a read
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
