"""bench.fast_tier's report: the summary, the stall and restore tables, the lost-steps
tables with their arithmetic, as Markdown (and the tables printed at the end of a run)."""

from __future__ import annotations

from typing import Any

from bench.common import MiB, med, p90
from bench.fast_tier_example import example_lines
from bench.fast_tier_lost import (
    contention_s,
    durable_options,
    fast_floor,
    lost_rows,
    practical_interval,
)
from bench.fast_tier_results import (
    BUDDY,
    BUDDY_COPY,
    FAST_EVERY,
    FAST_KEEP,
    LABELS,
    METHODS,
    RESTORE_LABELS,
    RESTORES,
    SizeResult,
    fmt_bytes,
    fmt_s,
)
from bench.torch_models import BATCH


def stall_table(results: list[SizeResult]) -> list[str]:
    out = [
        "| model (state) | method | median | p90 | % of one step | vs torch.save |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        step = r.step_median
        base = med(r.stalls["torch.save"])
        out.append(
            f"| {r.label} ({fmt_bytes(r.state_bytes)}) | one training step (no save) | "
            f"{fmt_s(step)} | {fmt_s(p90(r.step_s))} | 100% | - |"
        )
        for m in METHODS:
            xs = r.stalls[m]
            out.append(
                f"| | {LABELS[m]} | {fmt_s(med(xs))} | {fmt_s(p90(xs))} | "
                f"{100 * med(xs) / step:.1f}% | {med(xs) / base:.2f}x |"
            )
            if m == "fast" and r.fast_cost:
                cost = r.fast_cost_s
                out.append(
                    f"| | {COST_LABEL} | {fmt_s(med(cost))} | {fmt_s(p90(cost))} | "
                    f"{100 * med(cost) / step:.1f}% | {med(cost) / base:.2f}x |"
                )
    return out


COST_LABEL = (
    "fast tier, its whole cost to training: the saving step_boundary and the steps trained "
    "while it is written, less as many plain steps"
)


def restore_table(results: list[SizeResult]) -> list[str]:
    out = [
        "| model (state) | restore from | median | p90 | vs durable fs (deep, warm) |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        base = med(r.restores["fs deep warm"])
        first = True
        for kind in RESTORES:
            xs = r.restores.get(kind)
            if not xs:
                continue
            model = f"{r.label} ({fmt_bytes(r.state_bytes)})" if first else ""
            first = False
            out.append(
                f"| {model} | {RESTORE_LABELS[kind]} | {fmt_s(med(xs))} | {fmt_s(p90(xs))} | "
                f"{med(xs) / base:.2f}x |"
            )
    return out


def mib_per_s(nbytes: float, seconds: float) -> str:
    return f"{nbytes / MiB / seconds:.0f} MiB/s" if seconds > 0 else "-"


def buddy_table(results: list[SizeResult]) -> list[str]:
    """The peer replica's two copies of one fast step, per model: the holder's replication
    and the replaced pod's copy-back, each with its rate."""
    out = [
        "| model (state) | a step's shards | holder's copy (`ReplicaPuller.pull_once`), "
        "median | p90 | rate | copy-back (`fetch_back`), median | p90 | rate | the restore "
        "after it (median of copy-back + restore, less the copy-back's) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        copy, back = r.replica_copy_s, r.restores.get(BUDDY_COPY)
        if not copy or not back:
            continue
        after = med(r.restores[BUDDY]) - med(back)
        out.append(
            f"| {r.label} ({fmt_bytes(r.state_bytes)}) | {fmt_bytes(r.buddy_bytes)} | "
            f"{fmt_s(med(copy))} | {fmt_s(p90(copy))} | {mib_per_s(r.buddy_bytes, med(copy))} | "
            f"{fmt_s(med(back))} | {fmt_s(p90(back))} | {mib_per_s(r.buddy_bytes, med(back))} | "
            f"{fmt_s(after)} |"
        )
    return out


def lost_table(results: list[SizeResult], budget: float | None, save_every: int,
               fast_every: int) -> list[str]:  # fmt: skip
    out = [
        "| model (step) | durable tier | every M | overhead | lost steps per failure, "
        "alone | + fast every K | overhead, both | lost steps, failure the pod survives | "
        "lost work | lost steps, node loss |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for i, row in enumerate(lost_rows(r, budget, save_every, fast_every)):
            model = f"{r.label} ({fmt_s(r.step_median)})" if i == 0 else ""
            both = row.overhead + row.fast_overhead
            out.append(
                f"| {model} | {row.durable} | {row.durable_every} | "
                f"{100 * row.overhead:.2f}% | {row.lost_alone:g} | K = {row.fast_every} | "
                f"{100 * both:.2f}% | {row.lost_with_fast:g} | "
                f"{fmt_s(row.lost_alone * row.step_s)} → "
                f"{fmt_s(row.lost_with_fast * row.step_s)} | {row.lost_alone:g} |"
            )
    return out


def arithmetic_text(results: list[SizeResult], budget: float) -> list[str]:
    out = []
    for r in results:
        step = r.step_median
        fast = med(r.stalls["fast"])
        floor = fast_floor(r)
        k = practical_interval(fast, step, budget, floor)
        written = f", at least {floor} (its background write)" if floor > 1 else ""
        terms = [
            f"fast K = ⌈{fmt_s(fast)} / ({budget:.0%} x {fmt_s(step)})⌉{written} = {k}"
        ]  # fmt: skip
        gains = []
        for name, cost, floor in durable_options(r):
            m = practical_interval(cost, step, budget, floor)
            floor_text = f", at least {floor} (publish)" if floor > 1 else ""
            terms.append(f"{name} M = ⌈{fmt_s(cost)} / ({budget:.0%} x {fmt_s(step)})⌉"
                         f"{floor_text} = {m}")  # fmt: skip
            if k < m:
                gains.append(f"{name}: {m / 2:g} → {k / 2:g}")
        verdict = (
            "the fast tier lowers the expected loss of a failure the pod survives beside "
            + "; ".join(gains)
            if gains
            else "K is no shorter than any durable M: the fast tier saves no steps here"
        )
        out.append(f"- {r.label}, step {fmt_s(step)}: " + "; ".join(terms) + f". So {verdict}.")
    return out


def summary_table(results: list[SizeResult]) -> list[str]:
    out = [
        "| model (state) | step | fast-tier stall | ÷ durable blocking | ÷ durable async "
        "stall | ÷ torch.save | fast restore | ÷ durable fs (deep, warm) | ÷ S3 | buddy: "
        "copy-back + restore | buddy ÷ S3 | holder's copy | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        fast = med(r.stalls["fast"])
        restore = med(r.restores["fast"])
        s3 = r.restores.get("s3 deep")
        buddy = r.restores.get(BUDDY)
        buddy_cells = "- | - | -"
        if buddy:
            ratio = "-" if not s3 else f"{med(buddy) / med(s3):.2f}x"
            buddy_cells = f"{fmt_s(med(buddy))} | {ratio} | {fmt_s(med(r.replica_copy_s))}"
        out.append(
            f"| {r.label} ({fmt_bytes(r.state_bytes)}) | {fmt_s(r.step_median)} | "
            f"{fmt_s(fast)} | {fast / med(r.stalls['durable']):.2f}x | "
            f"{fast / med(r.stalls['durable async']):.2f}x | "
            f"{fast / med(r.stalls['torch.save']):.2f}x | {fmt_s(restore)} | "
            f"{restore / med(r.restores['fs deep warm']):.2f}x | "
            f"{'-' if not s3 else f'{restore / med(s3):.2f}x'} | {buddy_cells} | "
            f"{r.load[0]:.2f} → {r.load[1]:.2f} |"
        )
    return out


def markdown(results: list[SizeResult], context: dict[str, Any]) -> str:
    loads = context.get("loadavg_start", ()), context.get("loadavg_end", ())
    start, end = (" ".join(f"{x:.2f}" for x in values) for values in loads)
    budget, save_every = context["budget"], context["save_every"]
    fast_every = context["fast_every"]
    s3 = context.get("s3")
    buddy = context.get("buddy")
    out = [
        "# Fast checkpoint tier benchmark (issue 16)",
        "",
        f"`python -m bench.fast_tier`: one process (world size 1), CPU, {context['cpus']} CPUs "
        f"({context['threads']} torch threads), torch {context['torch']}, Python "
        f"{context['python']}. Load average at start {start}, at end {end}; "
        f"{context.get('started', '?')} to {context.get('ended', '?')} UTC.",
        "",
        f"The model is the example trainer's (`examples/ddp_train.py` `make_model`, AdamW, "
        f"LambdaLR), a fixed batch of {BATCH}. Fast tier: `{context['fast_dir']}` "
        f"({context['fast_fs']}), `fast_every_steps={FAST_EVERY}`, `fast_keep={FAST_KEEP}`. "
        f"Durable store and `torch.save` files: `{context['durable_dir']}` "
        f"({context['durable_fs']}, local disk). {context['rounds']} timed rounds after one "
        f"untimed warm-up, every method once a round, the order rotated; "
        f"{context['restore_reps']} restores of each kind. p90 is the nearest rank (with "
        "fewer than 10 samples, the largest).",
        "",
        "## Summary",
        "",
        "Medians; the load column is the 1-minute load average before and after the model's "
        "measurements (other work shares this machine).",
        "",
        *summary_table(results),
        "",
        *example_lines(
            (context.get("example") or {}).get("runs", []),
            int((context.get("example") or {}).get("steps", 0)),
        ),
        "## 1. Training-thread stall per save",
        "",
        "Fast tier: what the training thread spends on a fast save "
        "(`Checkpointer.fast_tier.last.stall`): reading the objects' state and copying what "
        "the next forward and backward may change (module buffers, plain values, samplers, "
        "RNGs), in the `step_boundary` that saves, plus the fence's wait at the next "
        "`optimizer.step()` if the writer thread had not yet planned the files and copied "
        "the tensors. The walk of the state, the plan, the copies of the optimizer-owned "
        "tensors, the serialization with SHA-256 into tmpfs, manifest, COMMITTED, rename and "
        "retention run on the writer thread. Durable async: the "
        "`save()` call plus the wait for staging at the next `optimizer.step()` "
        "(`SaveReport.stall_seconds`).",
        "",
        "The stall is not all a fast save costs. Its writer thread's Python work (pickling, "
        "the manifest, the commit, retention) holds the GIL the training thread needs, so "
        "the steps trained while it is written are slower: the row 'its whole cost to "
        "training' adds that slowdown (the saving `step_boundary` less a non-saving one, "
        "plus the steps trained until the step is published, less as many median plain "
        "steps). For a trainer whose Python thread is its bottleneck (a GPU trainer "
        "launching kernels is one) that row, not the stall, is the fast tier's overhead. For "
        "the large states here it also counts the writer's hashing and copying (GIL "
        "released) competing for the two cores this CPU trainer's two torch threads use: a "
        "GPU node's spare cores would absorb that part.",
        "",
        *stall_table(results),
        "",
    ]
    for r in results:
        out.append(
            f"- {r.label}: non-saving `step_boundary` {fmt_s(med(r.boundary_idle_s))}; "
            f"a fast step published {fmt_s(med(r.fast_written_s))} after its `step_boundary` "
            f"(p90 {fmt_s(p90(r.fast_written_s))}); "
            f"durable async published {fmt_s(med(r.async_published_s))} after the call "
            f"(p90 {fmt_s(p90(r.async_published_s))}), while training went on for "
            f"{med([n for n, _ in r.async_overlap]):g} step(s) that took "
            f"{fmt_s(contention_s(r))} longer than as many plain steps (the background save "
            f"shares the two cores). The fast tier holds steps {r.fast_held_steps}: "
            f"{fmt_bytes(r.fast_held_bytes)} of tmpfs ({fmt_bytes(r.fast_step_bytes)} a step; "
            f"a durable step is {fmt_bytes(r.durable_step_bytes)}); while a save runs, before "
            f"retention removes the oldest, it holds {FAST_KEEP + 1}."
        )
    out += [
        "",
        "## 2. Restore time",
        "",
        "A fresh `Checkpointer` each time (as a restarted trainer), `restore()` of the "
        "newest step into the live model, optimizer and scheduler. The fast tier is always "
        "in memory (tmpfs); the durable filesystem restore twice, with the step's pages in "
        "the page cache and evicted (`posix_fadvise(DONTNEED)`). "
        + (f"S3: {s3}." if s3 else "S3: not measured in this run (`--no-s3`).")
        + (
            " From a buddy (the fast tier's peer replica, below): the same fast step copied "
            "back from a holder pod's replica into an empty fast tier, then restored from "
            "there as from the fast tier; one turn of the rotation times both."
            if buddy
            else " From a buddy: not measured in this run (`--no-buddy`)."
        ),
        "",
        *restore_table(results),
        "",
    ]
    if any(r.s3_save_s for r in results):
        out.append(
            "Durable blocking saves to that S3 server (the two that put the restored steps "
            "there): "
            + "; ".join(
                f"{r.label} {', '.join(fmt_s(x) for x in r.s3_save_s)}"
                for r in results
                if r.s3_save_s
            )
            + "."
        )
        out.append("")
    if any(r.s3_drain_s for r in results):
        out.append(
            "The newest fast step drained into that S3 server (`rtj_shim.fast.drain`: its files "
            "read from the fast tier, hashed while uploaded, checked against its manifest, one "
            "publish under the commit protocol; a world of one, so every file is this pod's; "
            "a fresh root each time): "
            + "; ".join(
                f"{r.label} {', '.join(fmt_s(x) for x in r.s3_drain_s)}"
                for r in results
                if r.s3_drain_s
            )
            + ". No training step waits for it: the drain runs beside the trainer (issue 16)."
        )
        out.append("")
    if buddy:
        out += [
            "### From a buddy: the peer replica's copies",
            "",
            f"Three pods of one job on this machine: {buddy}. The *source* is this process's "
            "trainer, its fast tier the one of section 1 (newest step as in the fast-tier "
            "row). A *holder*'s sidecar keeps a replica of that step in its own fast tier "
            "(`<fast dir>/peer/rank-00000/...`, copied once from the source's sidecar with "
            "`peer_pull.copy_step` before the timings). The *replaced* pod (the source's, "
            "re-created on another node) starts with an empty fast tier: its sidecar's "
            "`fetch_back` copies the step back from the holder's sidecar (the holdings, the "
            "manifest, each shard streamed into a new step directory under the commit "
            "protocol, SHA-256 as written, checked against the manifest, then the same "
            "manifest and COMMITTED published), then the trainer restores from there as from "
            "the fast tier (deep-verified again). The holder's copy is the replication itself: "
            "`ReplicaPuller.pull_once` against the source's sidecar (holdings, the same copy, "
            "then the replica's retention) into an empty replica (emptied after each copy, "
            "untimed). "
            "Everything in tmpfs (pod memory), over loopback HTTP: no network between nodes, "
            "and the sender and the receiver share these two cores. World size 1: one rank, "
            "so one copy stream (`peer_pull` copies up to `COPY_STREAMS` = 4 ranks of a pod "
            f"at once). Medians and p90 of the {context['restore_reps']} repetitions of the "
            "restore rotation; a rate is the step's shards over the median.",
            "",
            *buddy_table(results),
            "",
        ]
    out += [
        "## 3. Lost steps per failure",
        "",
        "A failure loses, on average, half the interval of the tier the job resumes from "
        "(it falls uniformly between two saves), plus the restore of section 2. With both "
        "tiers, a failure the pod survives (a process crash, an in-place restart) resumes "
        "from the newer step of the two, so it loses min(K, M) / 2; a node loss takes the "
        "pod's memory and still loses M / 2. A tier's overhead is its cost per save (the "
        "medians of section 1) over the training time of its interval. Durable tiers: the "
        "blocking save to the local filesystem; to S3 (the blocking saves of section 2, "
        "n = 2); the async save counted by its stall alone (a GPU trainer, whose steps do "
        "not wait for the cores the background save uses) and counted with the training "
        "time it took from the steps it overlapped on these two cores (this CPU trainer). "
        "An async interval is at least the steps one save takes to publish (the next save "
        "waits for it); a fast interval at least the steps one fast save takes to be written "
        "(the next one due meanwhile is skipped). The fast tier's overhead here is its stall; "
        "its background write shares the cores as the async durable save's does (on this CPU "
        "trainer that costs what the async row 'stall + the CPU it takes' shows, per byte).",
        "",
        f"### Each tier at its practical interval: overhead at most {budget:.0%}",
        "",
        f"`interval = ⌈cost / ({budget:.0%} x step)⌉`.",
        "",
        *lost_table(results, budget, save_every, fast_every),
        "",
        *arithmetic_text(results, budget),
        "",
        f"### The example trainer's interval: durable every {save_every}, fast every {fast_every}",
        "",
        f"`examples/ddp_train.py --save-every {save_every}` (an async interval no shorter "
        f"than its publish), the fast tier every {fast_every} steps beside it.",
        "",
        *lost_table(results, None, save_every, fast_every),
        "",
        "2 ranks (gloo) were not run: a fast save has no collective (each rank writes its "
        "own copy into its own directory), so on this 2-core machine a second rank would "
        "only measure the two ranks' contention for the cores.",
    ]
    notes = [n for r in results for n in r.notes]
    if notes:
        out += ["", *notes]
    return "\n".join(out) + "\n"


def print_summary(results: list[SizeResult]) -> None:
    print()
    for line in [*stall_table(results), "", *restore_table(results), "", *buddy_table(results)]:
        print(line)
