"""Error types the CLI maps to exit codes.

A storage error is never mistaken for "no checkpoint": code that cannot read the store
raises :class:`StoreError`; "nothing here yet" is an ordinary return value.
"""

from __future__ import annotations


class ShimError(Exception):
    """Base of every error rtj_shim raises on purpose."""


class CheckpointError(ShimError):
    """A save or restore failed on this rank or on another one (``rtj_shim.torch`` and every
    framework integration raise it)."""


class StoreError(ShimError):
    """The store cannot be read or written (permissions, wrong type, network, S3 errors)."""


class Refused(ShimError):
    """A request the protocol declines: republishing a step, a second run, bad input."""


class StepAlreadyPublished(Refused):
    """A published step is immutable."""


class RunOwnershipConflict(Refused):
    """Another run (or a stale attempt of this run) owns the checkpoint root."""


class ManifestError(ShimError):
    """manifest.json (or COMMITTED) does not describe a valid step."""


class UsageError(ShimError):
    """The caller named something that cannot be used (an unsupported ROOT, say)."""
