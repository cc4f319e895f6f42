"""The operator's S3 clients: one per credential set, reused across reads and threads,
never shared between different credentials, bounded."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from rtj_operator import selection
from rtj_operator.s3_clients import S3Clients, client_key

TEAM_A = {"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "sa",
          "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9", "AWS_REGION": "us-east-1"}  # fmt: skip
TEAM_B = {**TEAM_A, "AWS_ACCESS_KEY_ID": "b", "AWS_SECRET_ACCESS_KEY": "sb"}


def test_one_client_per_credential_set_and_never_another_jobs() -> None:
    clients = S3Clients()
    a = clients.client(TEAM_A)
    assert clients.client(dict(TEAM_A)) is a, "the same secret's keys: the same client"
    b = clients.client(TEAM_B)
    assert b is not a
    assert b._request_signer._credentials.access_key == "b"
    assert a._request_signer._credentials.access_key == "a"
    assert a.meta.endpoint_url == "http://127.0.0.1:9"
    rotated = clients.client({**TEAM_A, "AWS_SECRET_ACCESS_KEY": "rotated"})
    assert rotated is not a, "a rotated secret is a new client"
    assert clients.made == 3


def test_the_key_ignores_what_does_not_shape_the_client() -> None:
    assert client_key(None) == client_key({}) == ()
    assert client_key({**TEAM_A, "UNRELATED": "x"}) == client_key(TEAM_A)
    assert client_key({**TEAM_A, "AWS_SESSION_TOKEN": ""}) == client_key(TEAM_A)


def test_threads_reading_at_once_share_one_client() -> None:
    clients = S3Clients()
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda _: clients.client(TEAM_A), range(32)))
    assert all(c is got[0] for c in got) and clients.made == 1


def test_the_least_recently_used_client_goes_beyond_the_limit() -> None:
    clients = S3Clients(limit=2)
    a = clients.client(TEAM_A)
    clients.client(TEAM_B)
    assert clients.client(TEAM_A) is a  # A used last: B is the oldest now
    clients.client({**TEAM_A, "AWS_ACCESS_KEY_ID": "c"})
    assert clients.client(TEAM_A) is a and clients.made == 3
    clients.client(TEAM_B)
    assert clients.made == 4, "B was dropped and made again"


def test_the_operators_store_reads_reuse_the_client(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(selection, "S3_CLIENTS", S3Clients())
    first = selection._open("s3://bucket/team-a/job", TEAM_A)
    second = selection._open("s3://bucket/team-a/other", TEAM_A)
    assert first.client is second.client and selection.S3_CLIENTS.made == 1
    assert (first.bucket, first.prefix) == ("bucket", "team-a/job")
