"""The records a generation's trainers leave beside their resume file, for the supervisor to
report: a pinned step they refused (`rtj_shim.wire.rejected_step`), a suspect state's verdict
(`rtj_shim.wire.suspect_verdict`) and a data alignment finding after a resume
(`rtj_shim.wire.misaligned_resume`). Each is the tenant's word about its own ranks; one that
does not parse is no record (a restart then fails as any other, naming no step or rank)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from rtj_shim.wire.control import read_json
from rtj_shim.wire.misaligned_resume import SUFFIX as MISALIGNED_SUFFIX
from rtj_shim.wire.misaligned_resume import MisalignedRanks, MisalignedResumeError
from rtj_shim.wire.rejected_step import SUFFIX as REJECTED_SUFFIX
from rtj_shim.wire.rejected_step import RejectedStep, RejectedStepError
from rtj_shim.wire.suspect_verdict import SUFFIX as SUSPECT_SUFFIX
from rtj_shim.wire.suspect_verdict import SuspectVerdict, SuspectVerdictError

R = TypeVar("R")


def resume_file(control_dir: Path, env: Mapping[str, str], generation: int) -> Path:
    """The resume file generation `generation` was started with: the supervisor's
    ``resume-<g>.json`` in the control directory, or for generation 0 the pod's own
    (``RTJ_RESUME_FILE``, as the pod started) when it has one."""
    if generation == 0 and env.get("RTJ_RESUME_FILE"):
        return Path(env["RTJ_RESUME_FILE"])
    return control_dir / f"resume-{generation}.json"


def _beside(resume: Path, suffix: str) -> Path:
    return resume.with_name(resume.name + suffix)


def _parsed(path: Path, parse: Callable[[Any], R], errors: type[ValueError]) -> R | None:
    body = read_json(path)
    try:
        return None if body is None else parse(body)
    except errors:
        return None


def rejected(resume: Path) -> RejectedStep | None:
    """The pinned step the trainers refused, if they left one."""
    return _parsed(_beside(resume, REJECTED_SUFFIX), RejectedStep.parse, RejectedStepError)


def suspect(resume: Path) -> SuspectVerdict | None:
    """The trainers' verdict on a suspect state, if they left one."""
    return _parsed(_beside(resume, SUSPECT_SUFFIX), SuspectVerdict.parse, SuspectVerdictError)


def misaligned(resume: Path) -> MisalignedRanks | None:
    """The ranks the data alignment check named after the resume, if it named any."""
    path = _beside(resume, MISALIGNED_SUFFIX)
    return _parsed(path, MisalignedRanks.parse, MisalignedResumeError)
