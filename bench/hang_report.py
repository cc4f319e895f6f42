"""The hang-detection bench's figures and its markdown report."""

from __future__ import annotations

from typing import Any

from bench.scale_probes import percentile


def summarize(rounds: list[dict[str, Any]], pods: int, interval: float) -> dict[str, float]:
    """Round figures of the poller (the rounds with silent pods apart)."""
    steady = [r for r in rounds if r["scenario"] != "silent"] or rounds
    seconds, cpu = [r["seconds"] for r in steady], [r["cpu"] for r in steady]
    p50_cpu, p50_s = percentile(cpu, 0.5), percentile(seconds, 0.5)
    return {"rounds": len(steady), "round_p50_s": p50_s, "round_p99_s": percentile(seconds, 0.99),
            "fetch_p50_s": percentile([r["fetch_s"] for r in steady], 0.5),
            "cpu_p50_s": p50_cpu, "cpu_p99_s": percentile(cpu, 0.99),
            "cpu_per_pod_us": 1e6 * p50_cpu / pods,
            "core_percent": 100 * p50_cpu / (p50_s + interval),
            "decisions_p50_s": percentile([sum(r["decide"].values()) for r in steady], 0.5),
            "generator_cpu_p50_s": percentile([r["generator_cpu"] for r in steady], 0.5),
            "answered_min": min(r["answered"] for r in steady),
            "load_min": min(r["load1"] for r in rounds),
            "load_max": max(r["load1"] for r in rounds)}  # fmt: skip


def _table(head: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return out + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows] + [""]


def poller_section(a: dict[str, Any], p: dict[str, Any]) -> list[str]:
    s, rounds = p["summary"], p["rounds"]
    rss = [r["rss_mib"] for r in rounds]
    decide = ", ".join(f"`{k}` {1e3 * percentile([r['decide'][k] for r in rounds], 0.5):.0f} ms"
                       for k in rounds[0]["decide"])  # fmt: skip
    lines = [f"## 1. The poller at scale: {a['pods']} pods x 8 ranks, one job", "",
             f"`RankPolls.poll_once` (real HTTP, 16 threads, 2 s timeout), {a['interval']:g} s "
             "between rounds (`RankPolls.run` sleeps after each), against one asyncio process "
             f"serving {a['pods']} loopback addresses (127.3.x.y:{p['port']}) with the product's "
             f"`rank_json` of simulated ranks ({a['step_seconds']:g} s steps in 5 sections). "
             "Not simulated: kubelets, pod networking, the network between nodes, the trainers; "
             "the stand-in sidecars share this machine's cores with the poller.", ""]  # fmt: skip
    lines += _table(["figure", "value"], [
        ["rounds (without silent pods)", s["rounds"]],
        ["round duration p50 / p99", f"{s['round_p50_s']:.2f} s / {s['round_p99_s']:.2f} s"],
        ["of it, until the last answer (HTTP, JSON in 16 threads), p50",
         f"{s['fetch_p50_s']:.2f} s (the rest: `stragglers`, on the event loop)"],
        ["real period p50 (round + sleep)", f"{s['round_p50_s'] + a['interval']:.2f} s"],
        ["poller CPU per round p50 / p99 (fetch threads, JSON, stragglers)",
         f"{s['cpu_p50_s']:.2f} / {s['cpu_p99_s']:.2f} cpu-s"],
        ["poller CPU per pod per round; share of one core",
         f"{s['cpu_per_pod_us']:.0f} µs; {s['core_percent']:.0f}%"],
        [f"decisions after each round, p50 ({decide})", f"{1e3 * s['decisions_p50_s']:.0f} ms"],
        ["`stragglers` CPU per round (in poll_once, on the event loop) by pods", ", ".join(
            f"{n}: {v:.3f} s" for n, v in p["straggler_cost"].items())],
        ["the load generator's CPU per round (not the operator's)",
         f"{s['generator_cpu_p50_s']:.2f} cpu-s"],
        ["pods answered per round (min)", f"{s['answered_min']} of {a['pods']}"],
        ["RSS before round 1 / after it / max / at the end", f"{p['rss_start_mib']:.0f} / "
         f"{rss[0]:.0f} / {max(rss):.0f} / {rss[-1]:.0f} MiB ({len(rss)} rounds)"],
        ["verdicts while no rank was frozen", p["false_verdicts"]],
        ["load average (1 min) during the rounds", f"{s['load_min']:.1f} to {s['load_max']:.1f}"],
    ])  # fmt: skip
    lines += ["Freeze to the first `hang_verdict` (a rank stops mid-`forward`, the others block "
              "in the next `allreduce`); expected: the allowance, less the time the rank was "
              "already in `forward`, plus up to one period and one round:", ""]  # fmt: skip
    rows = [[i, f"{t['rank']} ({t['in']})", f"{m} {v['allowance']:.0f} s",
             f"**{v['freeze_to_verdict']:.1f} s**", f"{v['since_last_progress']:.1f} s",
             f"{v['culprit']} ({'right' if v['culprit'] == t['rank'] else 'WRONG'})", v["message"]]
            for i, t in enumerate(p["trials"], 1)
            for m, v in t.items() if m in ("fixed", "auto")]  # fmt: skip
    lines += _table(["trial", "frozen rank", "allowance", "freeze -> verdict",
                     "last progress -> verdict", "culprit", "message"], rows)  # fmt: skip
    silent = [f"{r['seconds']:.1f} s" for r in rounds if r["scenario"] == "silent"]
    return lines + [f"With {a['silent']} pods that accept and never answer (a stalled sidecar, "
                    "or packets dropped: the 2 s timeout, then per-pod backoff), the rounds "
                    f"took, in order: {', '.join(silent)}.", ""] * bool(silent)  # fmt: skip


def api_section(a: dict[str, Any], api: dict[str, Any]) -> list[str]:
    lines = [f"## 2. API-server writes in steady state (KWOK, {api.get('nodes')} nodes)", "",
             "The operator as a process (bench.operator_scale's machinery), one job of N pods "
             "(8 GPUs each, one per node) Running; its `rtj_api_requests_total` over "
             f"{a['window']:g} s after {a['settle']:g} s of settling.", ""]  # fmt: skip
    rows = [[n, v.get("skipped", "failed")] + [""] * 7 if "writes" not in v else
            [n, f"**{v['writes']:.3f}**", f"{v['lease_writes']:.2f}", f"{v['reads']:.2f}",
             f"{v['cluster']:.1f}", f"{v['cpu'].get('operator', 0):.1f}%",
             f"{v['cpu'].get('kube-apiserver', 0):.1f}%", f"{v['rss_mib']:.0f} MiB",
             f"{v['load1']:.1f}"] for n, v in api["sizes"].items()]  # fmt: skip
    lines += _table(["N pods", "operator writes/s (create, update, patch, delete)",
                     "its lease writes/s", "its reads/s", "all clients' requests/s",
                     "operator CPU", "API server CPU", "operator RSS", "load"], rows)  # fmt: skip
    lines += [f"- N={n}: Running {v['startup_s']:.0f} s after creation; a poll of a pod IP got "
              f"{v['probe']}; the operator's requests: {v['requests']}"
              for n, v in api["sizes"].items() if "probe" in v]  # fmt: skip
    if any("404" in v.get("probe", "") for v in api["sizes"].values()):
        lines.append("- This sandbox answers TCP to any outside address (HTTP 404 at once), so "
                     "each unanswered poll is cheap here; where a pod IP drops packets, each "
                     "costs the 2 s timeout (the silent-pods rounds of section 1).")  # fmt: skip
    lines += [f"- N={n} skipped, its operator logged: {v.get('log')}"
              for n, v in api["sizes"].items() if "skipped" in v]  # fmt: skip
    return lines + [f"- {note}" for note in api.get("notes", [])] + [
        "- N is small because each pod needs a KWOK node of its own (required anti-affinity): "
        "on the 2-core development machine 250, 500 and 1,250 did not reach a steady state "
        "(KWOK's node Lease renewals lapsed in the start-up burst; the operator judged those "
        "nodes lost, or at 1,250 a partition, and Kueue's PodsReadyTimeout restarted the "
        "group). Try `--api-sizes 125,1250` on a larger machine.", ""]  # fmt: skip


def markdown(r: dict[str, Any]) -> str:
    a, p, d = r["args"], r.get("poller"), r["defaults"]
    lines = ["# Hang detection at scale (issue 12)", "",
             f"Generated by `python -m bench.hang_detection` on {r['machine']}, {r['started']}; "
             f"load average (1 min) {r['load_start']:.1f} at the start, {r['load_end']:.1f} at "
             "the end. The machine is shared: durations and CPU are noisy and pessimistic.",
             ""]  # fmt: skip
    lines += poller_section(a, p) if p else []
    lines += api_section(a, r["api"]) if r.get("api") else []
    rows = [[f"{x['what']} (`{x['name']}`)", f"{x['seconds']:.0f}", f"`{x['where']}`"]
            for x in d["rows"]]  # fmt: skip
    nccl = d["rows"][0]["seconds"] if d["rows"] else float("nan")
    for mode in ("fixed", "auto"):
        got = [t[mode]["freeze_to_verdict"] for t in (p or {}).get("trials", []) if mode in t]
        if got:
            ours = f"ours, {mode} allowance: freeze -> Hang verdict (max measured)"
            rows.append([ours, f"{max(got):.1f}", f"section 1: {nccl / max(got):.0f}x sooner"])
    lines += [f"## 3. Side by side with today's defaults (torch {d['version']} in .venv)", ""]
    lines += _table(["what the job waits before a hang ends", "seconds", "source"], rows)
    cost = r["trainer_cost_s"]
    return "\n".join([*lines,
        f"`init_process_group(timeout=None)` documents 10 min for NCCL and 30 min otherwise "
        f"(`{d['docstring']}`); no c10d header of this torch names `TORCH_NCCL_TIMEOUT` "
        f"({d['env'] or 'none'}): the timeout is that argument. After either, the job is torn "
        "down and restarted; many large jobs raise NCCL's to 30 min or more.", "",
        f"Trainer cost of reporting: {1e6 * cost:.1f} µs per step (9 record updates) = "
        f"{100 * cost / 0.05:.3f}% of a 50 ms step (bench.progress_overhead's `per_step_cost`, "
        "re-run here for 0.1 s; docs/progress.md: 22-51 µs = 0.04-0.10% at load 3.4-4.3).",
        ""])  # fmt: skip
