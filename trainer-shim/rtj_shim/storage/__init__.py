"""Storage backends. ``open_store`` maps a ROOT (path, ``file://``, ``s3://``) to one."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse

from rtj_shim.errors import UsageError
from rtj_shim.storage.base import CheckpointStore, StepWriter
from rtj_shim.storage.filesystem import FilesystemStore

__all__ = ["CheckpointStore", "StepWriter", "open_store"]


def open_store(root: str) -> CheckpointStore:
    """Open a checkpoint root; the S3 backend (boto3) is imported only when asked for."""
    if not root:
        raise UsageError("--root: expected a path, file://PATH or s3://BUCKET/PREFIX, got ''")
    if root.startswith("s3://"):
        from rtj_shim.storage.s3 import S3Store

        return S3Store.from_uri(root)
    if "://" in root:
        parsed = urlparse(root)
        if parsed.scheme != "file":
            raise UsageError(
                f"--root: unsupported scheme {parsed.scheme!r} in {root!r}; "
                "expected a path, file://PATH or s3://BUCKET/PREFIX"
            )
        if parsed.netloc not in ("", "localhost"):
            raise UsageError(f"--root: file:// URIs must not name a host, got {parsed.netloc!r}")
        return FilesystemStore(Path(unquote(parsed.path)))
    return FilesystemStore(Path(root))
