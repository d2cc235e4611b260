"""Below the free-space floor (in process): relayed archives, HTTP details, lock and readiness answers.

The real-process faults (tmpfs, ENOSPC, a full SQLite file) are in tests/faults/test_disk_full.py.
"""

from __future__ import annotations

import hashlib

import pytest

from proxy.settings.config import SpaceFloor
from proxy.web.app_keys import SETTINGS
from tests.conftest import PROVIDER, serve_proxy

ARCHIVE = f"/mirror/v1/{PROVIDER}/1.0.0/linux_amd64/terraform-provider-foo_1.0.0_linux_amd64.zip"
REGISTRY_ARCHIVE_DOC = "/registry/registry.example.test/providers/v1/acme/foo/1.0.0/download/linux/amd64"
NEVER_ENOUGH = SpaceFloor(2**62)


@pytest.fixture
async def full_proxy(make_local_settings, client_ssl):
    async with serve_proxy(make_local_settings(min_free_space=NEVER_ENOUGH), client_ssl) as running:
        yield running


def stored_files(proxy) -> list:
    return [p for p in (proxy.app[SETTINGS].archive_dir / "sha256").rglob("*") if p.is_file()]


def release(registry):
    return registry.releases[("acme", "foo")]["1.0.0"]


async def test_readiness_names_the_disk_space(full_proxy):
    status, body = await full_proxy.json("/readyz")
    assert status == 503 and body["status"] == "not ready"
    assert body["checks"]["disk_space"] is False and body["checks"]["archive_store"] is True
    assert body["disk_space"]["min_free_bytes"] == 2**62 > body["disk_space"]["free_bytes"] > 0


async def test_relayed_archive_http_details(full_proxy, registry):
    expected = release(registry).sha256("linux_amd64")
    status, headers, data = await full_proxy.get(ARCHIVE, headers={"Range": "bytes=0-9"})
    assert status == 200 and hashlib.sha256(data).hexdigest() == expected  # a Range is answered whole
    assert headers["ETag"] == f'"{expected}"' and "Accept-Ranges" not in headers
    assert int(headers["Content-Length"]) == len(data)

    fetched = registry.count(registry.archive_path(release(registry), "linux_amd64"))
    status, _, _ = await full_proxy.get(ARCHIVE, headers={"If-None-Match": f'"{expected}"'})
    assert status == 304
    async with full_proxy.session.head(full_proxy.url + ARCHIVE) as response:
        assert response.status == 200 and await response.read() == b""
    assert registry.count(registry.archive_path(release(registry), "linux_amd64")) == fetched  # neither fetched
    assert not stored_files(full_proxy)


async def test_a_tampered_archive_that_fits_in_one_chunk_is_never_sent(full_proxy, registry):
    registry.tampered.add(release(registry).filename("linux_amd64"))
    status, body = await full_proxy.json(ARCHIVE)
    assert (status, body["code"]) == (502, "checksum_mismatch")
    assert not stored_files(full_proxy)


async def test_registry_protocol_archive_is_relayed_too(full_proxy, registry):
    _, document = await full_proxy.json(REGISTRY_ARCHIVE_DOC)
    status, _, data = await full_proxy.get(document["download_url"])
    assert status == 200 and hashlib.sha256(data).hexdigest() == release(registry).sha256("linux_amd64")


async def test_lock_hashes_need_the_archive_and_say_so(full_proxy):
    status, body = await full_proxy.json(f"/lock/v1/{PROVIDER}/1.0.0?platform=linux_amd64")
    assert (status, body["code"]) == (503, "disk_full")
    assert "h1:" in body["errors"][0]  # says what needs the room: the h1: hashes


async def test_archives_already_stored_are_served_below_the_floor(make_local_settings, client_ssl, registry):
    async with serve_proxy(make_local_settings(), client_ssl) as roomy:
        assert (await roomy.get(ARCHIVE))[0] == 200
    fetched = registry.count(registry.archive_path(release(registry), "linux_amd64"))
    async with serve_proxy(make_local_settings(min_free_space=NEVER_ENOUGH), client_ssl) as full:
        status, _, data = await full.get(ARCHIVE, headers={"Range": "bytes=0-9"})
        assert status == 206 and len(data) == 10  # from the store, Range and all
        status, body = await full.json(f"/lock/v1/{PROVIDER}/1.0.0?platform=linux_amd64")
        assert status == 200 and body["platforms"]["linux_amd64"]["h1"].startswith("h1:")
    assert registry.count(registry.archive_path(release(registry), "linux_amd64")) == fetched
