"""Rules that decide whether a published step can be trusted. Pure: inputs are bytes and maps.

*Shallow*: COMMITTED matches the manifest's sha256, the manifest is valid, its paths stay
inside the step and every file is present with its recorded size. *Deep*: shallow plus
every file's sha256.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from rtj_shim.checkpoint.layout import COMMITTED_FILE, MANIFEST_FILE
from rtj_shim.checkpoint.manifest import Manifest, decode_manifest, parse_committed, sha256_hex
from rtj_shim.errors import ManifestError


class Depth(str, Enum):
    SHALLOW = "shallow"
    DEEP = "deep"


@dataclass(frozen=True)
class Verdict:
    step: int
    valid: bool
    reason: str
    depth: Depth
    manifest: Manifest | None = None


def check_commit(step: int, manifest_raw: bytes | None, committed_raw: bytes | None) -> Manifest:
    """Return the manifest a COMMITTED marker vouches for, or raise ManifestError saying why not."""
    if committed_raw is None:
        raise ManifestError(f"{COMMITTED_FILE} is missing: the step was never fully published")
    if manifest_raw is None:
        raise ManifestError(f"{MANIFEST_FILE} is missing although {COMMITTED_FILE} exists")
    recorded = parse_committed(committed_raw)
    actual = sha256_hex(manifest_raw)
    if recorded != actual:
        raise ManifestError(
            f"{COMMITTED_FILE} records manifest sha256 {recorded[:12]}..., but "
            f"{MANIFEST_FILE} hashes to {actual[:12]}... (edited or swapped manifest)"
        )
    manifest = decode_manifest(manifest_raw, MANIFEST_FILE)
    if manifest.step != step:
        raise ManifestError(
            f"{MANIFEST_FILE}: field 'step' is {manifest.step}, expected {step} "
            "(the step directory's name)"
        )
    return manifest


def check_sizes(manifest: Manifest, sizes: Mapping[str, int]) -> str | None:
    """First size problem, or None when every listed file is present with its size."""
    for entry in manifest.files:
        size = sizes.get(entry.path)
        if size is None:
            return f"file {entry.path!r} listed in {MANIFEST_FILE} is missing"
        if size != entry.bytes:
            return f"file {entry.path!r} has {size} bytes, {MANIFEST_FILE} records {entry.bytes}"
    return None


@dataclass(frozen=True)
class Share:
    """This verifier's part of a step's files, when a group of N verifiers (the pods of an
    attempt) split deep verification: every file is hashed by exactly one of them, so the
    group reads each byte once instead of N times. The others check its size (shallow)."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.count:
            raise ValueError(f"share {self.index}/{self.count}: expected 0 <= index < count")

    def owns(self, path: str) -> bool:
        digest = hashlib.sha256(path.encode()).digest()
        return int.from_bytes(digest[:8], "big") % self.count == self.index

    @classmethod
    def parse(cls, text: str) -> Share:
        """`INDEX/COUNT`, e.g. `3/8`."""
        index, sep, count = text.partition("/")
        if not sep or not index.isdigit() or not count.isdigit() or int(count) < 1:
            raise ValueError(f"expected INDEX/COUNT such as 3/8, got {text!r}")
        return cls(int(index), int(count))


def check_digests(
    manifest: Manifest, digests: Mapping[str, str], share: Share | None = None
) -> str | None:
    """First checksum problem, or None when every file's sha256 matches the manifest (with
    `share`: every file of that share)."""
    for entry in manifest.files:
        if share is not None and not share.owns(entry.path):
            continue
        digest = digests.get(entry.path)
        if digest is None:
            return f"file {entry.path!r} was not hashed"
        if digest != entry.sha256:
            return (
                f"file {entry.path!r} has sha256 {digest[:12]}..., "
                f"{MANIFEST_FILE} records {entry.sha256[:12]}..."
            )
    return None
