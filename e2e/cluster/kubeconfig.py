"""Kubeconfig files for the harness's users and components (client-certificate auth)."""

from __future__ import annotations

from pathlib import Path

import yaml


def write_kubeconfig(
    path: Path,
    *,
    server: str,
    ca_file: Path,
    cert_file: Path,
    key_file: Path,
    cluster_name: str = "rtj-e2e",
    user: str = "admin",
) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": cluster_name,
                "cluster": {"server": server, "certificate-authority": str(ca_file)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {"client-certificate": str(cert_file), "client-key": str(key_file)},
            }
        ],
        "contexts": [{"name": cluster_name, "context": {"cluster": cluster_name, "user": user}}],
        "current-context": cluster_name,
        "preferences": {},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    path.chmod(0o600)
    return path
