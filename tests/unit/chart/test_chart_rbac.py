"""The operator's RBAC (issue 42): the audit table in docs/operations.md ("Permissions") lists
every API call the operator makes, with its scope and the code that needs it; the chart binds
to the operator's ServiceAccount exactly the table's rows in every mode, and with
operator.watchNamespaces set nothing a job's namespace holds is granted cluster-wide."""

from __future__ import annotations

import ast
import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import yaml
from rtj_chart import CHART, REPO, render

from rtj_operator import handlers
from rtj_operator.api import keys
from rtj_operator.api.resource import ResilientTrainingJob
from rtj_operator.api_paths import request_kind
from rtj_operator.job_reads import JobReads
from rtj_operator.kube import Kube
from rtj_operator.kube_errors import KubeError
from rtj_operator.policy.node_event_sources import NODE_EVENT_NAMESPACE
from rtj_operator.policy.render import owner_reference

pytestmark = pytest.mark.timeout(300)

DOCS = REPO / "docs" / "operations.md"
OPERATOR = REPO / "operator" / "rtj_operator"
FULLNAME = "rtj-resilient-training-operator"
RELEASE_NAMESPACE = "rtj-system"
EVERYWHERE = "*"
"""The namespace of a grant that holds in every namespace (a ClusterRoleBinding)."""

Grant = tuple[str, str, str, str]
"""(namespace or EVERYWHERE, API group, resource, verb)."""

HEADER = ["API group", "resource", "verbs", "scope", "when", "needed by"]
SCOPES = {
    "job namespaces": "jobs",
    "cluster": "cluster",
    "`default`": "default",
    "release namespace": "release",
    "`kube-node-lease`": "kube-node-lease",
}


@dataclass(frozen=True)
class Row:
    group: str
    resource: str
    verbs: frozenset[str]
    scope: str
    when: str
    needed_by: str


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def audit_table() -> list[Row]:
    """The rows of the table in docs/operations.md, section "Permissions (least privilege)"."""
    text = DOCS.read_text(encoding="utf-8")
    section = text.split("### Permissions (least privilege)\n", 1)[1].split("\n## ", 1)[0]
    section = section.split("\n### ", 1)[0]  # up to the next section (the threat model)
    lines = [line for line in section.splitlines() if line.startswith("| ")]
    assert lines and _cells(lines[0]) == HEADER, "the audit table's header"
    rows = []
    for line in lines[2:]:
        group, resource, verbs, scope, when, needed_by = _cells(line)
        assert scope in SCOPES, f"unknown scope {scope!r} in: {line}"
        rows.append(Row(
            group="" if group == "core" else group.strip("`"),
            resource=resource.strip("`"),
            verbs=frozenset(v.strip() for v in verbs.split(",")),
            scope=SCOPES[scope],
            when=when,
            needed_by=needed_by,
        ))  # fmt: skip
    return rows


# --- the chart's grants -------------------------------------------------------------------------


def _merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        both = isinstance(value, Mapping) and isinstance(out.get(key), Mapping)
        out[key] = _merged(out[key], value) if both else value
    return out


def _implied(grants: Iterable[Grant]) -> set[Grant]:
    """The grants, less those in one namespace that an EVERYWHERE grant already holds."""
    grants = set(grants)
    return {g for g in grants if g[0] == EVERYWHERE or (EVERYWHERE, *g[1:]) not in grants}


def expected_grants(rows: Iterable[Row], overrides: Mapping[str, Any]) -> set[Grant]:
    """What the table says the chart grants with `overrides` on the chart's defaults."""
    defaults = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    values = _merged(defaults, overrides)
    watched = list(values["operator"]["watchNamespaces"])
    when = {
        "always": True,
        "`operator.watchNamespaces` set": bool(watched),
        "`rbac.readCheckpointSecrets`": values["rbac"]["readCheckpointSecrets"],
        "`rbac.watchCustomResourceDefinitions`": values["rbac"]["watchCustomResourceDefinitions"],
        "`leaderElection.enabled`": values["leaderElection"]["enabled"],
        "`operator.inPlaceRestart.enabled`": values["operator"]["inPlaceRestart"]["enabled"],
    }
    where = {
        "jobs": watched or [EVERYWHERE],
        "cluster": [EVERYWHERE],
        "default": [NODE_EVENT_NAMESPACE],
        "release": [RELEASE_NAMESPACE],
        "kube-node-lease": ["kube-node-lease"],
    }
    grants: set[Grant] = set()
    for row in rows:
        assert row.when in when, f"unknown condition {row.when!r}"
        if when[row.when]:
            for ns in where[row.scope]:
                grants |= {(ns, row.group, row.resource, verb) for verb in row.verbs}
    return _implied(grants)


def bound_grants(objs: Iterable[dict[str, Any]]) -> set[Grant]:
    """Every rule bound to the operator's ServiceAccount, where the binding makes it hold."""
    objs = list(objs)
    roles = {
        (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o
        for o in objs if o["kind"] in ("ClusterRole", "Role")
    }  # fmt: skip
    operator = {"kind": "ServiceAccount", "name": FULLNAME, "namespace": RELEASE_NAMESPACE}
    grants: set[Grant] = set()
    for binding in objs:
        if binding["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        if operator not in binding["subjects"]:
            continue
        cluster_wide = binding["kind"] == "ClusterRoleBinding"
        ns = EVERYWHERE if cluster_wide else binding["metadata"]["namespace"]
        ref = binding["roleRef"]
        role_ns = "" if ref["kind"] == "ClusterRole" else ns
        role = roles[(ref["kind"], role_ns, ref["name"])]
        for rule in role["rules"]:
            assert not rule.get("nonResourceURLs"), rule
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        assert "*" not in (group, resource, verb), rule
                        grants.add((ns, group, resource, verb))
    return _implied(grants)


MODES: dict[str, dict[str, Any]] = {
    "every namespace": {},
    "watched namespaces": {"operator": {"watchNamespaces": ["team-a", "team-b"]}},
    "watching default and the release namespace": {
        "operator": {"watchNamespaces": ["default", RELEASE_NAMESPACE]}
    },
    "narrowed": {
        "operator": {"watchNamespaces": ["team-a"]},
        "rbac": {"readCheckpointSecrets": False, "watchCustomResourceDefinitions": False},
        "leaderElection": {"enabled": False},
        "replicaCount": 1,
    },
    "every namespace, narrowed": {
        "rbac": {"readCheckpointSecrets": False, "watchCustomResourceDefinitions": False},
    },
}


@pytest.mark.parametrize("overrides", MODES.values(), ids=MODES.keys())
def test_the_chart_grants_exactly_the_audit_table(
    overrides: dict[str, Any], tmp_path: Path
) -> None:
    """Nothing the table does not list (a grant with no user), nothing it lists missing."""
    rows = audit_table()
    granted = bound_grants(render(overrides, tmp_path))
    expected = expected_grants(rows, overrides)
    assert not granted - expected, f"granted, not in the audit table: {sorted(granted - expected)}"
    assert not expected - granted, f"in the audit table, not granted: {sorted(expected - granted)}"


def test_watched_namespaces_keep_secrets_jobsets_and_pods_out_of_the_cluster_role(
    tmp_path: Path,
) -> None:
    objs = render(MODES["watched namespaces"], tmp_path)
    grants = bound_grants(objs)
    cluster_wide = {(g, r) for ns, g, r, _ in grants if ns == EVERYWHERE}
    assert cluster_wide == {
        ("", "nodes"),
        ("", "namespaces"),
        ("apiextensions.k8s.io", "customresourcedefinitions"),
    }
    assert {(ns, v) for ns, _, r, v in grants if r == "secrets"} == {
        (ns, v) for ns in ("team-a", "team-b") for v in ("get", "create")
    }, "credentials read by name, each job's key Secret created: in the watched ones only"
    writes = {(ns, v) for ns, _, r, v in grants if r == "jobsets" and v not in ("list", "watch")}
    assert writes == {(ns, v) for ns in ("team-a", "team-b") for v in ("create", "delete")}
    # node Events only where their reporters store them (and the reader reads them); nothing
    # else there
    node_events = {(g, r, v) for ns, g, r, v in grants if ns == NODE_EVENT_NAMESPACE}
    assert node_events == {("", "events", "list"), ("", "events", "watch")}
    jobs = one_role(objs, "team-a", f"{FULLNAME}-jobs")
    assert jobs["rules"] == one_role(objs, "team-b", f"{FULLNAME}-jobs")["rules"]
    # every role of the operator's is bound, and only to its ServiceAccount
    users = (f"{FULLNAME}-edit", f"{FULLNAME}-view")  # aggregated into admin/edit/view
    roles = {
        (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"])
        for o in objs if o["kind"] in ("ClusterRole", "Role") and o["metadata"]["name"] not in users
    }  # fmt: skip
    bindings = [o for o in objs if o["kind"] in ("ClusterRoleBinding", "RoleBinding")]
    assert roles == {
        (b["roleRef"]["kind"], b["metadata"].get("namespace", ""), b["roleRef"]["name"])
        for b in bindings
    }
    for binding in bindings:
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": FULLNAME, "namespace": RELEASE_NAMESPACE}
        ]


def one_role(objs: Iterable[dict[str, Any]], namespace: str, name: str) -> dict[str, Any]:
    (role,) = [
        o for o in objs
        if o["kind"] == "Role"
        and (o["metadata"]["namespace"], o["metadata"]["name"]) == (namespace, name)
    ]  # fmt: skip
    return role


# --- the table against the code -----------------------------------------------------------------


@dataclass(frozen=True)
class _NodeChange:
    taints: tuple[dict[str, Any], ...]
    annotation: str | None


class _Recording(Kube):
    """A Kube whose requests only tell `on_request` (verb, resource), as the API server names
    them, and answer an object every method can read."""

    def __init__(self) -> None:
        self.heard: set[tuple[str, str]] = set()
        super().__init__(api_client=object(), on_request=self._hear)

    def _hear(self, verb: str, resource: str) -> None:
        self.heard.add((verb, resource))

    def request(
        self,
        what: str,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        self._hear(*request_kind(method, path, query))
        return {"metadata": {"resourceVersion": "7", "uid": "uid-1"}, "items": []}


def _first(items: Iterator[Any]) -> None:
    # the watch has no server (a bare object for a client): it was asked, that is all
    with contextlib.suppress(KubeError, AttributeError):
        next(items, None)


def _list_every_kind(kube: Kube) -> None:
    for kind in ("pods", "jobsets", "nodes", "rtjs", "events"):
        for namespace in ("team-a", None):
            kube.list_kind(kind, namespace)


def _queue(kube: Kube) -> None:
    reads = JobReads(kube, cast(Any, None), cast(Any, None), lambda: datetime.now(timezone.utc), ())
    reads.queue("team-a", "queue")


SAMPLES: dict[str, Callable[[Kube], object]] = {
    "list_kind": _list_every_kind,
    "patch_rtj_status": lambda k: k.patch_rtj_status("team-a", "llm", {"phase": "Running"}, "7"),
    "set_rtj_finalizer": lambda k: k.set_rtj_finalizer(
        "team-a", "llm", "uid-1", keys.RELEASE_FINALIZER, True
    ),
    "delete_rtj": lambda k: k.delete_rtj("team-a", "llm", "uid-1", "Background"),
    "create_jobset": lambda k: k.create_jobset("team-a", {"metadata": {"name": "llm-a1"}}),
    "delete_jobset": lambda k: k.delete_jobset("team-a", "llm-a1"),
    "delete_pod": lambda k: k.delete_pod("team-a", "llm-a1-0", 30),
    "post_event": lambda k: k.post_event(
        {"name": "llm", "namespace": "team-a"}, "Normal", "AttemptStarted", "attempt 1"
    ),
    "list_events": lambda k: k.list_events("team-a", "involvedObject.kind=Pod"),
    "secret_data": lambda k: k.secret_data("team-a", "creds"),
    "create_secret": lambda k: k.create_secret("team-a", {"metadata": {"name": "rtj-control-u"}}),
    "edit_node": lambda k: k.edit_node(
        "gpu-0", lambda taints, value: _NodeChange((), None), keys.QUARANTINE_OWNERS_ANNOTATION
    ),
    "list_node_leases": lambda k: k.list_node_leases(),
    "watch_node_leases": lambda k: _first(k.watch_node_leases("7")),
    "watch_kind": lambda k: [_first(k.watch_kind("events", ns, "7")) for ns in ("team-a", None)],
    "get_lease": lambda k: k.get_lease(RELEASE_NAMESPACE, FULLNAME),
    "create_lease": lambda k: k.create_lease(RELEASE_NAMESPACE, {"metadata": {"name": FULLNAME}}),
    "replace_lease": lambda k: k.replace_lease(RELEASE_NAMESPACE, FULLNAME, {"metadata": {}}),
    # the one raw request: the LocalQueue lookup (test below: no other module sends one)
    "request": _queue,
}


def _is_kube(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id == "kube") or (
        isinstance(node, ast.Attribute) and node.attr == "kube"
    )


def _operator_sources() -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(OPERATOR.rglob("*.py")):
        if path.name != "kube.py":
            yield path, ast.parse(path.read_text(encoding="utf-8"), str(path))


def kube_uses() -> dict[str, set[str]]:
    """Each Kube method the operator's code names (`kube.m`, `self.kube.m`), and the files."""
    public = {n for n, v in vars(Kube).items() if not n.startswith("_") and callable(v)}
    uses: dict[str, set[str]] = {}
    for path, tree in _operator_sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in public and _is_kube(node.value):
                uses.setdefault(node.attr, set()).add(path.name)
    return uses


def kube_held_by_other_names() -> list[str]:
    """Where the operator holds a Kube under a name other than `kube` (an argument or an
    attribute annotated `Kube`): `kube_uses` would not see its calls."""
    found = []
    for path, tree in _operator_sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.arg):
                named, annotation, line = node.arg, node.annotation, node.lineno
            elif isinstance(node, ast.AnnAssign):
                target = node.target
                named = target.attr if isinstance(target, ast.Attribute) else ""
                named = target.id if isinstance(target, ast.Name) else named
                annotation, line = node.annotation, node.lineno
            else:
                continue
            if isinstance(annotation, ast.Name) and annotation.id == "Kube" and named != "kube":
                found.append(f"{path.name}:{line}: {named}")
    return found


def test_every_api_call_the_operator_makes_is_in_the_audit_table_and_nothing_more() -> None:
    assert not kube_held_by_other_names(), "the scan finds the calls on `kube` only"
    uses = kube_uses()
    assert set(uses) == set(SAMPLES), (
        f"Kube methods the operator calls with no sample here: {set(uses) - set(SAMPLES)}; "
        f"samples of methods it no longer calls: {set(SAMPLES) - set(uses)}"
    )
    assert uses["request"] == {"job_reads.py"}, "a raw request outside the LocalQueue lookup"
    kube = _Recording()
    for sample in SAMPLES.values():
        sample(kube)
    called = {(resource, verb) for verb, resource in kube.heard}
    for handler in handlers.registry._watching.get_all_handlers():
        selector = handler.selector
        assert selector is not None, handler
        resource = selector.plural or selector.any_name
        assert isinstance(resource, str) and resource, handler
        called |= {(resource, "list"), (resource, "watch")}  # kopf lists, then watches
    # needed without a call of the operator's own:
    called |= {
        # kopf's namespace observer (named namespaces) and resource observer (CRDs)
        ("namespaces", "list"), ("namespaces", "watch"),
        ("customresourcedefinitions", "list"), ("customresourcedefinitions", "watch"),
    }  # fmt: skip
    rtj = cast(ResilientTrainingJob, SimpleNamespace(metadata=SimpleNamespace(name="j", uid="u")))
    if owner_reference(rtj).get("blockOwnerDeletion"):  # OwnerReferencesPermissionEnforcement
        called.add(("resilienttrainingjobs/finalizers", "update"))
    listed = {(row.resource, verb) for row in audit_table() for verb in row.verbs}
    assert not called - listed, f"called, not in the audit table: {sorted(called - listed)}"
    assert not listed - called, f"in the audit table, never called: {sorted(listed - called)}"


def test_the_audit_table_names_real_code() -> None:
    """Every `Kube.x` the table cites is a method the operator calls, and every method it
    calls (but the raw request) is cited."""
    uses = kube_uses()
    cited: set[str] = set()
    for row in audit_table():
        for word in row.needed_by.replace("`", " ").replace(",", " ").split():
            if word.startswith("Kube."):
                method = word.removeprefix("Kube.").rstrip(":")
                assert method in uses, f"{row.resource}: Kube.{method} is not called"
                cited.add(method)
        assert row.needed_by, row
    assert cited == set(uses) - {"request"}
