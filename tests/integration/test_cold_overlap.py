"""A cold request's upstream fetches overlap where the protocol allows it (the fake registry's request log
shows the order; no timing is asserted): the version list is fetched at its usual place while discovery
says where it is, and used only if discovery names that place; a download document starts its release's
SHA256SUMS and its archive, which is served only once verified, and stopped if nobody asks for it."""

from __future__ import annotations

import asyncio

from structlog.testing import capture_logs
from yarl import URL

from proxy.providers import archives
from proxy.services.documents import SPARE_CONNECTIONS
from proxy.storage import LOCK_NAME
from proxy.web.app_keys import SETTINGS
from tests.conftest import PROVIDER, REGISTRY_HOST, serve_proxy
from tests.fakes.packages import Release
from tests.fakes.registry import Fault
from tests.fakes.wan_relay import WanRelay

WAIT = 10  # seconds for an awaited condition: only a broken proxy takes that long
INDEX = f"/mirror/v1/{PROVIDER}/index.json"
DISCOVERY = "/.well-known/terraform.json"
VERSIONS = "/v1/providers/acme/foo/versions"


async def until(condition) -> None:
    async with asyncio.timeout(WAIT):
        while not condition():  # noqa: ASYNC110 - the fake registry's log has no event to wait on
            await asyncio.sleep(0.01)


async def test_the_version_list_is_fetched_while_discovery_is_answered(proxy, registry):
    gate = registry.gates[DISCOVERY] = asyncio.Event()
    index = asyncio.create_task(proxy.json(INDEX))
    await until(lambda: registry.count(VERSIONS) == 1)  # asked for while discovery is held
    assert registry.completed_count(DISCOVERY) == 0
    gate.set()
    status, body = await asyncio.wait_for(index, WAIT)
    assert status == 200 and set(body["versions"]) == {"1.0.0", "1.1.0"}
    assert (registry.count(DISCOVERY), registry.count(VERSIONS)) == (1, 1)  # the early answer was the answer

    other = f"/mirror/v1/{REGISTRY_HOST}/acme/other/index.json"  # discovery is cached now: nothing early
    assert (await proxy.json(other))[0] == 404
    assert registry.count("/v1/providers/acme/other/versions") == 1


async def test_an_early_answer_at_another_place_than_discovery_names_is_not_used(proxy, registry):
    registry.faults[DISCOVERY] = Fault(body=b'{"providers.v1": "/moved/providers/"}')
    registry.faults[VERSIONS] = Fault(body=b'{"versions": [{"version": "6.6.6", "platforms": []}]}')
    registry.faults["/moved/providers/acme/foo/versions"] = Fault(
        body=b'{"versions": [{"version": "2.0.0", "platforms": [{"os": "linux", "arch": "amd64"}]}]}'
    )
    status, body = await proxy.json(INDEX)
    assert status == 200 and body == {"versions": {"2.0.0": {}}}
    assert registry.count("/moved/providers/acme/foo/versions") == 1


async def test_a_failed_early_fetch_is_the_fetch_and_is_not_made_twice(proxy, registry):
    registry.faults[VERSIONS] = Fault(status=503, body=b"down")
    status, body = await proxy.json(INDEX)
    assert (status, body["code"]) == (502, "upstream_status")
    assert registry.count(VERSIONS) == 2  # the early fetch and its one retry; not fetched once more


async def test_a_download_document_starts_the_release_sums_the_client_asks_for_next(proxy, registry):
    release = registry.releases[("acme", "foo")]["1.0.0"]
    sums = f"/files/acme/foo/1.0.0/{release.shasums_name}"
    download = f"/registry/{REGISTRY_HOST}/providers/v1/acme/foo/1.0.0/download/linux/amd64"
    status, document = await proxy.json(download)
    assert status == 200 and document["shasums_url"].endswith("/SHA256SUMS")
    await until(lambda: registry.count(sums) == 1 and registry.count(sums + ".sig") == 1)  # not asked for yet
    status, _, body = await proxy.get(download + "/SHA256SUMS")
    assert (status, body) == (200, release.shasums)
    status, _, body = await proxy.get(download + "/SHA256SUMS.sig")
    assert (status, body) == (200, release.signature)
    assert (registry.count(sums), registry.count(sums + ".sig")) == (1, 1)

    for _ in range(3):  # warm: nothing more is started or fetched
        assert (await proxy.json(download))[0] == 200
    assert (registry.count(sums), registry.count(sums + ".sig")) == (1, 1)


# ---- the archive, downloaded while its release's SHA256SUMS is fetched and verified ----------------------

MiB = 2**20
DOWNLOAD = f"/registry/{REGISTRY_HOST}/providers/v1/acme/foo/1.0.0/download/linux/amd64"


def release_files(registry) -> tuple[Release, str, str]:
    """The release, the upstream paths of its SHA256SUMS and of its linux_amd64 archive."""
    release = registry.releases[("acme", "foo")]["1.0.0"]
    return release, f"/files/acme/foo/1.0.0/{release.shasums_name}", registry.archive_path(release, "linux_amd64")


def stored(proxy) -> list:
    """Every file of the archive store: published, or a download's temp file."""
    root = proxy.app[SETTINGS].archive_dir
    return [p for p in root.rglob("*") if p.is_file() and p.name != LOCK_NAME]


async def test_a_download_document_starts_the_archive_download_before_the_sums_are_verified(proxy, registry):
    release, sums, archive = release_files(registry)
    gate = registry.gates[sums] = asyncio.Event()
    status, document = await proxy.json(DOWNLOAD)
    assert status == 200
    await until(lambda: registry.count(archive) == 1)  # not asked for yet; SHA256SUMS still unanswered
    assert registry.completed_count(sums) == 0
    client_sums = asyncio.create_task(proxy.get(DOWNLOAD + "/SHA256SUMS"))
    client_archive = asyncio.create_task(proxy.get(document["download_url"]))
    await until(lambda: any(s.path == archive for s in registry.timeline))  # the whole archive arrived
    assert not client_archive.done()  # and waits for the signed sums
    gate.set()
    assert (await asyncio.wait_for(client_sums, WAIT))[::2] == (200, release.shasums)
    status, _, body = await asyncio.wait_for(client_archive, WAIT)
    assert (status, body) == (200, release.zips["linux_amd64"])
    assert registry.count(archive) == 1  # the early download was the download

    for _ in range(3):  # warm: the document starts nothing, the archive is served from the store
        assert (await proxy.json(DOWNLOAD))[0] == 200
        assert (await proxy.get(document["download_url"]))[0] == 200
    assert (registry.count(archive), registry.count(sums)) == (1, 1)


async def test_an_archive_downloaded_before_its_sums_failed_their_signature_is_discarded(proxy, registry):
    release, sums, archive = release_files(registry)
    release.shasums = release.shasums.replace(b"linux_amd64", b"linux_arm64")  # the signature no longer holds
    gate = registry.gates[sums] = asyncio.Event()
    status, document = await proxy.json(DOWNLOAD)
    assert status == 200
    await until(lambda: registry.count(archive) == 1 and any(s.path == archive for s in registry.timeline))
    gate.set()  # the whole archive arrived before its SHA256SUMS
    status, body = await proxy.json(document["download_url"])
    assert (status, body["code"]) == (502, "signature_invalid")
    status, body = await proxy.json(DOWNLOAD + "/SHA256SUMS")
    assert (status, body["code"]) == (502, "signature_invalid")
    await until(lambda: stored(proxy) == [])  # its temp file is gone, nothing published

    release.resign()  # sound again: nothing of the failed attempt was kept
    del registry.gates[sums]
    status, _, body = await proxy.get(document["download_url"])
    assert (status, body) == (200, release.zips["linux_amd64"])
    assert registry.count(archive) == 2


async def test_an_early_download_no_client_asks_for_is_stopped_and_its_answer_closed(
    proxy, registry, signing_key, monkeypatch
):
    monkeypatch.setattr(archives, "EARLY_ARCHIVE_WAIT", 0.2)
    big = registry.add(Release("acme", "big", "2.0.0", signing_key, platforms=("linux_amd64",), noise=3 * MiB))
    archive = registry.archive_path(big, "linux_amd64")
    held = registry.hold(archive)  # its headers go out, its body waits
    download = f"/registry/{REGISTRY_HOST}/providers/v1/acme/big/2.0.0/download/linux/amd64"
    with capture_logs() as logs:
        assert (await proxy.json(download))[0] == 200
        await asyncio.wait_for(held.started.wait(), WAIT)
        await until(lambda: any(entry["event"] == "archive.early_dropped" for entry in logs))
    await until(lambda: stored(proxy) == [])  # its temp file discarded
    held.release.set()
    await until(lambda: any(s.path == archive for s in registry.timeline))
    assert next(s.status for s in registry.timeline if s.path == archive) != 200  # the proxy had hung up
    del registry.holds[archive]

    # asked for later: fetched again, verified and served
    mirror = f"/mirror/v1/{REGISTRY_HOST}/acme/big/2.0.0/linux_amd64/{big.filename('linux_amd64')}"
    status, _, body = await proxy.get(mirror)
    assert (status, body) == (200, big.zips["linux_amd64"])
    assert registry.count(archive) == 2


async def test_a_cold_host_gets_spare_connections_for_the_requests_that_follow_together(
    make_settings, client_ssl, registry
):
    wan = WanRelay(registry.port)  # connecting costs round trips: the spares are still opening when discovery asks
    wan.latency = 0.1
    await wan.start()
    registry.files_base = wan.url
    try:
        settings = make_settings(upstream_map={REGISTRY_HOST: URL(wan.url)})
        async with serve_proxy(settings, client_ssl) as proxy:
            with capture_logs() as logs:
                assert (await proxy.json(INDEX))[0] == 200
                await until(lambda: [e["event"] for e in logs].count("upstream.spare_opened") == SPARE_CONNECTIONS)
            with capture_logs() as logs:  # three download documents at once, then SHA256SUMS and its signature
                assert (await proxy.json(f"/mirror/v1/{PROVIDER}/1.0.0.json"))[0] == 200
            events = [entry["event"] for entry in logs]
            assert events.count("upstream.connection_reused") == 5 and "upstream.connected" not in events
            assert {method for method, _ in registry.requests} == {"GET"}  # no request of their own
            assert len(wan.connections) == 2 + SPARE_CONNECTIONS  # discovery, the version list and the spares

            with capture_logs() as logs:  # the host is warm: no more
                assert (await proxy.json(f"/mirror/v1/{REGISTRY_HOST}/acme/other/index.json"))[0] == 404
            assert "upstream.spare_opened" not in [entry["event"] for entry in logs]
    finally:
        await wan.stop()
