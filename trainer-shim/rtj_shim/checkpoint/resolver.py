"""Resolve the resume step and describe a root's steps, reading through a store."""

from __future__ import annotations

from dataclasses import dataclass

from rtj_shim.checkpoint.layout import LATEST_FILE, StepDirName, step_key
from rtj_shim.checkpoint.retention import StepState, metric_of
from rtj_shim.checkpoint.selection import (
    Resolution,
    Skipped,
    hint_problem,
    in_progress_skips,
    parse_latest_hint,
    resume_candidates,
    select_resume_step,
)
from rtj_shim.checkpoint.storage.base import CheckpointStore, StepDirEntry
from rtj_shim.checkpoint.verification import Depth, Share
from rtj_shim.checkpoint.verifier import verify_step


def resolve(
    store: CheckpointStore,
    depth: Depth = Depth.SHALLOW,
    *,
    step: int | None = None,
    workers: int | None = None,
    share: Share | None = None,
) -> Resolution:
    """Newest step that verifies (or only ``step``). A missing root is "no checkpoint".
    With ``share``, deep verification hashes only that share of each step's files."""
    if not store.root_exists():
        return Resolution(None, None, None, ())
    dirs = store.list_step_dirs()
    published = [d.name.step for d in dirs if not d.name.in_progress]
    hint = parse_latest_hint(store.read(LATEST_FILE))
    if step is not None:
        if step not in published:
            missing = Skipped(step, f"step {step} is not published under {store.uri}")
            return Resolution(None, None, None, (missing,))
        candidates = [step]
    else:
        candidates = resume_candidates(published)

    verdict, skipped = select_resume_step(
        candidates, lambda s: verify_step(store, s, depth, workers, share)
    )
    chosen = verdict.step if verdict else None
    problem = hint_problem(hint, published, chosen) if step is None else None
    if step is None:
        skipped = in_progress_skips((d.name for d in dirs), chosen) + skipped
        skipped.sort(key=lambda s: s.step, reverse=True)
    if verdict is None:
        return Resolution(None, None, None, tuple(skipped), problem)
    return Resolution(
        verdict.step, store.key_uri(step_key(verdict.step)), depth, tuple(skipped), problem
    )


@dataclass(frozen=True)
class StepListing:
    entry: StepDirEntry
    state: StepState

    @property
    def label(self) -> str:
        if self.entry.name.in_progress:
            return "in progress"
        return "published" if self.state.verified else "broken"


def describe_steps(store: CheckpointStore, depth: Depth = Depth.SHALLOW) -> list[StepListing]:
    """Every step directory with its verification state, newest first."""
    if not store.root_exists():
        return []
    listings = []
    for entry in store.list_step_dirs():
        name: StepDirName = entry.name
        if name.in_progress:
            state = StepState(name, verified=False, reason="in progress")
        else:
            verdict = verify_step(store, name.step, depth)
            metric = metric_of(verdict.manifest.extra) if verdict.manifest else None
            state = StepState(name, verdict.valid, verdict.reason, metric)
        listings.append(StepListing(entry, state))
    listings.sort(key=lambda s: (s.entry.name.step, s.entry.name.attempt or ""), reverse=True)
    return listings
