"""Names of things in a checkpoint root; the same layout on every backend.

<root>/run.json
<root>/latest.json
<root>/steps/step-000000012000/{shards..., manifest.json, COMMITTED}
<root>/steps/step-000000012500.tmp-<attempt>/   (in progress, never resolved)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

STEP_DIGITS = 12
MAX_STEP = 10**STEP_DIGITS - 1
STEPS_DIR = "steps"
MANIFEST_FILE = "manifest.json"
COMMITTED_FILE = "COMMITTED"
LATEST_FILE = "latest.json"
RUN_FILE = "run.json"
RESERVED_FILES = frozenset({MANIFEST_FILE, COMMITTED_FILE})

_ATTEMPT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_STEP_DIR_RE = re.compile(rf"^step-(\d{{{STEP_DIGITS}}})(?:\.tmp-(.+))?$")


@dataclass(frozen=True)
class StepDirName:
    """A parsed directory name under ``steps/``; ``attempt`` is set for in-progress dirs."""

    step: int
    attempt: str | None = None

    @property
    def in_progress(self) -> bool:
        return self.attempt is not None

    def __str__(self) -> str:
        if self.attempt is None:
            return step_dir_name(self.step)
        return tmp_dir_name(self.step, self.attempt)


def validate_step(step: int) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_STEP:
        raise ValueError(f"step must be an integer in [0, {MAX_STEP}], got {step!r}")
    return step


def validate_attempt(attempt: str) -> str:
    if not _ATTEMPT_RE.match(attempt):
        raise ValueError(
            f"attempt must match {_ATTEMPT_RE.pattern} (letters, digits, '_', '.', '-'), "
            f"got {attempt!r}"
        )
    return attempt


def step_dir_name(step: int) -> str:
    return f"step-{validate_step(step):0{STEP_DIGITS}d}"


def tmp_dir_name(step: int, attempt: str) -> str:
    return f"{step_dir_name(step)}.tmp-{validate_attempt(attempt)}"


def step_key(step: int, name: str = "") -> str:
    """Root-relative key of a published step's directory or of a file inside it."""
    base = f"{STEPS_DIR}/{step_dir_name(step)}"
    return f"{base}/{name}" if name else base


def parse_step_dir(name: str) -> StepDirName | None:
    """Parse a name under ``steps/``; anything that is not ours returns None."""
    match = _STEP_DIR_RE.match(name)
    if match is None:
        return None
    attempt = match.group(2)
    if attempt is not None and not _ATTEMPT_RE.match(attempt):
        return None
    return StepDirName(step=int(match.group(1)), attempt=attempt)
