"""Upstream failures: clear 502s, nothing bad cached, stale-if-error, negative cache, restarts."""

from __future__ import annotations

import time

import pytest

from proxy.settings.config import FreshnessTtls, Limits
from proxy.web.app_keys import MIRROR
from tests.conftest import PROVIDER, serve_proxy
from tests.fakes.registry import Fault

INDEX = f"/mirror/v1/{PROVIDER}/index.json"
VERSION_DOC = f"/mirror/v1/{PROVIDER}/1.0.0.json"
ARCHIVE = f"/mirror/v1/{PROVIDER}/1.0.0/linux_amd64/terraform-provider-foo_1.0.0_linux_amd64.zip"
VERSIONS = "/v1/providers/acme/foo/versions"


@pytest.mark.one_metadata_store
async def test_upstream_5xx_is_a_502_naming_the_status(proxy, registry):
    registry.faults[VERSIONS] = Fault(status=503, body=b"down")
    status, body = await proxy.json(INDEX)
    assert (status, body["code"]) == (502, "upstream_status") and "503" in body["errors"][0]  # names the status
    assert registry.count(VERSIONS) == 2  # one retry for an idempotent GET


async def test_garbage_json_is_refused_and_not_cached(proxy, registry, monkeypatch):
    """Never cached; remembered as malformed for --ttl-negative (retries meanwhile do not reach the
    upstream), then asked for again."""
    now = [time.time()]
    monkeypatch.setattr(proxy.app[MIRROR]._documents, "clock", lambda: now[0])
    registry.faults[VERSIONS] = Fault(body=b"<html>not json</html>", content_type="text/html")
    status, body = await proxy.json(INDEX)
    assert (status, body["code"]) == (502, "upstream_malformed")
    registry.faults.clear()
    status, body = await proxy.json(INDEX)
    assert status == 502 and "not valid JSON" in body["errors"][0]
    assert registry.count(VERSIONS) == 1
    now[0] += FreshnessTtls().negative
    status, body = await proxy.json(INDEX)
    assert status == 200 and body == {"versions": {"1.0.0": {}, "1.1.0": {}}}
    assert registry.count(VERSIONS) == 2


@pytest.mark.one_metadata_store
async def test_wrong_shape_json_is_refused(proxy, registry):
    registry.faults[VERSIONS] = Fault(body=b'{"versions": "many"}')
    status, body = await proxy.json(INDEX)
    assert (status, body["code"]) == (502, "upstream_malformed")


@pytest.mark.one_metadata_store
async def test_oversized_metadata_is_refused(make_settings, client_ssl, registry):
    registry.faults[VERSIONS] = Fault(body=b'{"versions": []}' + b" " * 5000)
    async with serve_proxy(make_settings(limits=Limits(max_metadata_bytes=4096)), client_ssl) as running:
        status, body = await running.json(INDEX)
        assert (status, body["code"]) == (502, "upstream_too_large")


@pytest.mark.one_metadata_store
async def test_upstream_timeout(make_settings, client_ssl, registry):
    registry.faults[VERSIONS] = Fault(delay=2.0)
    async with serve_proxy(make_settings(limits=Limits(metadata_timeout=0.3)), client_ssl) as running:
        status, body = await running.json(INDEX)
        assert (status, body["code"]) == (502, "upstream_unreachable") and "timed out" in body["errors"][0]


@pytest.mark.one_metadata_store
async def test_discovery_with_wrong_content_type(proxy, registry):
    registry.faults["/.well-known/terraform.json"] = Fault(
        body=b'{"providers.v1": "/v1/providers/"}', content_type="text/plain"
    )
    status, body = await proxy.json(INDEX)
    assert (status, body["code"]) == (502, "upstream_malformed")


@pytest.mark.one_metadata_store
async def test_discovery_without_providers_service(proxy, registry):
    registry.discovery = {"modules.v1": "/v1/modules/"}
    status, body = await proxy.json(INDEX)
    assert (status, body["code"]) == (404, "service_not_found")


@pytest.mark.one_metadata_store
async def test_upstream_down_cold_is_a_502(proxy, registry):
    await registry.stop()
    status, body = await proxy.json(INDEX)
    assert (status, body["code"]) == (502, "upstream_unreachable")


async def test_not_found_is_cached_briefly(proxy, registry):
    path = f"/mirror/v1/{PROVIDER.replace('foo', 'missing')}/index.json"
    for _ in range(2):
        status, body = await proxy.json(path)
        assert (status, body["code"]) == (404, "provider_not_found")
    assert registry.count("/v1/providers/acme/missing/versions") == 1


async def test_stale_metadata_is_served_when_the_upstream_fails(make_settings, client_ssl, registry):
    settings = make_settings(freshness=FreshnessTtls(discovery=0, versions=0, negative=0))
    async with serve_proxy(settings, client_ssl) as running:
        assert (await running.json(VERSION_DOC))[0] == 200
        assert (await running.get(ARCHIVE))[0] == 200
        registry.faults[VERSIONS] = Fault(status=500)
        status, body = await running.json(INDEX)
        assert status == 200 and "1.0.0" in body["versions"]
        await registry.stop()
        for path in (INDEX, VERSION_DOC, ARCHIVE):
            assert (await running.get(path))[0] == 200, path


async def test_stale_metadata_is_served_while_the_upstream_answers_malformed_json(proxy, registry, monkeypatch):
    """A refresh that does not parse leaves the stale copy served, and is asked for again only after
    --ttl-negative (not on every request)."""
    now = [time.time()]
    monkeypatch.setattr(proxy.app[MIRROR]._documents, "clock", lambda: now[0])
    assert (await proxy.json(INDEX))[0] == 200
    registry.faults[VERSIONS] = Fault(body=b"[" * 200_000)
    now[0] += FreshnessTtls().versions + 1
    for _ in range(3):
        status, body = await proxy.json(INDEX)
        assert status == 200 and "1.1.0" in body["versions"]
    assert registry.count(VERSIONS) == 2
    now[0] += FreshnessTtls().negative + 1
    assert (await proxy.json(INDEX))[0] == 200
    assert registry.count(VERSIONS) == 3


async def test_warm_cache_survives_a_restart_with_the_upstream_down(make_settings, client_ssl, registry):
    settings = make_settings()
    async with serve_proxy(settings, client_ssl) as running:
        for path in (INDEX, VERSION_DOC, ARCHIVE):
            assert (await running.get(path))[0] == 200
    await registry.stop()
    async with serve_proxy(settings, client_ssl) as restarted:
        status, body = await restarted.json(VERSION_DOC)
        assert status == 200
        assert any(h.startswith("h1:") for h in body["archives"]["linux_amd64"]["hashes"])
        status, _, data = await restarted.get(ARCHIVE)
        assert status == 200
        assert data == registry.releases[("acme", "foo")]["1.0.0"].zips["linux_amd64"]
        assert (await restarted.json(INDEX))[0] == 200


@pytest.mark.one_metadata_store
async def test_discovery_follows_redirects_and_resolves_relative_service_urls(proxy, registry):
    registry.faults["/.well-known/terraform.json"] = Fault(
        status=301, headers={"Location": f"{registry.url}/moved/here/terraform.json"}
    )
    registry.faults["/moved/here/terraform.json"] = Fault(body=b'{"providers.v1": "../../v1/providers/"}')
    status, body = await proxy.json(INDEX)
    assert status == 200 and "1.1.0" in body["versions"]
    assert registry.count("/moved/here/terraform.json") == 1


async def test_a_remembered_404_stays_a_404_when_the_upstream_fails(make_settings, client_ssl, registry):
    settings = make_settings(freshness=FreshnessTtls(discovery=3600, versions=0, negative=0))
    missing = f"/mirror/v1/{PROVIDER.replace('foo', 'missing')}/index.json"
    async with serve_proxy(settings, client_ssl) as running:
        assert (await running.json(missing))[0] == 404
        registry.faults["/v1/providers/acme/missing/versions"] = Fault(status=500)
        assert (await running.json(missing))[0] == 404  # "not here", not a hard error


@pytest.mark.one_metadata_store
async def test_version_document_leaves_out_a_platform_the_upstream_fails_for(proxy, registry):
    registry.faults["/v1/providers/acme/foo/1.0.0/download/darwin/arm64"] = Fault(status=500)
    status, body = await proxy.json(VERSION_DOC)
    assert status == 200 and set(body["archives"]) == {"linux_amd64", "windows_amd64"}
    for platform in ("linux/amd64", "windows/amd64"):
        registry.faults[f"/v1/providers/acme/foo/1.1.0/download/{platform}"] = Fault(status=500)
    registry.faults["/v1/providers/acme/foo/1.1.0/download/darwin/arm64"] = Fault(status=500)
    status, body = await proxy.json(f"/mirror/v1/{PROVIDER}/1.1.0.json")
    assert (status, body["code"]) == (502, "upstream_status")


@pytest.mark.one_metadata_store
async def test_slow_downloads_do_not_starve_metadata(make_settings, client_ssl, registry, signing_key):
    import asyncio

    from tests.fakes.packages import Release

    release = registry.add(Release("acme", "foo", "9.0.0", signing_key, platforms=("linux_amd64",)))
    held = registry.hold(registry.archive_path(release, "linux_amd64"))  # the download never ends by itself
    async with serve_proxy(make_settings(limits=Limits(upstream_concurrency=1)), client_ssl) as running:
        name = "terraform-provider-foo_9.0.0_linux_amd64.zip"
        slow = asyncio.create_task(running.get(f"/mirror/v1/{PROVIDER}/9.0.0/linux_amd64/{name}"))
        await asyncio.wait_for(held.started.wait(), 10)  # the download holds the only download slot
        status, _ = await asyncio.wait_for(
            running.json(f"/mirror/v1/{PROVIDER.replace('foo', 'other')}/index.json"), 10
        )
        assert status == 404
        held.release.set()
        slow.cancel()
