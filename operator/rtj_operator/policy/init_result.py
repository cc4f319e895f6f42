"""What the resume init container reported: rtj-shim's JSON verdict, read. Pure.

`rtj-shim resolve --termination-log` writes one JSON object into the init container's
termination message: the step it verified (`step`, `uri`), the steps it passed over and why
(`skipped`), or `{"error": ...}` when the store could not be read or the arguments were
wrong. Anything else (an empty message after a crash) is no verdict at all.
"""

from __future__ import annotations

import functools

from rtj_shim.wire.resume_file import ResumeFile, ResumeFileError

InitResult = ResumeFile
"""What the resume init container (`rtj-shim resolve --termination-log`) reported: the shim's
resume file type (`rtj_shim.wire.resume_file`), read from its termination message."""


@functools.lru_cache(maxsize=1024)
def parse_init_result(message: str) -> InitResult | None:
    """The init container's termination message; None when it is not rtj-shim's verdict (a
    crash before it could report, an empty message, a field of the wrong kind): then nothing
    is known about the step. Kept per message (a plan reads every pod's, mostly the same
    text: ~0.05 s a plan at 1,250 pods, on every poll round)."""
    try:
        result = ResumeFile.parse(message)
    except ResumeFileError:
        return None
    return result if result.error is not None or result.pins_step else None
