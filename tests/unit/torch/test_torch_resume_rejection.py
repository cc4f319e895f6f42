"""A pinned step the restore refuses leaves its verdict beside the resume file, which an
in-place restart's supervisor reports so the operator marks the step bad."""

from __future__ import annotations

import json
from pathlib import Path

from rtj_shim.checkpoint.protocol import CommitProtocol
from rtj_shim.checkpoint.storage.filesystem import FilesystemStore
from rtj_shim.torch.restore import REJECTED_SUFFIX, durable_resume


def test_a_pinned_step_that_does_not_verify_is_refused_with_its_verdict_beside(
    tmp_path: Path,
) -> None:
    store = FilesystemStore(tmp_path / "root")
    payload = tmp_path / "payload"
    payload.mkdir()
    (payload / "state.bin").write_bytes(b"x" * 32)
    CommitProtocol(store, retention=None).publish_directory(40, payload)
    (store.root / "steps" / "step-000000000040" / "state.bin").write_bytes(b"y" * 32)
    resume = tmp_path / "resume-3.json"
    resume.write_text(json.dumps({"step": 40, "skipped": [], "source": "in-place restart"}))
    decision = durable_resume(store, resume, restored_once=False)
    assert "pins step 40, which does not verify" in decision["error"]
    verdict = json.loads(resume.with_name(resume.name + REJECTED_SUFFIX).read_text())
    assert verdict["step"] == 40 and "sha256" in verdict["reason"], verdict
    # a step that verifies leaves nothing
    fine = tmp_path / "fine"
    CommitProtocol(FilesystemStore(fine), retention=None).publish_directory(40, payload)
    ok = tmp_path / "resume-4.json"
    ok.write_text(json.dumps({"step": 40, "skipped": [], "source": "in-place restart"}))
    assert durable_resume(FilesystemStore(fine), ok, restored_once=False)["step"] == 40
    assert not ok.with_name(ok.name + REJECTED_SUFFIX).exists()
