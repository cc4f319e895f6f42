"""bench.checkpoint_protocol, section 5: ``publish_directory`` into an ``S3Store`` on the
loopback S3 server against boto3's ``upload_file`` of the same files, each run a child
process that reports its own time, CPU and peak RSS; the server's CPU read from /proc."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.checkpoint_protocol_report import Report, Row, fmt_s, fmt_size
from bench.checkpoint_protocol_sources import Shape
from bench.checkpoint_protocol_timing import RUN_LOG, busy_note
from bench.common import REPO, KiB, MiB, loadavg_text, med, quiesce
from rtj_shim.checkpoint.storage.s3_upload import DEFAULT_CONCURRENCY, DEFAULT_PART_BYTES

S3_CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path

    mode, bucket, prefix, source, part, concurrency = sys.argv[1:7]
    part, concurrency = int(part), int(concurrency)

    def hwm():
        with open("/proc/self/status") as fh:
            return [int(line.split()[1]) for line in fh if line.startswith("VmHWM:")][0]

    if mode == "publish":
        from rtj_shim.checkpoint.protocol import CommitProtocol
        from rtj_shim.checkpoint.storage.s3 import S3Store

        store = S3Store(bucket, prefix, part_size=part, concurrency=concurrency)
        protocol = CommitProtocol(store, run_id="bench-s3", attempt="0", retention=None)
        protocol.claim_run()
        run = lambda: protocol.publish_directory(1, Path(source))
    else:
        import boto3
        from boto3.s3.transfer import TransferConfig

        client = boto3.session.Session().client("s3")
        config = TransferConfig(
            multipart_threshold=part + 1,  # as S3Store: one PUT up to a part's size
            multipart_chunksize=part,
            max_concurrency=concurrency,
        )
        files = sorted(Path(source).iterdir())

        def run():
            for path in files:
                client.upload_file(str(path), bucket, f"{prefix}/{path.name}", Config=config)

    before = hwm()
    cpu = time.process_time()
    start = time.perf_counter()
    run()
    took = time.perf_counter() - start
    out = {"seconds": took, "cpu": time.process_time() - cpu, "hwm_before": before}
    out["hwm_after"] = hwm()
    print(json.dumps(out))
    """
)


def proc_cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class S3Run:
    seconds: float
    cpu: float  # the client process, all threads
    server_cpu: float
    hwm_growth_mib: float  # peak RSS growth of the client while it uploaded


def run_s3_child(
    mode: str, env: dict[str, str], bucket: str, prefix: str, source: Path, server_pid: int
) -> S3Run:
    quiesce()
    server_before = proc_cpu_seconds(server_pid)
    args = [mode, bucket, prefix, str(source), str(DEFAULT_PART_BYTES), str(DEFAULT_CONCURRENCY)]
    proc = subprocess.run(
        [sys.executable, "-c", S3_CHILD, *args],
        capture_output=True,
        cwd=REPO,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        tail = proc.stderr.decode(errors="replace")[-2000:]
        raise RuntimeError(f"S3 child ({mode}) exited {proc.returncode}: {tail}")
    out = json.loads(proc.stdout)
    return S3Run(
        float(out["seconds"]),
        float(out["cpu"]),
        proc_cpu_seconds(server_pid) - server_before,
        (out["hwm_after"] - out["hwm_before"]) * KiB / MiB,
    )


def delete_prefix(client: Any, bucket: str, prefix: str) -> None:
    """Everything under ``prefix`` (and unfinished uploads), so the server frees it."""
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})


def bench_s3(report: Report, work: Path, sources: list[tuple[Shape, Path]], reps: int) -> None:
    from e2e.s3server import S3Server, aws_env

    RUN_LOG.clear()
    print(
        f"\n[5] S3 (loopback moto server): publish vs boto3 upload_file, part size "
        f"{fmt_size(DEFAULT_PART_BYTES)}, {DEFAULT_CONCURRENCY} parts at once, {reps} rep(s)"
    )
    print(f"  load average now: {loadavg_text()}")
    server = S3Server(work).start()
    try:
        env = {**os.environ, **aws_env(server.url, server.allowed)}
        admin = server.client()
        bucket = server.create_bucket()
        run = 0
        for shape, source in sources:
            results: dict[str, list[S3Run]] = {"upload_file": [], "publish": []}
            for rep in range(reps):
                order = ("upload_file", "publish") if rep % 2 == 0 else ("publish", "upload_file")
                for mode in order:
                    run += 1
                    prefix = f"run-{run}"
                    got = run_s3_child(mode, env, bucket, prefix, source, server.pid)
                    delete_prefix(admin, bucket, prefix)
                    results[mode].append(got)
                    print(
                        f"  {shape.text:12s} rep {rep + 1} {mode:11s} "
                        f"{fmt_s(got.seconds, shape.total)}; client cpu {got.cpu:.2f} s, "
                        f"server cpu {got.server_cpu:.2f} s, peak RSS +{got.hwm_growth_mib:.0f} MiB"
                    )
            add_s3_row(report, shape, results)
        report.context["s3_server"] = "moto (e2e.s3server), auth enforced, on this machine"
    finally:
        server.stop()
    busy_note(report, "publish-s3")


def add_s3_row(report: Report, shape: Shape, results: dict[str, list[S3Run]]) -> None:
    def summary(runs: list[S3Run]) -> tuple[float, str]:
        seconds = med([r.seconds for r in runs])
        text = (
            f"{fmt_s(seconds, shape.total)}, client cpu {med([r.cpu for r in runs]):.2f} s, "
            f"server cpu {med([r.server_cpu for r in runs]):.2f} s, "
            f"RSS +{max(r.hwm_growth_mib for r in runs):.0f} MiB"
        )
        return seconds, text

    cand, cand_text = summary(results["publish"])
    base, base_text = summary(results["upload_file"])
    for name, runs in results.items():
        report.samples[f"publish-s3.{shape.tag}.{name}"] = [r.seconds for r in runs]
    report.add(
        Row(
            "5 publish-s3",
            f"publish_directory to S3, {shape.text} vs boto3 upload_file",
            cand_text,
            base_text,
            cand / base,
            "time",
            "(report)",
            None,
            {
                "candidate_s": cand,
                "baseline_s": base,
                "bytes": shape.total,
                "runs": {k: [asdict(r) for r in v] for k, v in results.items()},
            },
        )
    )
