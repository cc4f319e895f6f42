"""CRDs and webhook configurations taken from the JobSet and Kueue modules' own manifests.

The sources are the modules at the pinned versions (``config/components/crd/bases`` and
``config/components/webhook``). Webhooks are served by the controllers on loopback; every
``clientConfig.service`` becomes ``clientConfig.url: https://127.0.0.1:<port><path>`` with the
harness CA as ``caBundle``. The kustomize patches that the upstream webhook component applies
(JSON6902 ops and strategic-merge by webhook name) are applied here, so the selectors match a
real installation.
"""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import yaml

Obj = dict[str, Any]

FAST_SAFE_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""PyYAML's safe loader in C (libyaml, in PyYAML's wheels), the pure-Python one without it:
the same documents, parsed 6-10x faster. JobSet's and Kueue's CRDs (2.7 MB) took 3.7 s of
every cluster's start and our own CRD (0.7 MB) 1.4 s of every operator install."""


def load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=FAST_SAFE_LOADER)


def load_all(path: Path) -> list[Obj]:
    return [d for d in yaml.load_all(path.read_text(), Loader=FAST_SAFE_LOADER) if d]


def crds(module_dir: Path, only: tuple[str, ...] | None = None) -> list[Obj]:
    bases = module_dir / "config" / "components" / "crd" / "bases"
    docs: list[Obj] = []
    for f in sorted(bases.glob("*.yaml")):
        for d in load_all(f):
            if d.get("kind") == "CustomResourceDefinition" and (
                only is None or d["metadata"]["name"] in only
            ):
                docs.append(d)
    return docs


def _json_pointer_set(doc: Any, path: str, value: Any, op: str) -> None:
    parts = [p.replace("~1", "/").replace("~0", "~") for p in path.lstrip("/").split("/")]
    target = doc
    for p in parts[:-1]:
        target = target[int(p)] if isinstance(target, list) else target[p]
    last = parts[-1]
    if isinstance(target, list):
        if last == "-":
            target.append(value)
        elif op == "add":
            target.insert(int(last), value)
        else:
            target[int(last)] = value
    else:
        target[last] = value


def _strategic_merge_webhooks(obj: Obj, patch: Obj) -> None:
    by_name = {w["name"]: w for w in obj.get("webhooks", [])}
    for pw in patch.get("webhooks", []):
        w = by_name.get(pw["name"])
        if w is None:
            continue
        for k, v in pw.items():
            w[k] = copy.deepcopy(v)


def webhook_configurations(module_dir: Path) -> list[Obj]:
    """The module's webhook configurations with its kustomize patches applied."""
    wdir = module_dir / "config" / "components" / "webhook"
    objs = [
        d
        for d in load_all(wdir / "manifests.yaml")
        if d.get("kind", "").endswith("WebhookConfiguration")
    ]
    kust = yaml.safe_load((wdir / "kustomization.yaml").read_text()) or {}
    for entry in kust.get("patches", []) or []:
        if "path" in entry:
            body = yaml.safe_load((wdir / entry["path"]).read_text())
        else:
            body = yaml.safe_load(entry["patch"])
        if isinstance(body, list):  # JSON6902 ops against a target
            tgt = entry.get("target", {})
            for obj in objs:
                if obj["kind"] == tgt.get("kind") and obj["metadata"]["name"] == tgt.get("name"):
                    for op in body:
                        if op["op"] not in ("add", "replace"):
                            raise ValueError(f"unsupported patch op {op['op']} in {wdir}")
                        _json_pointer_set(obj, op["path"], copy.deepcopy(op["value"]), op["op"])
        elif isinstance(body, dict):  # strategic merge by kind+name
            for obj in objs:
                if obj["kind"] == body.get("kind") and (
                    obj["metadata"]["name"] == body["metadata"]["name"]
                ):
                    _strategic_merge_webhooks(obj, body)
    return objs


def point_at_loopback(objs: list[Obj], *, port: int, ca_pem: bytes, name_prefix: str) -> list[Obj]:
    """Rename (``<prefix>-<name>``) and rewrite service references to loopback URLs."""
    out = []
    ca_b64 = base64.b64encode(ca_pem).decode()
    for obj in objs:
        obj = copy.deepcopy(obj)
        obj["metadata"] = {"name": f"{name_prefix}-{obj['metadata']['name']}"}
        for w in obj.get("webhooks", []):
            svc = w["clientConfig"].get("service") or {}
            path = svc.get("path", "/")
            w["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca_b64}
            w.setdefault("timeoutSeconds", 10)
        out.append(obj)
    return out


def conversion_to_loopback(crd: Obj, *, port: int, ca_pem: bytes) -> Obj:
    """Serve a multi-version CRD's conversion from the controller's loopback webhook server."""
    crd = copy.deepcopy(crd)
    crd["spec"]["conversion"] = {
        "strategy": "Webhook",
        "webhook": {
            "clientConfig": {
                "url": f"https://127.0.0.1:{port}/convert",
                "caBundle": base64.b64encode(ca_pem).decode(),
            },
            "conversionReviewVersions": ["v1"],
        },
    }
    return crd


def conversion_patched_crds(module_dir: Path) -> set[str]:
    """CRD names the module's crd kustomization enables a conversion webhook for."""
    kfile = module_dir / "config" / "components" / "crd" / "kustomization.yaml"
    if not kfile.exists():
        return set()
    kust = yaml.safe_load(kfile.read_text()) or {}
    names: set[str] = set()
    for entry in kust.get("patches", []) or []:
        path = entry.get("path", "") if isinstance(entry, dict) else ""
        if "webhook_in_" in path:
            body = yaml.safe_load((kfile.parent / path).read_text())
            names.add(body["metadata"]["name"])
    return names
