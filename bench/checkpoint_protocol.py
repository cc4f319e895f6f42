"""What the checkpoint protocol costs, against a plain durable copy (or upload) of the same bytes.

Everything runs side by side on the same bytes, in a temporary directory under
``<repo>/.bench/`` (the repository's filesystem, git-ignored), removed afterwards. A step
comes in three shapes: 1 file of 4 GiB (one rank's ``torch.save``, or the one ``.distcp``
file per rank that ``torch.distributed.checkpoint`` writes), 8 files of 128 MiB and 64
files of 16 MiB.

1. publish, filesystem: ``CommitProtocol.publish_directory`` (hash while writing, fsync,
   manifest, COMMITTED, rename) of each shape against ``shutil.copyfile`` + fsync of every
   file and of the directory; target <= 1.3x for every shape.
2. deep verification: ``verify_step(..., Depth.DEEP, workers=2)`` (and workers=1) of the
   8 x 128 MiB step against single-threaded ``hashlib.sha256``; target >= 1.7x (2 workers).
3. fixed commit cost: ``StepWriter.commit`` (manifest + COMMITTED + rename + directory
   fsyncs) of a step whose 8 tiny shards are already written; target < 5 ms (median).
   Also: the whole publish of a 1-file tiny step.
4. peak memory: a child process publishing the 4 GiB file; target < 100 MiB above what it
   held before publishing (the filesystem path holds one mapped chunk of 8 MiB).
5. publish, S3: ``publish_directory`` into an ``S3Store`` on the loopback S3 server (moto,
   :mod:`e2e.s3server`, authentication enforced) against boto3's ``upload_file`` of every
   file with the same part size and concurrency. Each run is a child process that reports
   its own time, CPU and peak RSS; the server's CPU is read from /proc. Reported, no
   target: the server (Python, on the same cores) bounds both sides.

Each line prints absolute numbers, the ratio to its baseline, the target, PASS/MISS and
the load average. A miss never fails the run; only an error exits non-zero.

    python -m bench.checkpoint_protocol [--quick] [--reps 3] [--s3-reps 1] [--no-s3]
        [--sections fs,verify,commit,memory,s3] [--json FILE] [--markdown FILE]

This module runs the sections and writes the table: sections 1 and 2 are
bench.checkpoint_protocol_fs, 3 and 4 bench.checkpoint_protocol_commit, 5
bench.checkpoint_protocol_s3; the shapes and their files bench.checkpoint_protocol_sources,
the timing on a shared machine bench.checkpoint_protocol_timing, the rows and the table
bench.checkpoint_protocol_report.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import traceback
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from bench.checkpoint_protocol_commit import bench_commit, bench_memory
from bench.checkpoint_protocol_fs import bench_fs_publish, bench_verify, step_dir
from bench.checkpoint_protocol_report import Report, fmt_load, markdown, print_table
from bench.checkpoint_protocol_s3 import bench_s3
from bench.checkpoint_protocol_sources import QUICK_SHAPES, SHAPES, make_sources, rmtree
from bench.checkpoint_protocol_timing import machine_context, print_context
from bench.common import BENCH_DIR
from rtj_shim.checkpoint.storage.filesystem import FilesystemStore

VERIFY_SHAPE = 1  # index of the shape whose published step section 2 verifies
SECTIONS = ("fs", "verify", "commit", "memory", "s3")

METHOD_TEXT = """\
Method
  Sources are written once, fsynced, and read once: every method reads the same warm page
  cache. Before each timed run: os.sync() (no run pays for another's writeback) and, for the
  large copies, the free memory the run will fill is touched first (a VM that returns freed
  memory to its host otherwise makes a random run pay host page faults). Destinations
  are removed between runs, untimed. Runs are interleaved (baseline, candidate, baseline,
  ...), the order reversed on every other repetition; the table shows medians. 'others' is
  the CPU that other processes and kernel threads used during a run (a busy machine shows)."""


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.checkpoint_protocol",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("--quick", action="store_true", help="small shapes for a smoke run")
    parser.add_argument(
        "--reps", type=int, default=3, help="repetitions of each filesystem measurement (3)"
    )
    parser.add_argument(
        "--s3-reps", type=int, default=1, help="repetitions of each S3 measurement (1)"
    )
    parser.add_argument("--no-s3", action="store_true", help="skip the S3 section")
    parser.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help=f"comma-separated subset of {','.join(SECTIONS)} (default: all)",
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write results as JSON")
    parser.add_argument("--markdown", type=Path, metavar="FILE", help="also write a Markdown table")
    args = parser.parse_args(argv)
    if args.reps < 1 or args.s3_reps < 1:
        parser.error("--reps and --s3-reps must be at least 1")
    args.sections = {x.strip() for x in args.sections.split(",") if x.strip()}
    if args.no_s3:
        args.sections.discard("s3")
    if not args.sections or args.sections - set(SECTIONS):
        parser.error(f"--sections: choose from {','.join(SECTIONS)}")
    return args


def run(args: argparse.Namespace, report: Report) -> None:
    shapes = QUICK_SHAPES if args.quick else SHAPES
    commit_reps = 10 if args.quick else 50
    BENCH_DIR.mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="checkpoint-protocol-", dir=BENCH_DIR))
    try:
        report.context = machine_context(work)
        report.context.update(
            {
                "quick": args.quick,
                "shapes": [asdict(s) for s in shapes],
                "reps": args.reps,
                "s3_reps": args.s3_reps,
                "commit_reps": commit_reps,
            }
        )
        print_context(report.context)
        print(METHOD_TEXT)
        needs_sources = args.sections - {"commit"}
        sources = make_sources(report, work, shapes) if needs_sources else []
        verify_source: tuple[FilesystemStore, int, list[Path]] | None = None
        for shape, source in sources:
            if "fs" not in args.sections and not (
                "verify" in args.sections and shape == shapes[VERIFY_SHAPE]
            ):
                continue
            files = sorted((p.name, p) for p in source.iterdir())
            store, step = bench_fs_publish(report, work, shape, files, args.reps)
            if shape == shapes[VERIFY_SHAPE]:
                verify_source = (store, step, [step_dir(store, step) / rel for rel, _ in files])
            else:
                rmtree(store.root)
        if verify_source is not None:
            if "verify" in args.sections:
                bench_verify(report, *verify_source, reps=args.reps)
            rmtree(verify_source[0].root)
        if "commit" in args.sections:
            bench_commit(report, work, commit_reps)
        largest = [(shape, source) for shape, source in sources if shape == shapes[0]]
        for shape, source in largest if "memory" in args.sections else []:
            bench_memory(report, work, shape, source)
        if "s3" in args.sections:
            bench_s3(report, work, sources, args.s3_reps)
        report.context["loadavg_end"] = os.getloadavg()
    finally:
        rmtree(work)
        with contextlib.suppress(OSError):
            BENCH_DIR.rmdir()  # only if nothing else lives there


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    report = Report()
    try:
        run(args, report)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception:
        traceback.print_exc()
        print("checkpoint_protocol bench: error (not a target miss)", file=sys.stderr)
        return 1
    print_table(report)
    end = report.context.get("loadavg_end")
    if end:
        print("load average at end: " + fmt_load(end))
    if args.json:
        body = {
            "context": report.context,
            "rows": [asdict(r) | {"result": report.result(r)} for r in report.rows],
            "samples": report.samples,
            "notes": report.notes,
            "busy_sections": sorted(report.busy),
        }
        args.json.write_text(json.dumps(body, indent=2, default=str) + "\n")
        print(f"wrote {args.json}")
    if args.markdown:
        args.markdown.write_text(markdown(report))
        print(f"wrote {args.markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
