"""The operator's JSON log lines: one parseable object per line, with the traceback."""

from __future__ import annotations

import json
import logging
import sys

from rtj_operator.logs import JsonFormatter


def _record(msg: str, *args: object, **extra: object) -> logging.LogRecord:
    record = logging.getLogger("rtj_operator.controller").makeRecord(
        "rtj_operator.controller", logging.WARNING, "controller.py", 1, msg, args, None,
        extra=extra or None,
    )  # fmt: skip
    record.created = 1_795_996_800.25
    return record


def test_a_line_is_one_json_object_with_time_level_logger_and_message() -> None:
    line = JsonFormatter().format(_record('%s: said "%s"\nand more', "team-a/llm", "hi"))
    assert "\n" not in line
    assert json.loads(line) == {
        "time": "2026-11-30T00:00:00.250+00:00",
        "level": "WARNING",
        "logger": "rtj_operator.controller",
        "message": 'team-a/llm: said "hi"\nand more',
    }


def test_extra_fields_and_the_traceback_are_kept() -> None:
    try:
        raise ValueError("bad spec")
    except ValueError:
        record = _record("reconcile failed", job="team-a/llm", attempt=3)
        record.exc_info = sys.exc_info()
    out = json.loads(JsonFormatter().format(record))
    assert out["job"] == "team-a/llm" and out["attempt"] == 3
    assert out["exception"].startswith("Traceback") and "ValueError: bad spec" in out["exception"]
