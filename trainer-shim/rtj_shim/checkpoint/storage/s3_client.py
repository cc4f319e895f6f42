"""The S3 client the backend uses, and how its errors become StoreError.

* :func:`client_config` / :func:`make_client`: bounded retries and timeouts, the standard
  AWS environment, botocore's own request checksums off (this backend sends SHA-256
  checksums it computed itself).
* :func:`sign_checksummed_bodies_once`: a request that carries the SHA-256 of its body in
  the ``x-amz-checksum-sha256`` header is signed with ``UNSIGNED-PAYLOAD`` instead of a
  second SHA-256 of the same body. The header is one of the signed headers, and S3 refuses
  a body that does not match it, so the body is exactly as protected as by a signed
  payload hash; botocore otherwise hashes every body again for SigV4 (always over http,
  and over https whenever the checksum header was supplied by the caller).
* :func:`s3_errors`: every boto3/botocore (and local file) error as
  :class:`rtj_shim.errors.StoreError` naming the bucket, the key and the S3 error code.
"""

from __future__ import annotations

import base64
import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from rtj_shim.errors import StoreError

if TYPE_CHECKING:
    from botocore.config import _RetryDict, _S3Dict
    from mypy_boto3_s3 import S3Client

# A conditional write lost: 412 PreconditionFailed, or 409 ConditionalRequestConflict when
# another conditional write to the key was in flight.
CONDITION_FAILED = frozenset({"PreconditionFailed", "ConditionalRequestConflict", "412", "409"})
# HEAD answers a bare 404 without an error body; GET answers NoSuchKey.
NOT_FOUND = frozenset({"NoSuchKey", "NotFound", "404"})
CHECKSUM_HEADER = "x-amz-checksum-sha256"
_CHECKSUMMED_OPERATIONS = ("PutObject", "UploadPart")


def client_config() -> Config:
    """Bounded retries and timeouts, so an unreachable endpoint fails in bounded time.

    ``AWS_MAX_ATTEMPTS`` / ``AWS_RETRY_MODE``, when set, win over the defaults here.
    Checksums are ones this module computes and sends itself (SHA-256), so botocore's own
    request checksums (CRC32 by default) and response validation are turned off; object
    content is verified by hashing it locally.
    """
    retries: _RetryDict = {}
    if not os.environ.get("AWS_MAX_ATTEMPTS"):
        retries["max_attempts"] = 3
    if not os.environ.get("AWS_RETRY_MODE"):
        retries["mode"] = "standard"
    return Config(
        connect_timeout=10,
        read_timeout=60,
        retries=retries or None,
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        user_agent_extra="rtj-shim",
    )


def make_client() -> S3Client:
    """An S3 client from the standard AWS environment.

    botocore itself reads credentials (``AWS_ACCESS_KEY_ID``, profiles, web identity, ...),
    the region and the endpoint: ``AWS_ENDPOINT_URL_S3`` and then ``AWS_ENDPOINT_URL``
    (botocore >= 1.31, see ``botocore.configprovider``), unless
    ``AWS_IGNORE_CONFIGURED_ENDPOINT_URLS`` is set.
    """
    with s3_errors("creating S3 client for", "the configured endpoint"):
        return boto3.session.Session().client("s3", config=client_config())


def sign_checksummed_bodies_once(client: S3Client) -> None:
    """Register :func:`_unsigned_payload_when_checksummed` on ``client`` (idempotent)."""
    for operation in _CHECKSUMMED_OPERATIONS:
        client.meta.events.register(
            f"before-sign.s3.{operation}",
            _unsigned_payload_when_checksummed,
            unique_id=f"rtj-shim-sign-once-{operation}",
        )


def _unsigned_payload_when_checksummed(request: Any, **_: Any) -> None:
    """before-sign handler: no second SHA-256 of a body whose SHA-256 is in a signed header.

    Only for this request, and never where the client's configuration decides payload
    signing explicitly (``Config(s3={"payload_signing_enabled": ...})``)."""
    if CHECKSUM_HEADER not in request.headers:
        return
    config = request.context.get("client_config")
    if not isinstance(config, Config):
        return
    s3 = cast("_S3Dict", dict(getattr(config, "s3", None) or {}))
    if s3.get("payload_signing_enabled") is not None:
        return
    s3["payload_signing_enabled"] = False
    request.context["client_config"] = config.merge(Config(s3=s3))


def error_code(exc: ClientError) -> str:
    error = exc.response.get("Error", {})
    code = error.get("Code")
    if code:
        return str(code)
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return str(status) if status is not None else "Unknown"


def describe_client_error(exc: ClientError, bucket: str) -> str:
    code = error_code(exc)
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    message = exc.response.get("Error", {}).get("Message") or ""
    detail = f"{code} (HTTP {status})" if status is not None else code
    if message and message != code:
        detail = f"{detail}: {message}"
    if code == "NoSuchBucket":
        return f"bucket {bucket!r} does not exist ({detail})"
    if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken"):
        return f"credentials rejected ({detail})"
    if code in ("AccessDenied", "403"):
        return f"access denied ({detail})"
    return detail


@contextlib.contextmanager
def s3_errors(what: str, where: str, bucket: str = "") -> Iterator[None]:
    """Translate boto3/botocore (and local file) errors into StoreError."""
    try:
        yield
    except ClientError as exc:
        raise StoreError(f"{what} {where}: {describe_client_error(exc, bucket)}") from exc
    except BotoCoreError as exc:
        raise StoreError(f"{what} {where}: {type(exc).__name__}: {exc}") from exc
    except OSError as exc:
        raise StoreError(f"{what} {where}: {exc.strerror or exc}") from exc


def b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode("ascii")
