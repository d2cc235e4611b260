"""A stalled object store holds nobody for long (`--s3-timeout`): the real S3 server behind a relay that stalls.

(And the S3 server of the tests itself never stalls, however many requests the session sends it.)

Before the first byte, a request fails after two attempts of at most `--s3-timeout` each (a JSON 503
from the proxy); a body that stops mid-way is cut off (the client never sees it end normally). The
tests set a 2 s timeout (the default, 20 s, is checked in tests/unit/test_archive_store_config.py) and
wait on the relay's events; with the old settings (60 s per read, four attempts) every one of them would
run into its own 60 s limit instead.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time

import pytest
from botocore.config import Config

from proxy.errors import StoreUnavailableError
from proxy.settings.config import parse_s3_location
from proxy.storage.s3 import ATTEMPTS, RESUMES, S3Options, S3Store
from tests.conftest import serve_proxy
from tests.fakes.packages import Release
from tests.fakes.s3_server import REGION
from tests.fakes.stalling_s3 import StallingFront

TIMEOUT = 2.0
LIMIT = 60  # what a test waits at most: far above 2 x TIMEOUT, far below the old 3 x 60 s
PREFIX = "archives/"
BIG = "/mirror/v1/registry.example.test/acme/big/2.0.0/linux_amd64/terraform-provider-big_2.0.0_linux_amd64.zip"


@pytest.fixture
def front(s3_server, upstream_ssl, client_ssl):
    relay = StallingFront(s3_server.url, upstream_ssl, client_ssl)
    relay.start()
    yield relay
    relay.stop()


@pytest.fixture
async def store(front, s3_server, s3_bucket, tmp_path):
    """An S3 store reaching the bucket through the relay."""
    opened = S3Store(
        tmp_path,
        parse_s3_location(f"s3://{s3_bucket}/archives"),
        S3Options(endpoint_url=front.url, region=REGION, path_style=True, ca_file=s3_server.ca_file, timeout=TIMEOUT),
    )
    await opened.open()
    yield opened
    await opened.close()


def put_object(s3_server, bucket: str, data: bytes) -> str:
    sha = hashlib.sha256(data).hexdigest()
    s3_server.client.put_object(Bucket=bucket, Key=PREFIX + sha, Body=data)
    return sha


def for_key(sha: str, method: str | None = None):
    return lambda request: request.path.endswith(sha) and method in (None, request.method)


async def test_a_store_that_never_answers_fails_after_two_bounded_attempts(store, front, s3_server, s3_bucket):
    sha = put_object(s3_server, s3_bucket, b"archive")
    assert (await store.get(sha)).size == 7
    front.stall_requests = for_key(sha)
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError, match=r"(?i)timeout"):
        await asyncio.wait_for(store.get(sha), LIMIT)
    assert front.stalled.is_set() and front.stalls == ATTEMPTS == 2  # retried once, not more
    assert time.monotonic() - started < LIMIT / 2


async def test_a_body_that_stalls_mid_way_is_cut_off(store, front, s3_server, s3_bucket):
    data = os.urandom(1 << 20)
    sha = put_object(s3_server, s3_bucket, data)
    stored = await store.get(sha)
    front.stall_body_after = (for_key(sha, "GET"), 300_000)
    received = bytearray()

    async def read() -> None:
        reader = await store.open_reader(stored, 0, stored.size)
        try:
            async for chunk in reader.chunks(65536):
                received.extend(chunk)
        finally:
            reader.close()

    with pytest.raises(StoreUnavailableError, match=r"(?i)timeout"):
        await asyncio.wait_for(read(), LIMIT)
    assert front.stalls == 1  # a body is never read again from the start
    assert 0 < len(received) <= 300_000 and bytes(received) == data[: len(received)]


async def test_the_proxy_cuts_a_stalled_body_and_answers_503_to_a_stalled_store(
    make_local_settings, client_ssl, registry, signing_key, front, s3_server, s3_bucket
):
    big = registry.add(Release("acme", "big", "2.0.0", signing_key, platforms=("linux_amd64",), noise=2 << 20))
    data, sha = big.zips["linux_amd64"], big.sha256("linux_amd64")
    settings = make_local_settings(
        **{**s3_server.settings(s3_bucket), "s3_endpoint_url": front.url, "s3_timeout": TIMEOUT}
    )
    async with serve_proxy(settings, client_ssl) as proxy:
        status, _, body = await proxy.get(BIG)  # fetched, verified, uploaded through the relay
        assert (status, body) == (200, data)

        front.stall_body_after = (for_key(sha, "GET"), 500_000)
        async with proxy.session.get(proxy.url + BIG) as response:
            assert response.status == 200  # the status line went out before the stall
            received = bytearray()
            with pytest.raises(Exception) as cut:
                async with asyncio.timeout(LIMIT):
                    async for chunk in response.content.iter_any():
                        received.extend(chunk)
                    await response.read()
            assert not isinstance(cut.value, TimeoutError), "the stalled body was not cut off"
        assert front.stalled.is_set() and len(received) < len(data)

        front.stall_body_after = None
        front.stalled.clear()
        front.stall_requests = for_key(sha)
        started = time.monotonic()
        async with asyncio.timeout(LIMIT):
            status, body = await proxy.json(BIG)
        assert (status, body["code"]) == (503, "store_unavailable"), body
        assert front.stalled.is_set() and time.monotonic() - started < LIMIT / 2


async def test_a_body_cut_off_early_is_taken_up_again_where_it_stopped(store, front, s3_server, s3_bucket):
    data = os.urandom(3 << 20)
    sha = put_object(s3_server, s3_bucket, data)
    stored = await store.get(sha)
    gets = for_key(sha, "GET")
    front.cut_body_after = (lambda request: gets(request) and front.cuts < 2, 1_000_000)  # the first two GETs
    reader = await store.open_reader(stored, 10, stored.size - 10)
    try:
        received = b"".join([chunk async for chunk in reader.chunks(256 * 1024)])
    finally:
        reader.close()
    assert front.cuts == 2 and received == data[10:]


async def test_a_body_cut_off_again_and_again_fails(store, front, s3_server, s3_bucket):
    sha = put_object(s3_server, s3_bucket, os.urandom(1 << 20))
    stored = await store.get(sha)
    front.cut_body_after = (for_key(sha, "GET"), 1000)
    reader = await store.open_reader(stored, 0, stored.size)
    try:
        with pytest.raises(StoreUnavailableError, match="reading from the archive store failed"):
            async for _ in reader.chunks(256 * 1024):
                pass
    finally:
        reader.close()
    assert front.cuts == 1 + RESUMES


def test_the_test_s3_server_keeps_answering_however_much_it_was_asked(s3_server, s3_bucket):
    """Its request log once went to a pipe nobody read: full after ~64 KiB of log lines, it blocked every request
    (each of these would log over 1 KiB: 80 of them more than fill it)."""
    client = s3_server.client_with(Config(connect_timeout=10, read_timeout=10, retries={"total_max_attempts": 1}))
    for number in range(80):
        with pytest.raises(client.exceptions.ClientError, match="404"):
            client.head_object(Bucket=s3_bucket, Key=f"{number}-" + "k" * 1000)
