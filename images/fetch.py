"""A content-addressed download cache: ``<cache>/sha256/<hex>``, verified before use.

The cache is ``$RTJ_CACHE_DIR/images`` or ``~/.cache/rtj/images`` (beside the cluster
harness's ``~/.cache/rtj/bin``). A file is only ever stored under the sha256 of its bytes,
so a warm cache needs no network and a corrupt or substituted download never enters it.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

CHUNK = 1 << 20


class FetchError(RuntimeError):
    """A download failed or did not have the pinned sha256."""


def cache_root() -> Path:
    base = os.environ.get("RTJ_CACHE_DIR")
    root = Path(base) if base else Path.home() / ".cache" / "rtj"
    return root / "images"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def fetch(url: str, sha256: str, cache: Path | None = None, *, attempts: int = 3) -> Path:
    """The file at ``url`` whose sha256 is ``sha256``, from the cache or downloaded once."""
    store = (cache or cache_root()) / "sha256"
    target = store / sha256
    if target.is_file():
        return target
    store.mkdir(parents=True, exist_ok=True)
    if not url.startswith(("https://", "http://")):
        raise FetchError(f"refusing to fetch {url!r}: only http(s) URLs are pinned")
    last: Exception | None = None
    for attempt in range(attempts):
        fd, tmp_name = tempfile.mkstemp(dir=store, prefix=".part-")
        tmp = Path(tmp_name)
        try:
            h = hashlib.sha256()
            with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=60) as resp:  # noqa: S310 (scheme checked above)
                while chunk := resp.read(CHUNK):
                    h.update(chunk)
                    out.write(chunk)
            if h.hexdigest() != sha256:
                raise FetchError(f"{url}: sha256 {h.hexdigest()}, the lock pins {sha256}")
            tmp.replace(target)
            return target
        except FetchError:
            raise
        except OSError as exc:  # network errors: retry a little
            last = exc
            print(f"images: {url}: {exc} (attempt {attempt + 1})", file=sys.stderr)
            time.sleep(1 + attempt)
        finally:
            if tmp.exists():
                tmp.unlink()
    raise FetchError(f"{url}: {last}")
