"""The README is a user's first day (issue 44): its manifest is a valid ResilientTrainingJob
(against the chart's CRD, as the API server's strict field validation reads it, and against
the models), what it says `kubectl get rtj` shows is what the CRD prints, its install
commands name make targets, a chart and values that exist, its conversion diff is the one
docs/converting.md runs, and every link it holds points at a file (and heading) that exists."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from rtj_operator.api import ResilientTrainingJob
from rtj_operator.api.keys import API_VERSION, KIND
from rtj_operator.api.reasons import ConditionType
from rtj_operator.policy.render import kueue_labels

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
CHART = REPO / "charts" / "resilient-training-operator"
CRD = CHART / "crds" / "resilienttrainingjobs.yaml"

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _text() -> str:
    return README.read_text(encoding="utf-8")


def _section(text: str, heading: str) -> str:
    return text.split(f"\n{heading}\n", 1)[1].split("\n## ", 1)[0]


def _blocks(text: str, lang: str) -> list[str]:
    return [body for kind, body in FENCE.findall(text) if kind == lang]


def _manifest() -> dict[str, Any]:
    docs = [yaml.safe_load(b) for b in _blocks(_section(_text(), "## Your first job"), "yaml")]
    jobs = [d for d in docs if isinstance(d, dict) and d.get("kind") == KIND]
    assert len(jobs) == 1, "the README's first job: one ResilientTrainingJob yaml block"
    return jobs[0]


def _crd_version() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text(encoding="utf-8"))
    (version,) = [v for v in crd["spec"]["versions"] if v["storage"]]
    return dict(version)


def _unknown_fields(value: Any, schema: dict[str, Any], path: str) -> list[str]:
    """Fields the API server's strict field validation (kubectl's default) refuses: keys a
    structural schema does not declare, where it neither preserves unknown fields nor takes
    additionalProperties."""
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        items = schema["items"]
        return [p for i, v in enumerate(value) for p in _unknown_fields(v, items, f"{path}[{i}]")]
    if not isinstance(value, dict) or schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    if isinstance(schema.get("additionalProperties"), dict):
        extra = schema["additionalProperties"]
        return [p for k, v in value.items() for p in _unknown_fields(v, extra, f"{path}.{k}")]
    props = schema.get("properties")
    if props is None:
        return []
    found = [f"{path}.{k}" for k in value if k not in props]
    for k, v in value.items():
        if k in props:
            found += _unknown_fields(v, props[k], f"{path}.{k}")
    return found


# --- the first job ----------------------------------------------------------------------------


def test_the_first_job_is_valid_against_the_charts_crd() -> None:
    body = _manifest()
    assert body["apiVersion"] == API_VERSION
    version = _crd_version()
    assert version["name"] == API_VERSION.split("/")[1]
    schema = version["schema"]["openAPIV3Schema"]
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(body), key=str)
    assert [f"{list(e.absolute_path)}: {e.message}" for e in errors] == []
    assert _unknown_fields(body, schema, "") == []


def test_the_first_job_is_valid_against_the_models() -> None:
    body = _manifest()
    assert ResilientTrainingJob.unknown_fields(body) == ()
    job = ResilientTrainingJob.from_object(body)
    ResilientTrainingJob.model_validate({**body, "status": {}})  # strict: refuses what is unknown
    assert job.spec.replicas >= 2, "a multi-node job"
    assert job.spec.template["spec"]["containers"][0].get("command")


def test_the_priority_label_is_the_one_carried_to_kueue() -> None:
    job = ResilientTrainingJob.from_object(_manifest())
    assert "kueue.x-k8s.io/priority-class" in kueue_labels(job)
    assert "kueue.x-k8s.io/priority-class" in _section(_text(), "## Your first job")


def test_kubectl_get_rtj_shows_the_crds_printer_columns() -> None:
    section = _section(_text(), "## Your first job")
    header = next(line for line in section.splitlines() if line.startswith("# NAME "))
    shown = re.split(r"\s{2,}", header.removeprefix("# ").strip())
    columns = _crd_version()["additionalPrinterColumns"]
    default = [c["name"].upper() for c in columns if not c.get("priority")]
    wide = [c["name"].upper() for c in columns if c.get("priority")]
    assert shown == ["NAME", *default]
    assert f"-o wide adds {', '.join(wide)}" in section


def test_kubectl_wait_names_a_condition_the_operator_sets() -> None:
    waits = re.findall(r"kubectl wait --for=condition=(\w+) rtj/", _text())
    assert waits and all(w in {c.value for c in ConditionType} for w in waits)
    assert waits == [ConditionType.COMPLETE.value]


# --- install ---------------------------------------------------------------------------------


def _install_commands() -> list[list[str]]:
    section = _section(_text(), "## Install")
    commands = []
    for block in _blocks(section, "bash"):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            line = line.split(" # ", 1)[0].strip()
            if line and not line.startswith("#"):
                commands.append(shlex.split(line))
    return commands


def _values() -> dict[str, Any]:
    return dict(yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8")))


def test_the_install_section_is_commands_that_exist() -> None:
    commands = _install_commands()
    assert commands, "## Install holds fenced bash blocks"
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([a-zA-Z0-9_-]+):", makefile, re.M))
    values = _values()
    helm_installs = 0
    for argv in commands:
        if argv[0] == "make":
            assert set(argv[1:]) <= targets, argv
        if argv[:2] == ["helm", "install"]:
            helm_installs += 1
            assert (REPO / argv[3] / "Chart.yaml").is_file(), argv[3]
            for i, arg in enumerate(argv):
                if arg == "--set":
                    key = argv[i + 1].split("=", 1)[0]
                    node: Any = values
                    for part in key.split("."):
                        assert isinstance(node, dict) and part in node, f"no value {key}"
                        node = node[part]
        for arg in argv:
            for path in re.findall(r"dist/images/[\w.-]+", arg):
                assert path.rsplit("/", 1)[1] in _built_files(), path
    assert helm_installs >= 1
    assert any(argv[:2] == ["make", "images"] for argv in commands)


def _built_files() -> set[str]:
    """What `make images` writes into dist/images (images/*.py)."""
    source = "\n".join(
        p.read_text(encoding="utf-8") for p in sorted((REPO / "images").glob("*.py"))
    )
    assert 'f"{spec.name}.oci.tar"' in source and "build-info.json" in source
    return {
        "rtj-operator.oci.tar",
        "rtj-resolver.oci.tar",
        "build-info.json",
        "rtj-operator.spdx.json",
        "rtj-resolver.spdx.json",
    }


def test_the_images_the_chart_defaults_to_are_the_ones_make_images_names() -> None:
    values = _values()
    section = _section(_text(), "## Install")
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    for key in ("image", "resolverImage"):
        repo = values[key]["repository"]
        assert repo.startswith("ghcr.io/resilient-training/")
    assert f"`ghcr.io/resilient-training/<image>:{chart['appVersion']}`" in section
    assert chart["kubeVersion"] == ">=1.29.0-0" and "≥ 1.29" in _text()


def test_the_prerequisites_quote_the_tested_versions() -> None:
    pins = dict(
        line.split("=", 1)
        for line in (REPO / "e2e" / "versions.env").read_text(encoding="utf-8").splitlines()
        if line and not line.startswith("#")
    )
    section = _section(_text(), "## Prerequisites")
    for name in ("KUBERNETES", "JOBSET", "KUEUE", "HELM", "PROMETHEUS"):
        assert pins[name] in section, name


# --- converting ------------------------------------------------------------------------------


def test_the_conversion_diff_is_docs_converting_mds() -> None:
    (diff,) = _blocks(_section(_text(), "## Convert your script"), "diff")
    converting = (REPO / "docs" / "converting.md").read_text(encoding="utf-8")
    marker = "<!-- converting-example: plain -->\n"
    plain = _blocks(converting.split(marker, 1)[1], "diff")[0].splitlines()
    at = 0
    for line in diff.splitlines():
        if not line.strip():
            continue
        assert line in plain[at:], f"not in docs/converting.md's plain diff, in order: {line!r}"
        at = plain.index(line, at) + 1


# --- links -----------------------------------------------------------------------------------


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = path.read_text(encoding="utf-8")
    text = FENCE.sub("", text)
    found = {_slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}
    return found | set(re.findall(r'<a id="([^"]+)"', text))


def _links(path: Path) -> list[str]:
    return list(LINK.findall(FENCE.sub("", path.read_text(encoding="utf-8"))))


@pytest.mark.parametrize(
    "doc",
    ["README.md", "docs/development.md", "docs/shim.md", "bench/README.md"],
)
def test_every_link_points_at_a_file_that_exists(doc: str) -> None:
    source = REPO / doc
    broken = []
    for target in _links(source):
        if re.match(r"^[a-z]+:", target):
            continue  # https:, mailto:
        file, _, anchor = target.partition("#")
        path = (source.parent / file).resolve() if file else source
        missing = not path.exists()
        if missing or (anchor and path.suffix == ".md" and anchor not in _anchors(path)):
            broken.append(target)
    assert broken == []


def test_links_into_the_readme_find_their_headings() -> None:
    """docs/converting.md sends readers to the README's exact-resume rule."""
    anchors = _anchors(README)
    for doc in sorted((REPO / "docs").glob("*.md")):
        for target in _links(doc):
            file, _, anchor = target.partition("#")
            if file.endswith("README.md") and (doc.parent / file).resolve() == README and anchor:
                assert anchor in anchors, f"{doc.name}: {target}"


def test_the_readme_stays_short() -> None:
    """200 lines, and 10 more for the table of frameworks with what a resume gives in each
    (issue 47 asks for it in the README)."""
    assert len(_text().splitlines()) <= 210
