"""Storage backends. ``open_store`` maps a ROOT (path, ``file://``, ``s3://``) to one."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote, urlparse

from rtj_shim.checkpoint.storage.base import CheckpointStore, StepWriter
from rtj_shim.checkpoint.storage.filesystem import FilesystemStore
from rtj_shim.errors import UsageError

__all__ = ["CheckpointStore", "StepWriter", "open_store"]

ACCEPTED = "expected a path, file://PATH or s3://BUCKET/PREFIX"
_SCHEME_LIKE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")


def open_store(root: str, name: str = "root") -> CheckpointStore:
    """Open a checkpoint root; the S3 backend (boto3) is imported only when asked for.
    Errors name the argument the root came from (``name``: the library's ``root``, the
    CLI's ``--root``)."""
    if not root:
        raise UsageError(f"{name}: {ACCEPTED}, got ''")
    if root.startswith("s3://"):
        from rtj_shim.checkpoint.storage.s3 import S3Store

        return S3Store.from_uri(root, name=name)
    if "://" not in root and (lookalike := _SCHEME_LIKE.match(root)):
        # `s3:/bucket`, `s3:bucket`, `file:/x`: a typo of a URI read as a relative path would
        # be an empty directory, and "no checkpoint" a silent fresh start of a job that has them
        raise UsageError(
            f"{name}: {root!r} starts like a URI ({lookalike.group(1)}:) without '//'; {ACCEPTED}"
            " (a relative path with a colon: write ./" + root + ")"
        )
    if "://" in root:
        parsed = urlparse(root)
        if parsed.scheme != "file":
            raise UsageError(
                f"{name}: unsupported scheme {parsed.scheme!r} in {root!r}; {ACCEPTED}"
            )
        if parsed.netloc not in ("", "localhost"):
            raise UsageError(f"{name}: file:// URIs must not name a host, got {parsed.netloc!r}")
        return FilesystemStore(Path(unquote(parsed.path)))
    return FilesystemStore(Path(root))
