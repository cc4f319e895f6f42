"""The SPDX 2.3 (JSON) software bill of materials of one image.

Every Debian package (name, version, purl, the .deb's sha256 and URL) and every Python
distribution (name, version, purl, the wheel's sha256 and URL; our own two: the sha256 of
the wheel built here) is a package the image CONTAINS. The document is deterministic: its
creation time is SOURCE_DATE_EPOCH and its namespace is derived from its content.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Any

from images import oci

MEDIA_TYPE = "application/spdx+json"
PROJECT_URL = "https://github.com/resilient-training/resilient-training-operator"


@dataclass(frozen=True)
class Component:
    kind: str  # "deb" | "python"
    name: str
    version: str
    sha256: str
    purl: str
    download: str  # URL or NOASSERTION
    supplier: str
    source: str = ""
    license: str = ""
    note: str = ""


def _spdx_id(kind: str, name: str) -> str:
    return "SPDXRef-" + kind + "-" + re.sub(r"[^A-Za-z0-9.-]", "-", name)


def document(image: str, version: str, components: list[Component], epoch: int) -> bytes:
    image_id = "SPDXRef-image-" + image
    packages: list[dict[str, Any]] = [
        {
            "SPDXID": image_id,
            "name": image,
            "versionInfo": version,
            "primaryPackagePurpose": "CONTAINER",
            "supplier": "Organization: Resilient Training Operator maintainers",
            "downloadLocation": PROJECT_URL,
            "filesAnalyzed": False,
            "licenseConcluded": "NOASSERTION",
            "licenseDeclared": "NOASSERTION",
            "copyrightText": "NOASSERTION",
        }
    ]
    relationships: list[dict[str, str]] = [
        {
            "spdxElementId": "SPDXRef-DOCUMENT",
            "relationshipType": "DESCRIBES",
            "relatedSpdxElement": image_id,
        }
    ]
    for c in sorted(components, key=lambda c: (c.kind, c.name)):
        spdx_id = _spdx_id(c.kind, c.name)
        pkg: dict[str, Any] = {
            "SPDXID": spdx_id,
            "name": c.name,
            "versionInfo": c.version,
            "supplier": c.supplier,
            "downloadLocation": c.download,
            "filesAnalyzed": False,
            "checksums": [{"algorithm": "SHA256", "checksumValue": c.sha256}],
            "externalRefs": [
                {
                    "referenceCategory": "PACKAGE-MANAGER",
                    "referenceType": "purl",
                    "referenceLocator": c.purl,
                }
            ],
            "licenseConcluded": "NOASSERTION",
            "licenseDeclared": "NOASSERTION",
            "copyrightText": "NOASSERTION",
            "primaryPackagePurpose": "OPERATING-SYSTEM" if c.kind == "deb" else "LIBRARY",
        }
        if c.source:
            pkg["sourceInfo"] = c.source
        comments = [f"License (as the distribution declares it): {c.license}"] if c.license else []
        if c.note:
            comments.append(c.note)
        if comments:
            pkg["comment"] = "; ".join(comments)
        packages.append(pkg)
        relationships.append(
            {
                "spdxElementId": image_id,
                "relationshipType": "CONTAINS",
                "relatedSpdxElement": spdx_id,
            }
        )
    body = {"packages": packages, "relationships": relationships}
    content_id = oci.sha256_hex(oci.canonical_json(body))[:32]
    doc = {
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": f"{image}-{version}",
        "documentNamespace": f"{PROJECT_URL}/spdx/{image}-{version}-{content_id}",
        "creationInfo": {
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch)),
            "creators": ["Tool: rtj-images (python -m images)"],
        },
        **body,
    }
    return (json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()
