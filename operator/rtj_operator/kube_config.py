"""Loading the credentials the Kubernetes adapter (`kube`) uses: in-cluster service account or
a kubeconfig, with one clear error when neither is usable."""

from __future__ import annotations

import os


class KubeconfigError(Exception):
    """No usable credentials: the message names the file and what is wrong with it."""


def load_config(kubeconfig: str | None = None, context: str | None = None) -> None:
    """In-cluster service account, else the kubeconfig (KUBECONFIG or the given path);
    KubeconfigError when neither is usable."""
    import yaml
    from kubernetes import config

    if kubeconfig is None:
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
            return
        except config.ConfigException:
            pass
    try:
        config.load_kube_config(config_file=kubeconfig, context=context)  # type: ignore[no-untyped-call]
    except (config.ConfigException, yaml.YAMLError, OSError, ValueError, TypeError) as exc:
        where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        why = " ".join(str(exc).split())  # one line: a YAML error spans several
        raise KubeconfigError(f"cannot load the kubeconfig {where}: {why}") from None
