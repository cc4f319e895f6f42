"""The images a real node runs, from `make images`' archives (no registry, no download): the
name an archive imports as, and the sandbox ("pause") image made from the resolver image's
layers under a config whose process waits for a signal."""

from __future__ import annotations

import copy
import hashlib
import io
import json
import tarfile
from pathlib import Path

PAUSE_IMAGE = "rtj.local/pause:py"
PAUSE_PROGRAM = (
    "import signal, sys\n"
    "for s in (signal.SIGTERM, signal.SIGINT):\n"
    "    signal.signal(s, lambda *_: sys.exit(0))\n"
    "signal.pause()\n"
)


def image_ref(archive: Path) -> str:
    """The name an OCI archive of `make images` imports as (its index's annotation)."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        assert member is not None
        index = json.load(member)
    return str(index["manifests"][0]["annotations"]["io.containerd.image.name"])


def pause_archive(resolver: Path, out: Path) -> Path:
    """An OCI archive of the sandbox image: the resolver image's layers under a config whose
    process waits for a signal (no other download; the layers are shared in containerd)."""
    with tarfile.open(resolver) as tar:

        def blob(digest: str) -> bytes:
            f = tar.extractfile("blobs/sha256/" + digest.removeprefix("sha256:"))
            assert f is not None
            return f.read()

        index_member = tar.extractfile("index.json")
        assert index_member is not None
        manifest = json.loads(blob(json.load(index_member)["manifests"][0]["digest"]))
        config = json.loads(blob(manifest["config"]["digest"]))
        layers = {layer["digest"]: blob(layer["digest"]) for layer in manifest["layers"]}
    config = copy.deepcopy(config)
    config["config"] = {
        "Entrypoint": ["/usr/bin/python3", "-S", "-c", PAUSE_PROGRAM],
        "User": "65535:65535",
        "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"],
    }
    blobs: dict[str, bytes] = dict(layers)
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_digest = "sha256:" + _sha256(config_bytes)
    blobs[config_digest] = config_bytes
    manifest = {**manifest, "config": {**manifest["config"], "digest": config_digest,
                                        "size": len(config_bytes)}}  # fmt: skip
    manifest.pop("annotations", None)
    manifest_bytes = json.dumps(manifest, sort_keys=True).encode()
    manifest_digest = "sha256:" + _sha256(manifest_bytes)
    blobs[manifest_digest] = manifest_bytes
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest,
            "size": len(manifest_bytes),
            "annotations": {"io.containerd.image.name": PAUSE_IMAGE,
                            "org.opencontainers.image.ref.name": "py"},
        }],
    }  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w") as tar:
        files = {
            "oci-layout": b'{"imageLayoutVersion":"1.0.0"}',
            "index.json": json.dumps(index).encode(),
            **{f"blobs/sha256/{d.removeprefix('sha256:')}": b for d, b in blobs.items()},
        }
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
