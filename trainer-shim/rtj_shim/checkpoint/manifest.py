"""The manifest schema and the COMMITTED marker: what a published step claims to contain.

Pure: no I/O. ``COMMITTED`` holds the sha256 of the exact ``manifest.json`` bytes, so a
manifest edited or swapped after publication no longer verifies.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from datetime import datetime, timezone
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rtj_shim.checkpoint.layout import RESERVED_FILES
from rtj_shim.errors import ManifestError

SCHEMA_VERSION = 1
_HEX = "0123456789abcdef"


def confine_path(path: str) -> str:
    """Return ``path`` if it is a relative, normalized POSIX path that stays inside its step."""
    if not path or not isinstance(path, str):
        raise ValueError("path must be a non-empty string")
    if "\\" in path or "\x00" in path:
        raise ValueError(f"path {path!r} must use '/' separators and no NUL bytes")
    if path.startswith("/"):
        raise ValueError(f"path {path!r} must be relative to the step directory")
    normalized = posixpath.normpath(path)
    if normalized != path:
        raise ValueError(f"path {path!r} is not normalized (expected {normalized!r})")
    if normalized == ".." or normalized.startswith("../") or normalized == ".":
        raise ValueError(f"path {path!r} escapes the step directory")
    return path


class FileEntry(BaseModel):
    """One shard: its path inside the step, its size and its sha256."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    bytes: int = Field(ge=0)
    sha256: str = Field(min_length=64, max_length=64)

    @field_validator("path")
    @classmethod
    def _confined(cls, value: str) -> str:
        confine_path(value)
        if value in RESERVED_FILES:
            raise ValueError(f"path {value!r} is reserved for the protocol")
        return value

    @field_validator("sha256")
    @classmethod
    def _hex(cls, value: str) -> str:
        if any(c not in _HEX for c in value):
            raise ValueError("sha256 must be 64 lowercase hex digits")
        return value


class Framework(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = "unknown"
    version: str = ""
    components: dict[str, str] = Field(default_factory=dict)


class Manifest(BaseModel):
    """``manifest.json`` of one published step (schema_version 1)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    run_id: str = Field(min_length=1, max_length=253)
    step: int = Field(ge=0)
    world_size: int = Field(default=1, ge=1)
    parallelism: dict[str, int] = Field(default_factory=dict)
    framework: Framework = Field(default_factory=Framework)
    code_commit: str | None = None
    image_digest: str | None = None
    dataset_snapshot: str | None = None
    created_at: datetime
    files: tuple[FileEntry, ...]
    # Framework-specific facts a loader needs (for example the torch state layout).
    # Free-form but JSON only; never executed.
    extra: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _unique_paths(self) -> Manifest:
        seen: set[str] = set()
        for entry in self.files:
            if entry.path in seen:
                raise ValueError(f"files: path {entry.path!r} is listed twice")
            seen.add(entry.path)
        for entry in self.files:
            parent = posixpath.dirname(entry.path)
            while parent:
                if parent in seen:
                    raise ValueError(f"files: {parent!r} is both a file and a directory")
                parent = posixpath.dirname(parent)
        return self

    @property
    def total_bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    @property
    def lineage(self) -> str | None:
        """The history this step continues (`rtj_shim.checkpoint.lineage`), kept in ``extra`` so
        that a shim older than lineages (its schema forbids unknown fields) still reads the
        manifest; None in manifests written before lineages (read as LEGACY)."""
        value = self.extra.get(LINEAGE_EXTRA)
        return value if isinstance(value, str) else None


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


LINEAGE_EXTRA = "lineage"
"""The key of ``Manifest.extra`` that holds the step's lineage."""


def with_lineage(extra: dict[str, Any], lineage: str | None) -> dict[str, Any]:
    """A manifest's ``extra`` recording `lineage` (unchanged without one)."""
    return extra if lineage is None else {**extra, LINEAGE_EXTRA: lineage}


def encode_manifest(manifest: Manifest) -> bytes:
    """Canonical bytes: sorted keys, so the same manifest always hashes the same."""
    data = manifest.model_dump(mode="json")
    return (json.dumps(data, sort_keys=True, indent=2) + "\n").encode()


def decode_manifest(raw: bytes, source: str = "manifest.json") -> Manifest:
    """Parse and validate; errors name the file and the field that is wrong."""
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{source}: not valid JSON ({exc})") from exc
    if isinstance(data, dict) and isinstance(data.get("lineage"), str):
        # written by this shim's first lineage release, as a field of its own
        first = data.pop("lineage")
        extra = data.get("extra")
        data["extra"] = with_lineage(extra if isinstance(extra, dict) else {}, first)
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "<root>"
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise ManifestError(f"{source}: field {field!r}: {first['msg']}{more}") from exc


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def committed_marker(manifest_bytes: bytes) -> bytes:
    return f"sha256:{sha256_hex(manifest_bytes)}\n".encode()


def parse_committed(raw: bytes, source: str = "COMMITTED") -> str:
    """Return the manifest digest a COMMITTED marker records."""
    try:
        text = raw.decode("ascii").strip()
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{source}: expected 'sha256:<64 hex digits>', got binary") from exc
    prefix = "sha256:"
    digest = text[len(prefix) :] if text.startswith(prefix) else ""
    if len(digest) != 64 or any(c not in _HEX for c in digest):
        raise ManifestError(f"{source}: expected 'sha256:<64 hex digits>', got {text[:80]!r}")
    return digest
