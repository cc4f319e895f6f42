from __future__ import annotations

import json

from rtj_shim.cli import TERMINATION_MESSAGE_LIMIT, termination_message


def test_small_result_is_kept_whole() -> None:
    body: dict[str, object] = {"step": 1, "uri": "s3://b/p", "verification": "deep", "skipped": []}
    assert json.loads(termination_message(body)) == body


def test_long_skip_list_is_trimmed_to_the_kubelet_limit() -> None:
    skipped = [{"step": i, "reason": "x" * 200} for i in range(100)]
    body: dict[str, object] = {"step": 5, "uri": "u", "verification": "deep", "skipped": skipped}
    raw = termination_message(body)
    assert len(raw) <= TERMINATION_MESSAGE_LIMIT
    parsed = json.loads(raw)
    assert parsed["step"] == 5 and parsed["skipped_truncated"] is True
    assert parsed["skipped"] == skipped[: len(parsed["skipped"])]


def test_huge_error_is_cut_but_stays_json() -> None:
    raw = termination_message({"error": "e" * 10_000})
    assert len(raw) <= TERMINATION_MESSAGE_LIMIT
    assert json.loads(raw)["truncated"] is True
