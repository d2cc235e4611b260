"""Cold archives go out as they download, their last chunk held back until they are verified."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import ssl

import aiohttp
import pytest
from structlog.testing import capture_logs

from proxy.domain.hashes import h1_of_zip
from proxy.services.live_downloads import HOLD_BACK
from proxy.storage import LOCK_NAME
from proxy.web.app_keys import SETTINGS
from tests.conftest import REGISTRY_HOST
from tests.fakes.packages import Release

WAIT = 10  # seconds for an awaited event: only a broken proxy takes that long
MiB = 2**20
BIG_VERSION = f"/mirror/v1/{REGISTRY_HOST}/acme/big/2.0.0.json"
BIG = f"/mirror/v1/{REGISTRY_HOST}/acme/big/2.0.0/linux_amd64/terraform-provider-big_2.0.0_linux_amd64.zip"


@pytest.fixture
def big(registry, signing_key) -> Release:
    """A provider whose archive (3 MiB of stored random data) is many chunks long."""
    return registry.add(Release("acme", "big", "2.0.0", signing_key, platforms=("linux_amd64",), noise=3 * MiB))


def stored(proxy) -> list:
    """Every file of the archive store: published, or a download's temp file."""
    root = proxy.app[SETTINGS].archive_dir
    return [p for p in root.rglob("*") if p.is_file() and p.name != LOCK_NAME]


def published(proxy) -> list[str]:
    return [p.name for p in stored(proxy) if p.parent.parent.parent.name == "sha256"]


async def test_first_bytes_reach_the_client_before_the_upstream_finished(proxy, registry, big):
    body = big.zips["linux_amd64"]
    path = registry.archive_path(big, "linux_amd64")
    registry.trickle[path] = MiB  # bytes per second: the upstream takes about three seconds
    async with proxy.session.get(proxy.url + BIG) as response:
        assert response.status == 200
        assert int(response.headers["Content-Length"]) == len(body)
        assert response.headers["ETag"] == f'"{big.sha256("linux_amd64")}"'
        first = await asyncio.wait_for(response.content.readexactly(HOLD_BACK), WAIT)
        assert first == body[:HOLD_BACK]
        assert registry.completed_count(path) == 0  # the upstream is still sending
        assert published(proxy) == []
        rest = await asyncio.wait_for(response.read(), WAIT)
    assert first + rest == body
    assert published(proxy) == [big.sha256("linux_amd64")]


async def test_a_tampered_archive_is_cut_short_and_not_stored(proxy, registry, big):
    body = big.zips["linux_amd64"]
    registry.tampered.add(big.filename("linux_amd64"))
    # About 0.75 s upstream: the download must still be running when the proxy starts to stream (its SHA256SUMS
    # verified, the provider's signing key checked); one that ended first is refused whole (a 502), not cut short.
    registry.trickle[registry.archive_path(big, "linux_amd64")] = 4 * MiB
    received = b""
    with capture_logs() as logs:
        async with proxy.session.get(proxy.url + BIG) as response:
            assert response.status == 200  # the headers went out with the first bytes
            assert int(response.headers["Content-Length"]) == len(body)
            with pytest.raises(aiohttp.ClientPayloadError):
                while chunk := await response.content.read(1 << 16):
                    received += chunk
    assert 0 < len(received) <= len(body) - HOLD_BACK  # never the whole body, never the tampered end
    assert received == body[: len(received)]
    assert stored(proxy) == []
    assert [e["check"] for e in logs if e["event"] == "security.verification_failed"] == ["archive"]

    registry.tampered.clear()  # nothing bad was remembered
    status, _, data = await proxy.get(BIG)
    assert status == 200 and data == body


async def test_concurrent_cold_clients_follow_one_download(proxy, registry, big):
    body = big.zips["linux_amd64"]
    path = registry.archive_path(big, "linux_amd64")
    hold = registry.hold(path)

    async def fetch() -> bytes:
        async with proxy.session.get(proxy.url + BIG) as response:
            assert response.status == 200 and int(response.headers["Content-Length"]) == len(body)
            return await response.read()

    clients = [asyncio.create_task(fetch()) for _ in range(10)]
    await asyncio.wait_for(hold.started.wait(), WAIT)
    registry.archive_chunk_delay = 0.01
    hold.release.set()
    results = await asyncio.wait_for(asyncio.gather(*clients), WAIT)
    assert all(hashlib.sha256(r).hexdigest() == big.sha256("linux_amd64") for r in results)
    assert registry.count(path) == 1
    status, headers, again = await proxy.get(BIG)  # warm now: served from the store
    assert (status, again) == (200, body) and headers["Accept-Ranges"] == "bytes"
    assert registry.count(path) == 1


async def test_ranges_wait_for_the_stored_archive(proxy, registry, big):
    body = big.zips["linux_amd64"]
    path = registry.archive_path(big, "linux_amd64")
    registry.archive_chunk_delay = 0.01
    async with proxy.session.get(proxy.url + BIG, headers={"Range": "bytes=10-19"}) as response:
        assert response.status == 206 and await response.read() == body[10:20]
    assert registry.count(path) == 1


async def test_a_head_is_answered_once_the_download_is_under_way_and_the_get_follows_it(proxy, registry, big):
    """terraform sends HEAD before GET: the HEAD does not wait for the whole archive, and (no Accept-Ranges)
    the GET after it asks for the whole body, which follows the same download."""
    body = big.zips["linux_amd64"]
    path = registry.archive_path(big, "linux_amd64")
    hold = registry.hold(path)  # the upstream's body waits until the test releases it
    async with proxy.session.head(proxy.url + BIG) as response:
        assert response.status == 200
        assert int(response.headers["Content-Length"]) == len(body)
        assert response.headers["ETag"] == f'"{big.sha256("linux_amd64")}"'
        assert "Accept-Ranges" not in response.headers
    assert hold.started.is_set() and registry.completed_count(path) == 0  # answered before the archive arrived
    registry.trickle[path] = MiB  # bytes per second: the upstream takes about three seconds once released
    hold.release.set()  # the GET's headers go out with the first bytes it relays
    async with proxy.session.get(proxy.url + BIG) as response:
        assert response.status == 200 and int(response.headers["Content-Length"]) == len(body)
        assert "Range" not in response.request_info.headers
        first = await asyncio.wait_for(response.content.readexactly(HOLD_BACK), WAIT)
        assert registry.completed_count(path) == 0  # followed while the upstream is still sending
        assert first + await asyncio.wait_for(response.read(), WAIT) == body
    assert registry.count(path) == 1
    async with proxy.session.head(proxy.url + BIG) as response:  # warm: the stored archive's headers
        assert response.status == 200 and response.headers["Accept-Ranges"] == "bytes"
    assert published(proxy) == [big.sha256("linux_amd64")]


async def test_a_head_of_a_tampered_cold_archive_is_followed_by_no_body(proxy, registry, big):
    """The HEAD's early 200 promises nothing unverified: the GET after it is cut short and nothing is stored."""
    registry.tampered.add(big.filename("linux_amd64"))
    async with proxy.session.head(proxy.url + BIG) as response:
        assert response.status == 200
    async with proxy.session.get(proxy.url + BIG) as response:
        if response.status == 200:  # the headers went out while following: the body is cut short
            with pytest.raises(aiohttp.ClientPayloadError):
                await response.read()
        else:  # the download had failed by then: an error answer
            assert response.status == 502
    assert stored(proxy) == []


async def test_workers_and_replicas_follow_one_download_in_any_process(proxy_process, registry, big, tmp_path):
    """Two replicas of two workers each on one data dir: the first request starts the download in one
    process; the others, in whichever worker of either replica takes them, get bytes before it ends.
    Requests to the second replica cannot be in the downloading process, so it must follow another's."""
    body = big.zips["linux_amd64"]
    path = registry.archive_path(big, "linux_amd64")
    registry.trickle[path] = MiB  # bytes per second: the upstream takes about three seconds
    shared = tmp_path / "shared-data"
    first = await proxy_process("--workers", "2", data_dir=shared)
    second = await proxy_process("--workers", "2", data_dir=shared)
    async with asyncio.timeout(4 * WAIT):
        while len(first.events("worker.started")) < 2 or len(second.events("worker.started")) < 2:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    context = ssl.create_default_context(cafile=str(first.ca_file))
    early: list[bool] = []
    started = asyncio.Event()

    async def fetch(proc) -> bytes:
        async with (
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session,
            session.get(proc.url + BIG, ssl=context) as response,
        ):
            assert response.status == 200 and int(response.headers["Content-Length"]) == len(body)
            first_byte = await response.content.readexactly(1)
            early.append(registry.completed_count(path) == 0)
            started.set()
            return first_byte + await response.read()

    lead = asyncio.create_task(fetch(first))
    await asyncio.wait_for(started.wait(), 4 * WAIT)
    others = [fetch(first) for _ in range(9)] + [fetch(second) for _ in range(10)]
    results = await asyncio.wait_for(asyncio.gather(lead, *others), 4 * WAIT)
    assert all(r == body for r in results)
    assert early == [True] * 20  # every client had bytes before the upstream finished, in any process
    assert registry.count(path) == 1
    assert second.events("archive.following_another_process")
    assert list((shared / "archives" / "growing").iterdir()) == []


def version_hashes(body: bytes) -> set[str]:
    return {h for h in json.loads(body)["archives"]["linux_amd64"]["hashes"] if h.startswith("h1:")}


async def test_the_h1_of_a_cold_archive_is_hashed_as_it_streams(proxy, registry, big):
    """Its members are hashed from the stream: after the download only the central directory is read."""
    body = big.zips["linux_amd64"]
    with capture_logs() as logs:
        status, _, data = await proxy.get(BIG)
    assert status == 200 and data == body
    assert [e["members"] for e in logs if e["event"] == "archive.h1_streamed"] == [2]
    assert not [e for e in logs if e["event"] == "archive.h1_not_streamed"]
    status, _, doc = await proxy.get(BIG_VERSION)
    assert status == 200 and version_hashes(doc) == set(map(str, h1_of_zip(io.BytesIO(body))))


async def test_an_archive_the_stream_cannot_vouch_for_is_hashed_from_its_central_directory(proxy, registry, big):
    """Junk before the first member (zipfile reads past it, the clients too): the streamed digests are refused
    and the h1 is the central directory's, as before."""
    zipped = big.zips["linux_amd64"]
    big.zips["linux_amd64"] = body = b"\x00" * 4096 + zipped
    big.resign()
    with capture_logs() as logs:
        status, _, data = await proxy.get(BIG)
    assert status == 200 and data == body
    assert [e["reason"] for e in logs if e["event"] == "archive.h1_not_streamed"] == [
        "no local file header at offset 0"
    ]
    status, _, doc = await proxy.get(BIG_VERSION)
    assert status == 200 and version_hashes(doc) == set(map(str, h1_of_zip(io.BytesIO(zipped))))
