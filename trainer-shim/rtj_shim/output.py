"""How `rtj-shim` prints a result: ``-o json`` (the default of every command but ``ls``) or
``-o yaml``. Pure. The YAML is block style, numbers and words as JSON writes them and every
string double-quoted with only ASCII inside (YAML escapes for the rest), so it needs no
YAML library in a training image and reads back to the same data."""

from __future__ import annotations

import json
from typing import Any

FORMATS = ("json", "yaml")
MAX_IMPLICIT_KEY = 1000
"""YAML allows a key written inline ("implicit") 1024 characters at most."""


def render(data: Any, fmt: str) -> str:
    """``data`` (JSON values) as ``fmt``; ValueError naming the option for another format."""
    if fmt == "json":
        return json.dumps(data, sort_keys=False) + "\n"
    if fmt == "yaml":
        return "\n".join(_yaml(data, 0)) + "\n"
    raise ValueError(f"-o: expected one of {', '.join(FORMATS)}, got {fmt!r}")


def _yaml(data: Any, indent: int) -> list[str]:
    pad = " " * indent
    if isinstance(data, dict) and data:
        lines: list[str] = []
        for key, value in data.items():
            name = _quoted(str(key))
            if len(name) > MAX_IMPLICIT_KEY:  # YAML's limit: an explicit key instead
                lines.append(f"{pad}? {name}")
                name = ""
            if _nested(value):
                lines += [f"{pad}{name}:", *_yaml(value, indent + 2)]
            else:
                lines.append(f"{pad}{name}: {_scalar(value)}")
        return lines
    if isinstance(data, list) and data:
        lines = []
        for item in data:
            if _nested(item):
                inner = _yaml(item, indent + 2)
                lines += [f"{pad}- {inner[0].lstrip()}", *inner[1:]]
            else:
                lines.append(f"{pad}- {_scalar(item)}")
        return lines
    return [f"{pad}{_scalar(data)}"]


def _nested(value: Any) -> bool:
    return isinstance(value, dict | list) and bool(value)


def _scalar(value: Any) -> str:
    if isinstance(value, dict | list):  # empty
        return "{}" if isinstance(value, dict) else "[]"
    if isinstance(value, str):
        return _quoted(value)
    text = json.dumps(value)
    if isinstance(value, float) and "e" in text and "." not in text:
        text = text.replace("e", ".0e", 1)  # YAML 1.1 (PyYAML) reads 1e-06 as a string
    return text


def _quoted(text: str) -> str:
    out = []
    for ch in text:
        code = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif 0x20 <= code < 0x7F:
            out.append(ch)
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return '"' + "".join(out) + '"'
