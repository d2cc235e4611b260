"""Nothing unverified is served or stored: tampered archives, bad or unknown signatures."""

from __future__ import annotations

import re

import pytest

from proxy.storage import LOCK_NAME
from tests.conftest import PROVIDER, serve_proxy
from tests.fakes.packages import Release

# The metadata store does not matter to what these tests check (the contract suites, the warm-path,
# freshness and failure tests run over both): the embedded store only.
pytestmark = pytest.mark.one_metadata_store

ARCHIVE = f"/mirror/v1/{PROVIDER}/1.0.0/linux_amd64/terraform-provider-foo_1.0.0_linux_amd64.zip"
VERSION_DOC = f"/mirror/v1/{PROVIDER}/1.0.0.json"


def stored(proxy) -> list:
    from proxy.web.app_keys import SETTINGS

    root = proxy.app[SETTINGS].archive_dir
    return [p for p in root.rglob("*") if p.is_file() and p.name != LOCK_NAME]  # the temp dir's lock is no archive


def release_of(registry) -> Release:
    return registry.releases[("acme", "foo")]["1.0.0"]


async def test_tampered_archive_is_refused_and_not_stored(proxy, registry):
    release = release_of(registry)
    registry.tampered.add(release.filename("linux_amd64"))
    status, body = await proxy.json(ARCHIVE)
    assert (status, body["code"]) == (502, "checksum_mismatch")
    assert release.filename("linux_amd64") in body["errors"][0]  # the message names the archive
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
        assert (status, body["code"]) == (502, "signature_invalid"), body
    assert stored(proxy) == []


async def test_registry_listing_a_foreign_key(proxy, registry, other_key):
    registry.signing_keys_override = [other_key.armored_public_key]  # signature is by signing_key
    status, body = await proxy.json(ARCHIVE)
    assert (status, body["code"]) == (502, "signature_invalid")
    assert stored(proxy) == []


async def test_corrupt_signature_bytes(proxy, registry):
    release_of(registry).signature = b"\x89garbage, not an OpenPGP packet"
    status, body = await proxy.json(ARCHIVE)
    assert (status, body["code"]) == (502, "signature_invalid")


async def test_modified_shasums_breaks_the_signature(proxy, registry):
    release = release_of(registry)
    release.shasums = release.shasums.replace(b"linux_amd64", b"linux_arm64")
    status, body = await proxy.json(VERSION_DOC)
    assert (status, body["code"]) == (502, "signature_invalid")


async def test_registry_shasum_disagreeing_with_signed_sums(proxy, registry):
    release = release_of(registry)
    release.zips["linux_amd64"] = release.zips["darwin_arm64"]  # registry now reports another digest
    status, body = await proxy.json(ARCHIVE)
    assert (status, body["code"]) == (502, "checksum_mismatch")
    assert stored(proxy) == []


async def test_signed_archive_that_is_not_a_zip(proxy, registry):
    release = release_of(registry)
    release.zips["linux_amd64"] = b"this is not a zip file"
    release.resign()
    status, body = await proxy.json(ARCHIVE)
    assert (status, body["code"]) == (502, "verification_failed") and "not a valid zip" in body["errors"][0]
    assert stored(proxy) == []


async def test_archive_over_the_size_limit(make_settings, client_ssl, registry):
    from proxy.settings.config import Limits

    async with serve_proxy(make_settings(limits=Limits(max_archive_bytes=100)), client_ssl) as running:
        status, body = await running.json(ARCHIVE)
        assert (status, body["code"]) == (502, "upstream_too_large")
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
    assert (status, body["code"]) == (502, "unsigned_refused") and "no signing keys" in body["errors"][0]


async def test_verify_holds_every_stored_record_to_the_chain(make_local_settings, client_ssl, registry, other_key):
    """`registry-proxy verify` checks each provider archive record again: the SHA256SUMS signature (with the
    keys of its download document), the archive's line and digest. Records rewritten behind the proxy's
    back (sealed, as an owner of the metadata secret could) are listed and make it exit 1."""
    from dataclasses import replace

    from proxy.domain.addresses import Platform, ProviderAddr, Version
    from proxy.metadata_store import keys, records
    from proxy.metadata_store.records import ArchiveRecord, SumsRecord
    from tests.fakes.process import registry_proxy_in_process
    from tests.integration.test_lock_warm_bundle import _stores

    settings = make_local_settings()
    async with serve_proxy(settings, client_ssl) as proxy:
        assert (await proxy.get(ARCHIVE))[0] == 200
        assert (await proxy.get(ARCHIVE.replace("linux_amd64", "darwin_arm64")))[0] == 200
    code, output = await registry_proxy_in_process("verify", "--data-dir", str(settings.data_dir))
    assert code == 0 and "0 refused by the verification chain, 0 not checkable" in output, output
    assert "verify: 1/2 objects, " in output and "verify: 2/2 objects, " in output  # progress, not on a terminal
    assert re.search(r"^verify: done: 2 objects, \d+ bytes in \d+\.\ds$", output, re.MULTILINE), output

    release = release_of(registry)
    cache, store = await _stores(settings.data_dir)
    try:
        sums_key = next(k for k in [k async for k in cache.keys()] if keys.SUMS.parse(k))  # noqa: SIM118 - async
        sums = records.decode(await cache.get(sums_key), SumsRecord)
        forged = SumsRecord(sums.sums, other_key.sign(sums.sums), sums.key_id, sums.fingerprint)
        await cache.set(sums_key, records.encode(forged))
        code, output = await registry_proxy_in_process("verify", "--data-dir", str(settings.data_dir))
        refused = [line for line in output.splitlines() if line.startswith("REFUSED")]
        assert code == 1 and len(refused) == 2, output  # both platforms' records hang on that signature
        assert all("failed verification" in line for line in refused)

        await cache.set(sums_key, records.encode(sums))
        addr, version = ProviderAddr.parse(*PROVIDER.split("/")), Version.parse("1.0.0")
        linux, darwin = (keys.archive(addr, version, Platform.parse(p)) for p in ("linux_amd64", "darwin_arm64"))
        other = records.decode(await cache.get(darwin), ArchiveRecord)
        record = records.decode(await cache.get(linux), ArchiveRecord)
        await cache.set(linux, records.encode(replace(record, sha256=other.sha256)))  # another platform's archive
        code, output = await registry_proxy_in_process("verify", "--data-dir", str(settings.data_dir))
        refused = [line for line in output.splitlines() if line.startswith("REFUSED")]
        assert code == 1 and refused == [
            f"REFUSED {PROVIDER} 1.0.0 linux_amd64 sha256={release.sha256('darwin_arm64')}: the record disagrees "
            "with the signed SHA256SUMS of its download (never served; fetched again when asked for)"
        ], output
    finally:
        await cache.close()
        await store.close()
