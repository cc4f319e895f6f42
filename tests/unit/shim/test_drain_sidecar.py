"""The drain sidecar's durable store: opened at the first drain, then kept (an S3 store's
client is made once, not for every drained step); a failed open is tried again."""

from __future__ import annotations

from pathlib import Path

import pytest

from rtj_shim.checkpoint.storage import CheckpointStore, open_store
from rtj_shim.errors import StoreError
from rtj_shim.fast.drain_sidecar import Drainer


def test_the_store_is_opened_once_and_a_failed_open_is_tried_again(tmp_path: Path) -> None:
    opened: list[str] = []

    def open_root(uri: str) -> CheckpointStore:
        opened.append(uri)
        if len(opened) == 1:
            raise StoreError("the endpoint did not answer")
        return open_store(uri)

    uri = f"file://{tmp_path / 'durable'}"
    drainer = Drainer(tmp_path / "fast", "key", uri, "ns.job", open_root=open_root)
    with pytest.raises(StoreError):
        drainer._durable()
    store = drainer._durable()
    assert drainer._durable() is store
    assert opened == [uri, uri]
