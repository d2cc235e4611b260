"""Nothing unverified is served or stored: tampered archives, bad or unknown signatures."""

from __future__ import annotations

from proxy.storage import LOCK_NAME
from tests.conftest import PROVIDER, serve_proxy
from tests.fakes.packages import Release

ARCHIVE = f"/mirror/v1/{PROVIDER}/1.0.0/linux_amd64/terraform-provider-foo_1.0.0_linux_amd64.zip"
VERSION_DOC = f"/mirror/v1/{PROVIDER}/1.0.0.json"


def stored(proxy) -> list:
    from proxy.web.keys import SETTINGS

    root = proxy.app[SETTINGS].archive_dir
    return [p for p in root.rglob("*") if p.is_file() and p.name != LOCK_NAME]  # the temp dir's lock is no archive


def release_of(registry) -> Release:
    return registry.releases[("acme", "foo")]["1.0.0"]


async def test_tampered_archive_is_refused_and_not_stored(proxy, registry):
    release = release_of(registry)
    registry.tampered.add(release.filename("linux_amd64"))
    status, body = await proxy.json(ARCHIVE)
    assert status == 502
    assert "tampered" in body["errors"][0] and release.filename("linux_amd64") in body["errors"][0]
    assert stored(proxy) == []
    # Nothing bad was remembered: once the upstream serves the right bytes, it works.
    registry.tampered.clear()
    status, _, data = await proxy.get(ARCHIVE)
    assert status == 200 and data == release.zips["linux_amd64"]


async def test_signature_by_a_key_the_registry_does_not_list(proxy, registry, signing_key, other_key):
    registry.add(Release("acme", "foo", "1.0.0", other_key))
    registry.signing_keys_override = [signing_key.armored_public_key]
    for path in (ARCHIVE, VERSION_DOC):
        status, body = await proxy.json(path)
        assert status == 502
        assert "unknown key" in body["errors"][0] or "not among" in body["errors"][0], body
    assert stored(proxy) == []


async def test_registry_listing_a_foreign_key(proxy, registry, other_key):
    registry.signing_keys_override = [other_key.armored_public_key]  # signature is by signing_key
    status, body = await proxy.json(ARCHIVE)
    assert status == 502 and "SHA256SUMS" in body["errors"][0]
    assert stored(proxy) == []


async def test_corrupt_signature_bytes(proxy, registry):
    release_of(registry).signature = b"\x89garbage, not an OpenPGP packet"
    status, body = await proxy.json(ARCHIVE)
    assert status == 502 and "signature" in body["errors"][0]


async def test_modified_shasums_breaks_the_signature(proxy, registry):
    release = release_of(registry)
    release.shasums = release.shasums.replace(b"linux_amd64", b"linux_arm64")
    status, body = await proxy.json(VERSION_DOC)
    assert status == 502 and "signature" in body["errors"][0]


async def test_registry_shasum_disagreeing_with_signed_sums(proxy, registry):
    release = release_of(registry)
    release.zips["linux_amd64"] = release.zips["darwin_arm64"]  # registry now reports another digest
    status, body = await proxy.json(ARCHIVE)
    assert status == 502 and "registry's shasum" in body["errors"][0]
    assert stored(proxy) == []


async def test_signed_archive_that_is_not_a_zip(proxy, registry):
    release = release_of(registry)
    release.zips["linux_amd64"] = b"this is not a zip file"
    release.resign()
    status, body = await proxy.json(ARCHIVE)
    assert status == 502 and "not a valid zip" in body["errors"][0]
    assert stored(proxy) == []


async def test_archive_over_the_size_limit(make_settings, client_ssl, registry):
    from proxy.config import Limits

    async with serve_proxy(make_settings(limits=Limits(max_archive_bytes=100)), client_ssl) as running:
        status, body = await running.json(ARCHIVE)
        assert status == 502 and "limit" in body["errors"][0]
        assert stored(running) == []


async def test_registry_without_signing_keys_is_refused(proxy, registry):
    import json

    from tests.fakes.registry import Fault

    doc = {
        "os": "linux",
        "arch": "amd64",
        "filename": "x.zip",
        "shasum": "0" * 64,
        "download_url": "/x.zip",
        "shasums_url": "/s",
        "shasums_signature_url": "/s.sig",
        "signing_keys": {"gpg_public_keys": []},
    }
    registry.faults["/v1/providers/acme/foo/1.0.0/download/linux/amd64"] = Fault(body=json.dumps(doc).encode())
    status, body = await proxy.json(ARCHIVE)
    assert status == 502 and "no signing keys" in body["errors"][0]
