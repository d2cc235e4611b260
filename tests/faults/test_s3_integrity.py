"""S3 archive integrity against a real proxy process: wrong bytes from the object store never go out whole,
and a malformed answer of the object store is a clear JSON error, not a crash.

The proxy reaches the S3 server (moto over HTTPS) through a relay (`tests/fakes/stalling_s3.py`) that flips
one byte in the middle of object bodies (a faulty store or network path) or leaves headers out of its
answers (a malformed answer), on request of the test.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.fakes.packages import Release
from tests.fakes.process import ProxyProcess, wait_for
from tests.fakes.stalling_s3 import StallingFront

# The checksums S3 keeps of an object uploaded in one part (botocore checks them when they come with the
# body): a faulty store or path that sends none leaves the proxy's own hash as the only check.
CHECKSUMS = frozenset(
    f"x-amz-checksum-{name}" for name in ("crc32", "crc32c", "crc64nvme", "sha1", "sha256", "type", "mode")
)
BIG = "/mirror/v1/registry.example.test/acme/big/2.0.0/linux_amd64/terraform-provider-big_2.0.0_linux_amd64.zip"


@pytest.fixture
def big(registry, signing_key) -> Release:
    """A provider whose archive spans several serving chunks."""
    return registry.add(Release("acme", "big", "2.0.0", signing_key, platforms=("linux_amd64",), noise=3 << 20))


@pytest.fixture
def front(s3_server, upstream_ssl, client_ssl):
    relay = StallingFront(s3_server.url, upstream_ssl, client_ssl)
    relay.start()
    yield relay
    relay.stop()


def through(front: StallingFront, s3_server, bucket: str) -> list[str]:
    """`serve` flags for the bucket, reached through the relay."""
    flags = s3_server.flags(bucket)
    flags[flags.index("--s3-endpoint-url") + 1] = front.url
    return flags


def object_gets(sha: str):
    return lambda request: request.method == "GET" and request.path.endswith("/" + sha)


def corrupt(front: StallingFront, sha: str) -> None:
    """Flip a byte in the middle of the object's GET bodies, sent without the object's checksums."""
    front.corrupt_body = object_gets(sha)
    front.drop_headers = (object_gets(sha), CHECKSUMS)


def object_heads(sha: str):
    return lambda request: request.method == "HEAD" and request.path.endswith("/" + sha)


async def get_or_abort(client, path: str) -> tuple[int | None, bytes | None]:
    """(status, body), or (None, None) when the proxy cut the response off."""
    try:
        status, _, body = await client.get(path)
    except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
        return None, None
    return status, body


def corruptions(proc: ProxyProcess, sha: str) -> list[dict]:
    return [e for e in proc.events("security.store_corruption") if e.get("sha256") == sha]


async def test_corrupted_object_bytes_are_cut_on_every_serve_not_only_the_first(
    in_process_proxy, connect, registry, big, front, s3_server, s3_bucket
):
    data, sha = big.zips["linux_amd64"], big.sha256("linux_amd64")
    flags = through(front, s3_server, s3_bucket)
    first = await in_process_proxy(*flags)
    assert await get_or_abort(await connect(first), BIG) == (200, data)  # fetched, verified, uploaded
    await first.stop()

    proc = await in_process_proxy(*flags)  # a fresh process: nothing found intact yet
    client = await connect(proc)
    corrupt(front, sha)
    assert await get_or_abort(client, BIG) == (None, None)  # cut before its end
    assert front.corrupted == 1
    await wait_for(lambda: len(corruptions(proc, sha)) == 1, 10, "the corruption logged")

    front.corrupt_body = front.drop_headers = None
    assert await get_or_abort(client, BIG) == (200, data)  # quarantined: fetched, verified, uploaded again
    assert await get_or_abort(client, BIG) == (200, data)  # a clean serve from the bucket
    assert registry.count(registry.archive_path(big, "linux_amd64")) == 2

    corrupt(front, sha)
    status, body = await get_or_abort(client, BIG)
    assert front.corrupted == 2
    assert (status, body) == (None, None), "a corrupted transfer went out whole after a clean serve"
    await wait_for(lambda: len(corruptions(proc, sha)) == 2, 10, "the second corruption logged")

    front.corrupt_body = front.drop_headers = None
    assert await get_or_abort(client, BIG) == (200, data)
    assert not proc.events("request.crashed")


async def test_a_head_answer_without_content_length_is_a_json_error_not_a_crash(
    proxy_process, connect, registry, big, front, s3_server, s3_bucket
):
    data, sha = big.zips["linux_amd64"], big.sha256("linux_amd64")
    proc = await proxy_process(*through(front, s3_server, s3_bucket))
    client = await connect(proc)
    assert await get_or_abort(client, BIG) == (200, data)

    front.drop_headers = (object_heads(sha), frozenset({"content-length"}))
    async with client.session.get(proc.url + BIG) as response:
        status, body = response.status, await response.json(content_type=None)
    assert status == 503, body
    assert "malformed answer to HEAD" in body["errors"][0] and "ContentLength missing" in body["errors"][0], body
    assert not proc.events("request.crashed")
    assert "Traceback" not in proc.log_path.read_text()

    front.drop_headers = None
    assert await get_or_abort(client, BIG) == (200, data)
    assert registry.count(registry.archive_path(big, "linux_amd64")) == 1  # nothing was lost over it


async def test_a_slow_client_gets_the_whole_archive_from_an_object_store_that_closes_after_each_answer(
    in_process_proxy, connect, registry, signing_key, s3_server, s3_bucket
):
    """moto (like any server that closes a connection after its answer) sends the end of a body and closes;
    uvloop, the proxy's event loop, drops what it had received but not yet handed on when that close arrives
    while reading is paused for a slow client (its sslproto shuts down at once). The proxy then fetches the
    rest of the body (the same object, from where it stopped): the client still gets the archive whole."""
    huge = registry.add(Release("acme", "big", "2.0.0", signing_key, platforms=("linux_amd64",), noise=12 << 20))
    data = huge.zips["linux_amd64"]
    proc = await in_process_proxy(*s3_server.flags(s3_bucket))
    client = await connect(proc)
    assert await get_or_abort(client, BIG) == (200, data)  # fetched, verified, uploaded
    received = bytearray()
    async with client.session.get(proc.url + BIG) as response:
        assert response.status == 200
        async for chunk in response.content.iter_chunked(64 * 1024):
            received += chunk
            await asyncio.sleep(0.01)  # a client slower than the object store
    assert len(received) == len(data) and bytes(received) == data
    assert registry.count(registry.archive_path(huge, "linux_amd64")) == 1
    assert not proc.events("request.failed")
