"""The supervisor's report: what ``rtj-shim supervise`` says of the trainer's command, in its
pod's control directory (``supervisor.json``), served by the progress sidecar as
``"supervisor"`` in ``GET /progress`` and read by the operator (one parse, where the answer
arrives). Pure.

``{"generation": 3, "state": "stopped", "attempt": 4, "exit_code": null, "fast_steps": [40],
"fast_held": ["<lineage>@40"], "rejected": null, "suspect": null, "misaligned": null,
"spare": false, "rank": 2, "pid": null, "preloaded": false, "standby": "fork-server",
"updated_wall_time": 1733400000.5}``

Only ``generation`` and ``state`` are required (an older supervisor reports less); a known
key of the wrong kind is an error naming it. The report is the tenant's pod speaking: it can
move its own job's in-place restart along, never name a node.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

from rtj_shim.checkpoint import lineage
from rtj_shim.checkpoint.lineage import Held
from rtj_shim.wire.misaligned_resume import MisalignedRanks, MisalignedResumeError
from rtj_shim.wire.rejected_step import RejectedStep, RejectedStepError
from rtj_shim.wire.suspect_verdict import SuspectVerdict, SuspectVerdictError


class SupervisorState(str, Enum):
    """What the supervisor's command is doing, in the generation it reports."""

    RUNNING = "running"
    """Started (from a warm interpreter or cold) and not yet ended."""
    STOPPING = "stopping"
    """A stop order is being carried out: the command's process tree is being ended."""
    STOPPED = "stopped"
    """Nothing runs: a stop carried out, or held (a replacement pod, a warm spare)."""
    EXITED = "exited"
    """The command ended with an error; the pod stays up for an in-place restart."""
    FINISHED = "finished"
    """The command ended with code 0, or a finish order was carried out."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


STOPPED_STATES = frozenset({SupervisorState.STOPPED})
"""States that show a stop order carried out."""
STARTED_STATES = frozenset(
    {SupervisorState.RUNNING, SupervisorState.EXITED, SupervisorState.FINISHED}
)
"""States that show a run order carried out (the trainer started; it may already have ended)."""


class SupervisorReportError(ValueError):
    """A report that is not one; the message names the field."""


@dataclass(frozen=True)
class SupervisorReport:
    generation: int
    state: SupervisorState
    attempt: int | None = None
    exit_code: int | None = None
    fast_steps: tuple[int, ...] | None = None
    """The fast steps the pod holds (an older supervisor's form, of unknown lineage); None
    when the report has no such list."""
    fast_held: frozenset[Held] | None = None
    """The same with their lineages; None from a supervisor that does not report them."""
    rejected: RejectedStep | None = None
    """The pinned step the restarted trainers refused (`rtj_shim.wire.rejected_step`)."""
    suspect: SuspectVerdict | None = None
    """The trainers' verdict on a suspect state (silent data corruption) when they exited
    with one (`rtj_shim.wire.suspect_verdict`)."""
    misaligned: MisalignedRanks | None = None
    """The data alignment check's finding on this generation's resume, once the trainers
    made one (`rtj_shim.wire.misaligned_resume`)."""
    spare: bool = False
    rank: int | None = None
    pid: int | None = None
    preloaded: bool = False
    standby: str | None = None
    updated_wall_time: float | None = None

    def shows(self, generation: int, states: frozenset[SupervisorState]) -> bool:
        return self.generation == generation and self.state in states

    @property
    def holdings(self) -> frozenset[Held]:
        """The (lineage, step) pairs the pod holds; an older supervisor's steps alone are of
        unknown lineage (`lineage.LEGACY`: never pinned)."""
        if self.fast_held is not None:
            return self.fast_held
        return frozenset(Held(step, lineage.LEGACY) for step in self.fast_steps or ())

    @property
    def lists_fast_tier(self) -> bool:
        """Whether the report lists fast steps at all (a supervisor of a pod with a fast tier)."""
        return self.fast_held is not None or self.fast_steps is not None

    def encode(self) -> dict[str, Any]:
        return {
            "generation": self.generation, "state": self.state.value, "attempt": self.attempt,
            "exit_code": self.exit_code,
            "fast_steps": None if self.fast_steps is None else list(self.fast_steps),
            "fast_held": None if self.fast_held is None else sorted(
                h.encode() for h in self.fast_held
            ),
            "rejected": None if self.rejected is None else self.rejected.encode(),
            "suspect": None if self.suspect is None else self.suspect.encode(),
            "misaligned": None if self.misaligned is None else self.misaligned.encode(),
            "spare": self.spare, "rank": self.rank, "pid": self.pid,
            "preloaded": self.preloaded, "standby": self.standby,
            "updated_wall_time": self.updated_wall_time,
        }  # fmt: skip

    @classmethod
    def parse(cls, body: object) -> SupervisorReport:
        if not isinstance(body, Mapping):
            raise SupervisorReportError(f"supervisor: expected an object, got {body!r:.80}")
        try:
            state = SupervisorState(body.get("state"))
        except ValueError:
            words = ", ".join(s.value for s in SupervisorState)
            raise SupervisorReportError(
                f"supervisor.state: expected one of {words}, got {body.get('state')!r:.40}"
            ) from None
        generation = _count(body, "generation")
        if generation is None:
            raise SupervisorReportError("supervisor.generation: expected an integer >= 0")
        return cls(
            generation=generation,
            state=state,
            attempt=_count(body, "attempt"),
            exit_code=_integer(body, "exit_code"),
            fast_steps=_steps(body.get("fast_steps")),
            fast_held=lineage.parse_all(body["fast_held"])
            if isinstance(body.get("fast_held"), list) else None,
            rejected=_part(body, "rejected", RejectedStep.parse, RejectedStepError),
            suspect=_part(body, "suspect", SuspectVerdict.parse, SuspectVerdictError),
            misaligned=_part(body, "misaligned", MisalignedRanks.parse, MisalignedResumeError),
            spare=body.get("spare") is True,
            rank=_count(body, "rank"),
            pid=_count(body, "pid"),
            preloaded=body.get("preloaded") is True,
            standby=body.get("standby") if isinstance(body.get("standby"), str) else None,
            updated_wall_time=_seconds(body, "updated_wall_time"),
        )  # fmt: skip


T = TypeVar("T")


def _part(
    body: Mapping[str, Any], key: str, parse: Callable[[Any], T], errors: type[ValueError]
) -> T | None:
    """A record the report carries (`parse`d: a finding, a refusal, a verdict), or None; one
    that does not parse is a bad report, its error prefixed with the key's place."""
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise SupervisorReportError(f"supervisor.{key}: expected an object or null")
    try:
        return parse(value)
    except errors as exc:
        raise SupervisorReportError(f"supervisor.{exc}") from None


def _integer(body: Mapping[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise SupervisorReportError(f"supervisor.{key}: expected an integer or null")
    return value


def _count(body: Mapping[str, Any], key: str) -> int | None:
    value = _integer(body, key)
    if value is not None and value < 0:
        raise SupervisorReportError(f"supervisor.{key}: expected an integer >= 0")
    return value


def _seconds(body: Mapping[str, Any], key: str) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SupervisorReportError(f"supervisor.{key}: expected a number of seconds or null")
    return float(value)


def _steps(value: object) -> tuple[int, ...] | None:
    """Reported fast steps; entries that are not step numbers are ignored (as holdings are)."""
    if not isinstance(value, list):
        return None
    return tuple(s for s in value if isinstance(s, int) and not isinstance(s, bool) and s >= 0)
