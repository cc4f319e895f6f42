"""A checkpoint root is parsed strictly in one place (`rtj_shim.checkpoint.storage.open_store`),
and a library caller's error names the library's argument, not the CLI's flag (issue 44)."""

from __future__ import annotations

import pytest

from rtj_shim.checkpoint.storage import open_store
from rtj_shim.errors import Refused, UsageError


@pytest.mark.parametrize(
    ("root", "message"),
    [
        ("", "root: expected a path, file://PATH or s3://BUCKET/PREFIX, got ''"),
        ("gs://bucket/x", "root: unsupported scheme 'gs' in 'gs://bucket/x'"),
        ("file://host/x", "root: file:// URIs must not name a host"),
        ("s3:/bucket/x", "root: 's3:/bucket/x' starts like a URI (s3:) without '//'"),
    ],
)
def test_a_library_callers_root_error_names_root(root: str, message: str) -> None:
    with pytest.raises(UsageError) as err:
        open_store(root)
    assert str(err.value).startswith(message), err.value
    assert "--root" not in str(err.value)


@pytest.mark.parametrize(
    ("root", "message"),
    [
        ("s3://", "root: 's3://' names no bucket"),
        ("s3://-bucket/x", "root: bucket: '-bucket' is not a valid S3 bucket name"),
        ("s3://bucket/a//b", "root: prefix: S3 prefix 'a//b' has empty"),
        ("s3://bucket/x?v=1", "root: 's3://bucket/x?v=1': query strings"),
    ],
)
def test_an_s3_root_is_refused_naming_the_argument_and_what_is_wrong(
    root: str, message: str
) -> None:
    with pytest.raises(Refused) as err:
        open_store(root)
    assert str(err.value).startswith(message), err.value


def test_the_cli_names_its_flag() -> None:
    with pytest.raises(UsageError, match=r"^--root: unsupported scheme 'gs'"):
        open_store("gs://b/x", "--root")
