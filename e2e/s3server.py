"""A real S3 API server on loopback for the protocol tests: moto's server as a subprocess.

The server enforces authentication (SigV4 and IAM policies): at start an IAM user with an
``s3:*`` policy and one with no permissions are created, then ``/moto-api/reset-auth``
turns enforcement on, so wrong credentials and denied access are real server answers.

Fixtures (registered by this directory's conftest.py):

- ``s3_server`` (session): the running :class:`S3Server`; ``.url`` is the endpoint.
- ``s3_root`` (function): a fresh bucket; returns ``s3://<bucket>/some/prefix`` with
  ``AWS_ENDPOINT_URL_S3``, the credentials and the region set in the environment.
- ``s3_admin`` (function): a boto3 client with the allowed credentials, for tests that
  corrupt or inspect objects behind the store's back.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from botocore.config import Config

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

REGION = "us-east-1"
START_TIMEOUT_S = 30.0
_S3_POLICY = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
}


@dataclass(frozen=True)
class Credentials:
    access_key_id: str
    secret_access_key: str


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def closed_port() -> int:
    """A loopback port nothing listens on (bound and released; nothing reuses it at once)."""
    return free_port()


class S3Server:
    """``python -m moto.server`` on 127.0.0.1 and a free port, with authentication on."""

    def __init__(self, log_dir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log_path = log_dir / "moto-server.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self.allowed = Credentials("", "")
        self.denied = Credentials("", "")

    def start(self) -> S3Server:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env["MOTO_PORT"] = str(self.port)
        with self._log_path.open("wb") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        self._wait_ready()
        self.allowed = self._create_user("rtj-allowed", _S3_POLICY)
        self.denied = self._create_user("rtj-denied", None)
        self._post("/moto-api/reset-auth", b"0")  # from now on every request is checked
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise RuntimeError(f"moto server exited early:\n{self.log()}")
            try:
                with urllib.request.urlopen(f"{self.url}/moto-api/data.json", timeout=1):
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"moto server did not answer:\n{self.log()}") from None
                time.sleep(0.05)

    def _post(self, path: str, body: bytes) -> None:
        request = urllib.request.Request(
            f"{self.url}{path}", data=body, method="POST", headers={"Content-Type": "text/plain"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200, response.read()

    def _create_user(self, name: str, policy: dict[str, Any] | None) -> Credentials:
        iam = boto3.session.Session().client(
            "iam",
            endpoint_url=self.url,
            region_name=REGION,
            aws_access_key_id="bootstrap",
            aws_secret_access_key="bootstrap",  # auth is off until reset-auth
        )
        iam.create_user(UserName=name)
        if policy is not None:
            iam.put_user_policy(UserName=name, PolicyName="s3", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName=name)["AccessKey"]
        return Credentials(key["AccessKeyId"], key["SecretAccessKey"])

    def client(self, credentials: Credentials | None = None) -> S3Client:
        creds = credentials or self.allowed
        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.url,
            region_name=REGION,
            aws_access_key_id=creds.access_key_id,
            aws_secret_access_key=creds.secret_access_key,
            config=Config(
                retries={"max_attempts": 1},
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            ),
        )

    def create_bucket(self) -> str:
        bucket = f"rtj-{uuid.uuid4().hex[:16]}"
        self.client().create_bucket(Bucket=bucket)
        return bucket

    @property
    def pid(self) -> int:
        """The server process (0 when not running)."""
        return self._proc.pid if self._proc is not None else 0

    def log(self) -> str:
        try:
            return self._log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return "<no log>"

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def aws_env(url: str, credentials: Credentials) -> dict[str, str]:
    """The environment a trainer pod gets: endpoint, credentials, region; nothing from ~."""
    return {
        "AWS_ENDPOINT_URL_S3": url,
        "AWS_ACCESS_KEY_ID": credentials.access_key_id,
        "AWS_SECRET_ACCESS_KEY": credentials.secret_access_key,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
    }


_UNSET = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_MAX_ATTEMPTS")


def set_aws_env(monkeypatch: pytest.MonkeyPatch, url: str, credentials: Credentials) -> None:
    for name in _UNSET:
        monkeypatch.delenv(name, raising=False)
    for name, value in aws_env(url, credentials).items():
        monkeypatch.setenv(name, value)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    server = S3Server(tmp_path_factory.mktemp("moto")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_root(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> str:
    bucket = s3_server.create_bucket()
    set_aws_env(monkeypatch, s3_server.url, s3_server.allowed)
    return f"s3://{bucket}/some/prefix"


@pytest.fixture
def s3_admin(s3_server: S3Server) -> S3Client:
    return s3_server.client()
