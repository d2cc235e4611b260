"""Archive serving: cold/warm, one upstream fetch, HEAD, Range, ETag, client disconnects."""

from __future__ import annotations

import asyncio
import hashlib
import json

import pytest
from aiohttp import web
from multidict import CIMultiDict

from tests.conftest import PROVIDER, serve_proxy

# The metadata store does not matter to what these tests check (the contract suites, the warm-path,
# freshness and failure tests run over both): the embedded store only.
pytestmark = pytest.mark.one_metadata_store


WAIT = 10  # seconds for an awaited event: only a broken proxy takes that long
ARCHIVE = f"/mirror/v1/{PROVIDER}/1.0.0/linux_amd64/terraform-provider-foo_1.0.0_linux_amd64.zip"


def release_of(registry):
    return registry.releases[("acme", "foo")]["1.0.0"]


async def test_cold_then_warm_archive_is_fetched_once(proxy, registry):
    release = release_of(registry)
    status, headers, body = await proxy.get(ARCHIVE)
    assert status == 200
    assert body == release.zips["linux_amd64"]
    assert headers["ETag"] == f'"{release.sha256("linux_amd64")}"'
    assert headers["Content-Type"] == "application/zip"
    assert int(headers["Content-Length"]) == len(body)
    status, _, again = await proxy.get(ARCHIVE)
    assert (status, again) == (200, body)
    assert registry.count(registry.archive_path(release, "linux_amd64")) == 1


async def test_head_then_get_downloads_once(proxy, registry):
    release = release_of(registry)
    async with proxy.session.head(proxy.url + ARCHIVE) as response:
        assert response.status == 200
        assert int(response.headers["Content-Length"]) == len(release.zips["linux_amd64"])
        # A cold HEAD may be answered while the archive downloads, then without Accept-Ranges
        # (test_cold_streaming.py): the GET after it asks for the whole body.
        assert response.headers["ETag"] == f'"{release.sha256("linux_amd64")}"'
        assert await response.read() == b""
    status, _, body = await proxy.get(ARCHIVE)
    assert status == 200 and body == release.zips["linux_amd64"]
    assert registry.count(registry.archive_path(release, "linux_amd64")) == 1


async def test_range_and_conditional_requests(proxy, registry):
    data = release_of(registry).zips["linux_amd64"]
    status, headers, body = await proxy.get(ARCHIVE, headers={"Range": "bytes=10-19"})
    assert (status, body) == (206, data[10:20])
    assert headers["Content-Range"] == f"bytes 10-19/{len(data)}"
    status, _, body = await proxy.get(ARCHIVE, headers={"Range": "bytes=-5"})
    assert (status, body) == (206, data[-5:])
    status, headers, _ = await proxy.get(ARCHIVE, headers={"Range": f"bytes={len(data)}-"})
    assert status == 416 and headers["Content-Range"] == f"bytes */{len(data)}"
    etag = f'"{hashlib.sha256(data).hexdigest()}"'
    status, _, body = await proxy.get(ARCHIVE, headers={"If-None-Match": etag})
    assert (status, body) == (304, b"")


async def test_an_etag_list_split_over_header_lines_is_one_list(proxy, registry):
    # RFC 9110 §5.3: repeated field lines form one list; aiohttp's request.if_none_match reads the first only
    etag = f'"{release_of(registry).sha256("linux_amd64")}"'
    lines = CIMultiDict([("If-None-Match", '"other"'), ("If-None-Match", etag)])
    status, _, body = await proxy.get(ARCHIVE, headers=lines)
    assert (status, body) == (304, b"")


async def test_concurrent_cold_requests_share_one_upstream_fetch(proxy, registry):
    registry.archive_chunk_delay = 0.02
    results = await asyncio.gather(*(proxy.get(ARCHIVE) for _ in range(20)))
    release = release_of(registry)
    assert {status for status, _, _ in results} == {200}
    assert all(body == release.zips["linux_amd64"] for _, _, body in results)
    assert registry.count(registry.archive_path(release, "linux_amd64")) == 1
    assert registry.count("/v1/providers/acme/foo/1.0.0/download/linux/amd64") == 1
    assert registry.count(f"/files/acme/foo/1.0.0/{release.shasums_name}") == 1
    assert registry.count("/.well-known/terraform.json") == 1


async def test_concurrent_cold_version_documents_share_metadata_fetches(proxy, registry):
    results = await asyncio.gather(*(proxy.json(f"/mirror/v1/{PROVIDER}/1.0.0.json") for _ in range(10)))
    assert {status for status, _ in results} == {200}
    assert registry.count("/v1/providers/acme/foo/versions") == 1
    assert registry.count("/v1/providers/acme/foo/1.0.0/download/darwin/arm64") == 1


async def test_client_disconnect_does_not_cancel_the_shared_fetch(make_settings, client_ssl, registry):
    """The test server cancels the handler of a client that went away (the harshest case; the real
    server lets it run on): the upstream download it started must go on to its end, and a later
    request is answered from it (joining it, or from the store) rather than fetching again."""
    release = release_of(registry)
    path = registry.archive_path(release, "linux_amd64")
    download = registry.hold(path)
    handler_cancelled = asyncio.Event()

    @web.middleware
    async def note_cancelled(request, handler):
        try:
            return await handler(request)
        except asyncio.CancelledError:
            handler_cancelled.set()
            raise

    async with serve_proxy(
        make_settings(), client_ssl, handler_cancellation=True, middlewares=[note_cancelled]
    ) as proxy:
        first = asyncio.create_task(proxy.get(ARCHIVE))
        await asyncio.wait_for(download.started.wait(), WAIT)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        await asyncio.wait_for(handler_cancelled.wait(), WAIT)  # the proxy saw the client go
        second = asyncio.create_task(proxy.get(ARCHIVE))
        download.release.set()
        status, _, body = await asyncio.wait_for(second, WAIT)
    assert status == 200 and body == release.zips["linux_amd64"]
    assert registry.count(path) == 1
    assert registry.completed_count(path) == 1  # the one upstream download ran to its end


async def test_wrong_archive_name_is_rejected(proxy, registry):
    status, _, body = await proxy.get(f"/mirror/v1/{PROVIDER}/1.0.0/linux_amd64/../../../../etc/passwd")
    assert status in (400, 404)
    status, _, body = await proxy.get(f"/mirror/v1/{PROVIDER}/1.0.0/linux_amd64/evil.zip")
    assert (status, json.loads(body)["code"]) == (400, "invalid_request")
    assert not [path for _, path in registry.requests if path.endswith(".zip")]


async def test_unknown_platform_is_404(proxy):
    name = "terraform-provider-foo_1.0.0_plan9_mips.zip"
    status, _, body = await proxy.get(f"/mirror/v1/{PROVIDER}/1.0.0/plan9_mips/{name}")
    assert (status, json.loads(body)["code"]) == (404, "package_not_found")


async def test_plain_http_mode_serves_archives(make_settings, client_ssl, registry):
    settings = make_settings(plain_http=True, tls_cert=None, tls_key=None)
    async with serve_proxy(settings, client_ssl) as running:
        assert running.url.startswith("http://")
        status, _, body = await running.get(ARCHIVE)
        assert status == 200 and body == release_of(registry).zips["linux_amd64"]
        status, _, body = await running.get(ARCHIVE, headers={"Range": "bytes=0-3"})
        assert (status, body) == (206, b"PK\x03\x04")
