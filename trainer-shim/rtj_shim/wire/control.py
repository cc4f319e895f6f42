"""Restart orders from the operator to a pod's supervisor (in-place restart, issue 15).

The operator sends an order to each worker pod's progress sidecar (``POST /control`` on the
pod IP, the address it already polls); the sidecar checks it and writes it to the pod's
control directory, where the supervisor (``rtj-shim supervise``) around the trainer's
command reads it. The supervisor reports back through the same directory, and the sidecar
serves that report with ``GET /progress``, so the operator sees every pod's generation and
state on its next poll. Nothing here talks to the API server: training pods keep having
no API token.

An order::

    {"job_uid": "0c2f...", "generation": 3, "action": "stop"}
    {"job_uid": "0c2f...", "generation": 3, "action": "run", "attempt": 4, "step": 1200}
    {"job_uid": "0c2f...", "generation": 3, "action": "run", "attempt": 4, "step": 1200,
     "fast_step": 1260}
    {"job_uid": "0c2f...", "generation": 3, "action": "run", "attempt": 4, "step": 1200,
     "fast_step": 1260, "fast_source": "10.0.3.7:9478"}
    {"job_uid": "0c2f...", "generation": 3, "action": "run", "attempt": 4, "step": 1200,
     "fast_step": 1260, "fast_lineage": "5f0c2a9e81d4b7c3"}
    {"job_uid": "0c2f...", "generation": 3, "action": "run", "attempt": 4, "step": 1200,
     "rank": 1, "master_addr": "llm-a1-worker-0-0.llm-a1"}

``stop`` ends generation ``generation - 1`` (every process of the trainer's command gone);
``finish``, to an idle pod (a warm spare, or a pod whose rank a spare took) once the world's
trainers finished, ends its supervisor with 0, so its Job completes as the workers' do;
``run`` starts generation ``generation`` (only after the pod reported ``stopped`` for it)
from ``step`` (None: from scratch), writing checkpoints as ``attempt``. ``fast_step``, when
present, is the newer step every pod holds in its fast tier (``rtj_shim.fast.fast_tier``): the
trainer resumes from it when every rank verifies it, else from ``step``. ``fast_source``,
only in the order to a pod that does not hold ``fast_step`` itself (it replaced a pod on a
broken node), is the progress sidecar of the pod that holds this pod's peer replica
(``rtj_shim.fast.peer_replica``): the sidecar copies the step from there before it hands the
order to the supervisor. ``fast_lineage``, with ``fast_step``, is the history every pod
holds the step in (``rtj_shim.checkpoint.lineage``): the trainers restore it only when every rank's
copy is of that lineage (an older operator names none: they then check only that the
copies agree). ``rank`` and ``master_addr``, in a run order, start the command as
that node rank and with that rendezvous host (``RANK``, ``NODE_RANK``, ``PET_NODE_RANK``;
``MASTER_ADDR``, ``PET_MASTER_ADDR``) instead of the pod's own: a warm spare taking a
replaced pod's rank, and every pod of a world whose rank 0 moved to a spare.

Authenticity: the body is signed with HMAC-SHA256 under the job's control key (header
``X-RTJ-Signature: sha256=<hex>``). The operator derives the key from its own secret and the
job's uid and renders it into the job's pods (``RTJ_CONTROL_KEY``), so an order for one job
never verifies in another job's pods. Whoever can read the job's pods (its own namespace)
can read the key: at worst such a reader can restart that job's trainers, never touch
another namespace's. Orders only move forward: a generation lower than the last accepted
one is refused, so a replayed old order does nothing.

Pure, apart from the two small file helpers at the end.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeGuard, TypeVar

from rtj_shim.checkpoint import lineage

ORDER_FILE = "order.json"
STATE_FILE = "supervisor.json"
SIGNATURE_HEADER = "X-RTJ-Signature"
MAX_ORDER_BYTES = 4096
ACTIONS = ("stop", "run", "finish")
MAX_SAVE = 3600
MAX_FAST_EVERY = 1_000_000
"""The longest save grace a stop order may give (spec.checkpoint.emergencySaveSeconds' bound)."""


def writer_attempt(attempt: int, generation: int) -> str:
    """The attempt label the trainers of `attempt`, restarted in place `generation` times,
    write checkpoints as (``rtj_shim.checkpoint.protocol.attempt_order`` reads it back): generation
    g of attempt a is ``a.g``, so a rank of an earlier generation still running on a lost node
    cannot publish; generation 0 is plain ``a``."""
    return f"{attempt}.{generation}" if generation else str(attempt)


class OrderError(ValueError):
    """An order that must not be carried out (the message says which field and why)."""


@dataclass(frozen=True)
class Order:
    job_uid: str
    generation: int
    action: str
    attempt: int | None = None
    step: int | None = None
    fast_step: int | None = None
    fast_source: str | None = None
    rank: int | None = None
    master_addr: str | None = None
    fast_lineage: str | None = None
    world_size: int | None = None
    """The world the trainers of this generation form (elastic: fewer pods than the job's
    replicas after a shrink, all of them again after a grow-back); None: the pod's own."""
    save_seconds: int | None = None
    """A stop's grace for the trainers to save at their next step boundary (SIGTERM, then
    SIGKILL only after this long: a healthy world stopped to resize, a grow-back); None:
    the supervisor's short grace (a world that lost a rank or hung cannot save)."""
    fast_every_steps: int | None = None
    """The fast tier's interval this generation saves at (`fastTier.everySteps: auto`: the
    supervisor sets ``RTJ_FAST_EVERY_STEPS`` for it); None: the pod's own."""

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "job_uid": self.job_uid,
            "generation": self.generation,
            "action": self.action,
        }
        if self.action == "run":
            body["attempt"] = self.attempt
            body["step"] = self.step
            if self.fast_step is not None:
                body["fast_step"] = self.fast_step
                if self.fast_source is not None:
                    body["fast_source"] = self.fast_source
                if self.fast_lineage is not None:
                    body["fast_lineage"] = self.fast_lineage
            if self.rank is not None:
                body["rank"] = self.rank
            if self.master_addr is not None:
                body["master_addr"] = self.master_addr
            if self.world_size is not None:
                body["world_size"] = self.world_size
            if self.fast_every_steps is not None:
                body["fast_every_steps"] = self.fast_every_steps
        if self.action == "stop" and self.save_seconds is not None:
            body["save_seconds"] = self.save_seconds
        return body

    def encode(self) -> bytes:
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":")).encode()


def parse_order(raw: bytes) -> Order:
    """An order from its JSON body; OrderError naming the field that is wrong."""
    data = json_object(raw, MAX_ORDER_BYTES, "order", OrderError)
    uid, generation, action = data.get("job_uid"), data.get("generation"), data.get("action")
    if not isinstance(uid, str) or not uid:
        raise OrderError(f"order.job_uid: expected a non-empty string, got {uid!r}")
    if not count(generation):
        raise OrderError(f"order.generation: expected an integer >= 0, got {generation!r}")
    if action not in ACTIONS:
        raise OrderError(f"order.action: expected one of {', '.join(ACTIONS)}, got {action!r}")
    attempt, step, fast = data.get("attempt"), data.get("step"), data.get("fast_step")
    if action == "run":
        if not count(attempt) or attempt < 1:
            raise OrderError(f"order.attempt: expected an integer >= 1, got {attempt!r}")
        if step is not None and not count(step):
            raise OrderError(f"order.step: expected null or an integer >= 0, got {step!r}")
        if fast is not None and not count(fast):
            raise OrderError(f"order.fast_step: expected null or an integer >= 0, got {fast!r}")
    source = data.get("fast_source")
    run = action == "run"
    if run and fast is not None and source is not None and not is_address(source):
        raise OrderError(f"order.fast_source: expected null or HOST:PORT, got {source!r}")
    pinned = data.get("fast_lineage")
    if (
        run
        and fast is not None
        and pinned is not None
        and not (isinstance(pinned, str) and lineage.valid(pinned))
    ):
        raise OrderError(
            f"order.fast_lineage: expected null or {lineage.ID_HEX} hex digits, got {pinned!r}"
        )
    if not (run and fast is not None):
        source = pinned = None
    rank, master = data.get("rank"), data.get("master_addr")
    if run and rank is not None and not count(rank):
        raise OrderError(f"order.rank: expected null or an integer >= 0, got {rank!r}")
    if run and master is not None and not is_host(master):
        raise OrderError(
            f"order.master_addr: expected null, a DNS name or an IP address, got {master!r}"
        )
    world = data.get("world_size")
    if run and world is not None and (not count(world) or world < 1):
        raise OrderError(f"order.world_size: expected null or an integer >= 1, got {world!r}")
    if run and world is not None and rank is not None and rank >= world:
        raise OrderError(f"order.rank: {rank} is outside a world of {world} (order.world_size)")
    every = data.get("fast_every_steps")
    if run and every is not None and (not count(every) or not 1 <= every <= MAX_FAST_EVERY):
        raise OrderError(
            f"order.fast_every_steps: expected null or 1 to {MAX_FAST_EVERY}, got {every!r}"
        )
    save = data.get("save_seconds")
    if action == "stop" and save is not None and not (count(save) and 1 <= save <= MAX_SAVE):
        raise OrderError(f"order.save_seconds: expected null or 1 to {MAX_SAVE}, got {save!r}")
    return Order(uid, generation, action, attempt if run else None, step if run else None,
                 fast if run else None, source, rank if run else None,
                 master if run else None, pinned, world if run else None,
                 save if action == "stop" else None, every if run else None)  # fmt: skip


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def is_host(value: object) -> TypeGuard[str]:
    """A rendezvous host: a DNS name (RFC 1123 labels, lower case, as Kubernetes names pods'
    hostnames and Services) or an IP address."""
    if not isinstance(value, str) or not 1 <= len(value) <= 253:
        return False
    try:
        ipaddress.ip_address(value)
        return True
    except ValueError:
        pass
    return all(_DNS_LABEL.fullmatch(label) for label in value.split("."))


def is_address(value: object) -> TypeGuard[str]:
    """``HOST:PORT`` of a pod's progress sidecar (an IPv4 address or ``[IPv6]``, a port)."""
    if not isinstance(value, str) or not 3 <= len(value) <= 64:
        return False
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return False
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def json_object(raw: bytes, limit: int, what: str, error: type[OrderError]) -> dict[str, Any]:
    """A signed message's body as a JSON object of at most ``limit`` bytes, or ``error``
    naming ``what`` (an order, a peer-replica assignment)."""
    if len(raw) > limit:
        raise error(f"{what}: at most {limit} bytes, got {len(raw)}")
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise error(f"{what}: expected a JSON object ({exc})") from exc
    if not isinstance(data, dict):
        raise error(f"{what}: expected a JSON object")
    return data


def count(value: object) -> TypeGuard[int]:
    """An integer >= 0 (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def job_key(secret: bytes, job_uid: str) -> str:
    """The job's control key (hex): derived from the operator's secret and the job's uid."""
    return hmac.new(secret, b"rtj-control/" + job_uid.encode(), hashlib.sha256).hexdigest()


def sign(key: str, body: bytes) -> str:
    return "sha256=" + hmac.new(key.encode(), body, hashlib.sha256).hexdigest()


def signature_matches(expected: str, signature: str | None) -> bool:
    """Whether a ``X-RTJ-Signature`` header as received is ``expected``, in constant time:
    the one check of that header (orders, assignments, requests and answers alike). A
    missing header, or one holding anything but ASCII (an HTTP server reads header bytes as
    Latin-1, and ``hmac.compare_digest`` raises TypeError on non-ASCII text), is simply not
    this job's signature."""
    if signature is None or not signature.isascii() or not expected.isascii():
        return False
    return hmac.compare_digest(expected.encode("ascii"), signature.encode("ascii"))


def verify(key: str, body: bytes, signature: str | None) -> bool:
    return signature_matches(sign(key, body), signature)


class SignedMessage(Protocol):
    """A message the operator signs with the job's key: an order, a peer-replica
    assignment, a drain order. Each names the job it is for."""

    @property
    def job_uid(self) -> str: ...


M = TypeVar("M", bound=SignedMessage)


def accept_signed(
    raw: bytes,
    signature: str | None,
    *,
    key: str,
    job_uid: str,
    parse: Callable[[bytes], M],
    error: type[OrderError],
    name: str,
    off: str,
) -> M:
    """The one reader of a signed message: the pod holds the job's key (`off` says what is
    off without one), the body is signed with it, parses (`parse` names the field that is
    wrong), and is for this pod's job; else `error`, naming `name`'s field."""
    if not key:
        raise error(f"this pod has no control key ({off})")
    if not verify(key, raw, signature):
        raise error(f"{SIGNATURE_HEADER}: missing or not this job's signature")
    message = parse(raw)
    if message.job_uid != job_uid:
        raise error(f"{name}.job_uid: {message.job_uid!r} is not this pod's job")
    return message


def accept(
    raw: bytes, signature: str | None, *, key: str, job_uid: str, last: Order | None
) -> Order:
    """The order a sidecar may pass on, or OrderError: signed with this job's key, for this
    job, not older than the last accepted one (the same one again is accepted: retries)."""
    order = accept_signed(
        raw, signature, key=key, job_uid=job_uid, parse=parse_order, error=OrderError,
        name="order", off="in-place restart is off for its job",
    )  # fmt: skip
    if last is not None and (order.generation, ACTIONS.index(order.action)) < (
        last.generation,
        ACTIONS.index(last.action),
    ):
        raise OrderError(
            f"order.generation: {order.generation} {order.action} is older than the last "
            f"accepted ({last.generation} {last.action})"
        )
    return order


# --- the control directory ----------------------------------------------------------------


def write_json(path: Path, body: dict[str, Any]) -> None:
    """Atomically (a reader sees the old file or the new one, never a part)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(body, f, separators=(",", ":"))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json(path: Path) -> dict[str, Any] | None:
    """The file's object; None if absent or not an object (a writer's rename is atomic)."""
    try:
        data = json.loads(path.read_bytes()[: MAX_ORDER_BYTES * 4])
    except (FileNotFoundError, ValueError):
        return None
    return data if isinstance(data, dict) else None
