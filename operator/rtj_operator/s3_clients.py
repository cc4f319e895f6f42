"""The operator's S3 clients: made once per set of credentials, then reused.

Making a boto3 client loads and parses botocore's JSON service model and endpoint rules,
tens of milliseconds of CPU each time. The operator used to read a job's checkpoint root
with a new client every time (a new Session with the job's credentials): in the goodput
soak that was half of the operator's CPU (py-spy, stop 26: 325 of 642 busy samples in
`Session.client`, on a machine whose two cores the trainers need).

A client may be shared between threads (boto3's documentation: clients are thread-safe,
sessions and resources are not), so one client per credential set serves every read of
every job that uses it. The key is the whole credential set with its endpoint and region:
a job's reads never use a client made with another job's secret, a rotated secret is a new
key, and beyond `MAX_CLIENTS` the least recently used client is dropped. Without a job's
credentials the operator's own environment is used (botocore refreshes credentials that
expire, a web identity's say, inside the one client).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

MAX_CLIENTS = 32
CREDENTIAL_KEYS = (
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION",
    "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL",
)  # fmt: skip
"""What a job's `checkpoint.credentialsSecretRef` can set that shapes its client."""

Key = tuple[tuple[str, str], ...]


def client_key(credentials: Mapping[str, str] | None) -> Key:
    """The cache key: every credential value that shapes the client (empty: the
    operator's own environment)."""
    if not credentials:
        return ()
    return tuple((k, credentials[k]) for k in CREDENTIAL_KEYS if credentials.get(k))


class S3Clients:
    """A bounded, thread-safe cache of S3 clients by credential set."""

    def __init__(self, limit: int = MAX_CLIENTS) -> None:
        self.limit = limit
        self._clients: OrderedDict[Key, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.made = 0
        """Clients made so far (a test's and an operator's look at the reuse)."""

    def client(self, credentials: Mapping[str, str] | None) -> Any:
        key = client_key(credentials)
        with self._lock:  # made under the lock: two reads of one job never make two
            if key in self._clients:
                self._clients.move_to_end(key)
                return self._clients[key]
            made = _make(dict(key))
            self.made += 1
            self._clients[key] = made
            while len(self._clients) > self.limit:
                self._clients.popitem(last=False)
            return made


def _make(credentials: Mapping[str, str]) -> Any:
    from rtj_shim.checkpoint.storage.s3 import client_config, make_client

    if not credentials:
        return make_client()
    import boto3

    session = boto3.session.Session(
        aws_access_key_id=credentials.get("AWS_ACCESS_KEY_ID"),
        aws_secret_access_key=credentials.get("AWS_SECRET_ACCESS_KEY"),
        aws_session_token=credentials.get("AWS_SESSION_TOKEN"),
        region_name=credentials.get("AWS_REGION") or credentials.get("AWS_DEFAULT_REGION"),
    )
    endpoint = credentials.get("AWS_ENDPOINT_URL_S3") or credentials.get("AWS_ENDPOINT_URL")
    return session.client("s3", endpoint_url=endpoint or None, config=client_config())
