"""bench.fast_tier, section 2: restore time, a fresh Checkpointer each time (as a restarted
trainer), from the fast tier, from a buddy (the fast step copied back from the holder of its
peer replica into an empty fast tier, then restored from there: bench.fast_tier_buddy), the
durable filesystem store (page cache warm and evicted; the step the init container verified)
and S3 on the loopback moto server; and the holder's replication copy of one step."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

from bench.common import evict, timed
from bench.fast_tier_buddy import buddy as buddy_pods
from bench.fast_tier_results import (
    BUDDY,
    BUDDY_COPY,
    FAST_EVERY,
    FAST_KEEP,
    HOLDER_COPY,
    RESTORES,
    SizeResult,
    fmt_s,
)
from bench.torch_models import Trainer
from rtj_shim.checkpoint.layout import MANIFEST_FILE, step_key
from rtj_shim.checkpoint.manifest import decode_manifest
from rtj_shim.checkpoint.protocol import CommitProtocol
from rtj_shim.checkpoint.storage import open_store
from rtj_shim.fast.drain import drain_step
from rtj_shim.fast.fast_tier import FastTierConfig, holdings, rank_store
from rtj_shim.torch import Checkpointer, SaveReport
from rtj_shim.torch.options import ResumeOptions


def resume_file(path: Path, body: dict[str, Any]) -> Path:
    path.write_text(json.dumps({"skipped": [], "source": "bench.fast_tier", **body}))
    return path


@contextlib.contextmanager
def s3_server(work: Path) -> Iterator[tuple[str, Any]]:
    """The loopback moto server of the e2e tests, its credentials in this process's
    environment while it runs; yields (bucket, server)."""
    from e2e.s3server import S3Server, aws_env

    server = S3Server(work).start()
    saved = dict(os.environ)
    try:
        os.environ.update(aws_env(server.url, server.allowed))
        yield server.create_bucket(), server
    finally:
        os.environ.clear()
        os.environ.update(saved)
        server.stop()


def drain_fast_step(fast_root: Path, step: int, root: str) -> None:
    """Publish the fast step as a durable step in ``root`` (``rtj_shim.fast.drain``; this pod
    holds every rank of a world of one, so no peer is asked)."""
    raw = rank_store(fast_root, 0).read(step_key(step, MANIFEST_FILE))
    assert raw is not None, f"fast step {step} has no manifest"
    run_id = decode_manifest(raw).run_id
    protocol = CommitProtocol(open_store(root), run_id=run_id, attempt="0", retention=None)
    drain_step(fast_root, protocol, step, [], key="")


def measure_restores(
    tr: Trainer,
    result: SizeResult,
    work: Path,
    fast_root: Path,
    durable: SaveReport,
    reps: int,
    s3_root: str | None,
    buddy: bool = True,
) -> None:
    fast_held = holdings(fast_root)
    assert fast_held, "the fast tier holds no step"
    fast_step = fast_held[-1]
    durable_step = durable.step
    durable_uri = durable.uri
    pins = {
        "fast": resume_file(
            work / "resume-fast.json", {"step": durable_step, "fast_step": fast_step}
        ),
        "fs deep warm": resume_file(work / "resume-durable.json", {"step": durable_step}),
        "fs shallow warm": resume_file(
            work / "resume-verified.json",
            {"step": durable_step, "uri": durable_uri, "verification": "deep"},
        ),
    }
    pins["fs deep cold"] = pins["fs deep warm"]
    expected = {"fast": fast_step}
    kinds = [k for k in RESTORES if k not in ("s3 deep", BUDDY_COPY, BUDDY)]
    if buddy:  # one turn of the rotation each: the copy-back then the restore; the holder's copy
        kinds[1:1] = [BUDDY, HOLDER_COPY]
    if s3_root is not None:
        s3 = Checkpointer(
            s3_root,
            keep_last=FAST_KEEP,
            resume=ResumeOptions(resume_file=work / "no-resume.json", report=False),
        )
        for n in (1, 2):  # the same state twice: a new step each time (two saves timed)
            result.s3_save_s.append(timed(partial(s3.save, durable_step + n, tr.objects)))
        s3.close()
        for n in (1, 2):  # a fresh root each time: a drained step is a published one
            drain = partial(drain_fast_step, fast_root, fast_step, f"{s3_root}-drain{n}")
            result.s3_drain_s.append(timed(drain))
        pins["s3 deep"] = resume_file(work / "resume-s3.json", {"step": durable_step + 2})
        expected["s3 deep"] = durable_step + 2
        kinds.append("s3 deep")
    result.restores = {k: [] for k in RESTORES if k in kinds or (buddy and k == BUDDY_COPY)}

    def restore(kind: str, root: Any, pin: Path, fast: Path | None = None) -> float:
        tier = None if fast is None else FastTierConfig(fast, FAST_EVERY, keep=FAST_KEEP)
        resume = ResumeOptions(resume_file=pin, report=False)
        ckpt = Checkpointer(root, resume=resume, fast_tier=tier)
        if kind == "fs deep cold":
            evict([work / "durable"])
        took = timed(partial(ckpt.restore, tr.objects))
        report = ckpt.last_restore
        assert report is not None
        want = expected.get(kind, durable_step)
        if report.step != want or (kind in ("fast", BUDDY)) != (report.source == "fast-tier"):
            raise RuntimeError(f"restore {kind}: got step {report.step} from {report.source}")
        ckpt.close()
        return took

    expected[BUDDY] = fast_step
    with contextlib.ExitStack() as stack:
        pods = stack.enter_context(buddy_pods(fast_root, fast_step)) if buddy else None
        for rep in range(reps):
            order = kinds[rep % len(kinds) :] + kinds[: rep % len(kinds)]
            for kind in order:
                if kind == HOLDER_COPY:
                    assert pods is not None
                    result.replica_copy_s.append(timed(pods.replicate))
                    pods.reset_replica()  # untimed: the next copy starts from an empty one
                elif kind == BUDDY:
                    assert pods is not None
                    dest = pods.new_tier(rep)
                    copied = timed(partial(pods.copy_back, dest))
                    result.buddy_bytes = pods.last_bytes
                    took = restore(BUDDY, work / "durable", pins["fast"], fast=dest)
                    shutil.rmtree(dest)  # untimed: the replaced pod's tier goes
                    result.restores[BUDDY_COPY].append(copied)
                    result.restores[BUDDY].append(copied + took)
                else:
                    root: Any = s3_root if kind == "s3 deep" else work / "durable"
                    fast = fast_root if kind == "fast" else None
                    result.restores[kind].append(restore(kind, root, pins[kind], fast))
            holder = f", holder's copy {fmt_s(result.replica_copy_s[-1])}" if buddy else ""
            print(
                f"  restore {rep + 1}: "
                + ", ".join(f"{k} {fmt_s(v[-1])}" for k, v in result.restores.items())
                + f"{holder}; load {os.getloadavg()[0]:.2f}"
            )
