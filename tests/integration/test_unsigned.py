"""`--unsigned-providers`: OpenTofu's default-registry exception for providers without signing keys.

The fake registry answers for `registry.opentofu.org` (through `upstream_map`) and for the tests'
usual host; its download answers list no keys (empty list, or no `signing_keys` at all).
"""

from __future__ import annotations

import base64
import io
import json
import tarfile

import pytest
from structlog.testing import capture_logs
from yarl import URL

from proxy.commands import CommandError
from proxy.domain.addresses import Platform, ProviderAddr, Version
from proxy.domain.hashes import h1_of_zip
from proxy.domain.unsigned_policy import parse_unsigned_policy
from proxy.metadata_store import keys, records
from proxy.metadata_store.records import ArchiveRecord, SumsRecord
from proxy.web.app_keys import MIRROR
from tests.conftest import PROVIDER, serve_proxy
from tests.fakes.process import REGISTRY_HOST, registry_proxy_in_process
from tests.fakes.signing import SigningKey
from tests.integration.test_verification import release_of, stored

TOFU = "registry.opentofu.org"
TOFU_PROVIDER = f"{TOFU}/acme/foo"
FILE = "terraform-provider-foo_1.0.0_linux_amd64.zip"
ADDRESS = (ProviderAddr.parse(TOFU, "acme", "foo"), Version.parse("1.0.0"), Platform.parse("linux_amd64"))


def archive(provider: str = TOFU_PROVIDER) -> str:
    return f"/mirror/v1/{provider}/1.0.0/linux_amd64/{FILE}"


def version_doc(provider: str = TOFU_PROVIDER) -> str:
    return f"/mirror/v1/{provider}/1.0.0.json"


def registry_download(host: str = TOFU) -> str:
    return f"/registry/{host}/providers/v1/acme/foo/1.0.0/download/linux/amd64"


def dir_h1(data: bytes) -> str:
    return str(h1_of_zip(io.BytesIO(data))[1])


@pytest.fixture(params=["empty", "missing"])
def unsigned_registry(request, registry):
    """The fake registry listing no signing keys: `"gpg_public_keys": []`, or no `signing_keys` at all."""
    registry.signing_keys_override = []
    registry.omit_signing_keys = request.param == "missing"
    return registry


@pytest.fixture
def tofu_settings(make_settings, registry):
    """Settings mapping both registry.opentofu.org and the usual test host to the fake registry."""

    def make(**overrides):
        return make_settings(upstream_map={TOFU: URL(registry.url), REGISTRY_HOST: URL(registry.url)}, **overrides)

    return make


async def unsigned_count(proxy, host: str = TOFU) -> float:
    """`registry_proxy_unsigned_archives_total{host}` as /metrics reports it (0 when absent)."""
    status, _, text = await proxy.get("/metrics")
    assert status == 200
    prefix = f'registry_proxy_unsigned_archives_total{{host="{host}"}} '
    values = [float(line.removeprefix(prefix)) for line in text.decode().splitlines() if line.startswith(prefix)]
    return values[0] if values else 0.0


async def test_opentofu_default_serves_an_unsigned_provider_checked_against_its_sums(
    tofu_settings, client_ssl, unsigned_registry
):
    release = release_of(unsigned_registry)
    async with serve_proxy(tofu_settings(), client_ssl) as proxy:
        with capture_logs() as logs:
            for _ in range(2):
                status, _, data = await proxy.get(archive())
                assert status == 200 and data == release.zips["linux_amd64"]
        stored_events = [e for e in logs if e["event"] == "archive.unsigned_stored"]
        assert len(stored_events) == 1 and stored_events[0]["sha256"] == release.sha256("linux_amd64")
        assert await unsigned_count(proxy) == 1
        record = await proxy.app[MIRROR]._documents.record(keys.archive(*ADDRESS), ArchiveRecord)
        assert record is not None and record.unsigned

        # The network mirror answer carries only hashes: every platform's zh: and the stored one's h1:.
        status, body = await proxy.json(version_doc())
        assert status == 200
        hashes = body["archives"]["linux_amd64"]["hashes"]
        assert f"zh:{release.sha256('linux_amd64')}" in hashes and dir_h1(release.zips["linux_amd64"]) in hashes
        assert set(body["archives"]["darwin_arm64"]["hashes"]) == {f"zh:{release.sha256('darwin_arm64')}"}

        # The lock endpoint: each platform's h1: and a zh: for every line of SHA256SUMS, as tofu records them.
        status, body = await proxy.json(f"/lock/v1/{TOFU_PROVIDER}/1.0.0?platform=linux_amd64&platform=darwin_arm64")
        assert status == 200
        assert body["platforms"] == {
            p: {"h1": dir_h1(release.zips[p]), "zh": f"zh:{release.sha256(p)}"} for p in ("linux_amd64", "darwin_arm64")
        }
        assert body["signed_zh"] == sorted(f"zh:{release.sha256(p)}" for p in release.platforms)
        assert await unsigned_count(proxy) == 2  # darwin_arm64 stored for the lock endpoint


@pytest.mark.one_metadata_store
async def test_registry_pass_through_invents_no_keys_and_relays_sums_and_signature(
    tofu_settings, client_ssl, unsigned_registry
):
    release = release_of(unsigned_registry)
    async with serve_proxy(tofu_settings(), client_ssl) as proxy:
        status, body = await proxy.json(registry_download())
        assert status == 200
        if unsigned_registry.omit_signing_keys:
            assert "signing_keys" not in body
        else:
            assert body["signing_keys"] == {"gpg_public_keys": []}
        status, _, sums = await proxy.get(URL(body["shasums_url"]).path)
        assert status == 200 and sums == release.shasums
        status, _, signature = await proxy.get(URL(body["shasums_signature_url"]).path)
        assert status == 200 and signature == release.signature
        status, _, data = await proxy.get(body["download_url"])
        assert status == 200 and data == release.zips["linux_amd64"]


@pytest.mark.one_metadata_store
async def test_unsigned_provider_of_another_host_is_refused(tofu_settings, client_ssl, unsigned_registry):
    async with serve_proxy(tofu_settings(), client_ssl) as proxy:
        for path in (
            archive(PROVIDER),
            version_doc(PROVIDER),
            registry_download(REGISTRY_HOST),
            f"/lock/v1/{PROVIDER}/1.0.0?platform=linux_amd64",
        ):
            status, body = await proxy.json(path)
            assert (status, body["code"]) == (502, "unsigned_refused"), (path, body)
            assert REGISTRY_HOST in body["errors"][0], body  # names the host the policy refuses
        assert stored(proxy) == []
        assert await unsigned_count(proxy, REGISTRY_HOST) == 0


@pytest.mark.one_metadata_store
async def test_refuse_refuses_the_opentofu_registry_too(tofu_settings, client_ssl, unsigned_registry):
    async with serve_proxy(tofu_settings(unsigned_providers=parse_unsigned_policy("refuse")), client_ssl) as proxy:
        for path in (archive(), version_doc(), registry_download()):
            status, body = await proxy.json(path)
            assert (status, body["code"]) == (502, "unsigned_refused"), body
            assert "refused (--unsigned-providers refuse)" in body["errors"][0], body  # names the option
        assert stored(proxy) == []


@pytest.mark.one_metadata_store
async def test_allow_hosts_admits_exactly_the_hosts_named(tofu_settings, client_ssl, unsigned_registry):
    policy = parse_unsigned_policy(f"allow-hosts={REGISTRY_HOST.upper()}")
    async with serve_proxy(tofu_settings(unsigned_providers=policy), client_ssl) as proxy:
        status, _, data = await proxy.get(archive(PROVIDER))
        assert status == 200 and data == release_of(unsigned_registry).zips["linux_amd64"]
        assert await unsigned_count(proxy, REGISTRY_HOST) == 1
        status, body = await proxy.json(archive())
        assert (status, body["code"]) == (502, "unsigned_refused")


async def test_cached_unsigned_archive_is_refused_after_a_restart_with_refuse(
    tofu_settings, client_ssl, unsigned_registry
):
    async with serve_proxy(tofu_settings(), client_ssl) as proxy:
        assert (await proxy.get(archive()))[0] == 200
        assert (await proxy.json(version_doc()))[0] == 200
    requests = len(unsigned_registry.requests)
    async with serve_proxy(tofu_settings(unsigned_providers=parse_unsigned_policy("refuse")), client_ssl) as proxy:
        for path in (
            archive(),
            version_doc(),
            registry_download(),
            f"{registry_download()}/SHA256SUMS",
            f"/lock/v1/{TOFU_PROVIDER}/1.0.0?platform=linux_amd64",
        ):
            status, body = await proxy.json(path)
            assert (status, body["code"]) == (502, "unsigned_refused"), (path, body)
        status, _, _ = await proxy.get(archive(), headers={"Range": "bytes=0-9"})
        assert status == 502
    assert len(unsigned_registry.requests) == requests  # refused from the cache, not by asking again


@pytest.mark.one_metadata_store
async def test_keys_present_and_a_bad_signature_is_refused_also_for_the_opentofu_host(
    tofu_settings, client_ssl, registry, other_key: SigningKey
):
    registry.signing_keys_override = [other_key.armored_public_key]  # the release is signed by signing_key
    async with serve_proxy(tofu_settings(), client_ssl) as proxy:
        for path in (archive(), version_doc(), f"{registry_download()}/SHA256SUMS"):
            status, body = await proxy.json(path)
            assert (status, body["code"]) == (502, "signature_invalid"), body
        assert stored(proxy) == [] and await unsigned_count(proxy) == 0


@pytest.mark.one_metadata_store
async def test_tampered_archive_of_an_unsigned_provider_is_refused(tofu_settings, client_ssl, unsigned_registry):
    release = release_of(unsigned_registry)
    unsigned_registry.tampered.add(release.filename("linux_amd64"))
    async with serve_proxy(tofu_settings(), client_ssl) as proxy:
        status, body = await proxy.json(archive())
        assert (status, body["code"]) == (502, "checksum_mismatch")
        assert stored(proxy) == [] and await unsigned_count(proxy) == 0


@pytest.mark.one_metadata_store
async def test_unsigned_sums_disagreeing_with_the_shasum_is_refused(tofu_settings, client_ssl, unsigned_registry):
    release = release_of(unsigned_registry)
    release.shasums = release.shasums.replace(release.sha256("linux_amd64").encode(), b"0" * 64)
    async with serve_proxy(tofu_settings(), client_ssl) as proxy:
        status, body = await proxy.json(archive())
        assert (status, body["code"]) == (502, "checksum_mismatch"), body
        assert stored(proxy) == []


@pytest.mark.one_metadata_store
async def test_unsigned_sums_not_over_https_are_refused(tofu_settings, client_ssl, unsigned_registry):
    unsigned_registry.files_base = unsigned_registry.url.replace("https://", "http://")
    async with serve_proxy(tofu_settings(), client_ssl) as proxy:
        status, body = await proxy.json(archive())
        assert (status, body["code"]) == (502, "unsigned_refused"), body
        assert not any(path.endswith("SHA256SUMS") for _, path in unsigned_registry.requests)


async def test_verify_lists_unsigned_archives(make_local_settings, client_ssl, registry, tmp_path):
    registry.signing_keys_override = []
    settings = make_local_settings(upstream_map={TOFU: URL(registry.url), REGISTRY_HOST: URL(registry.url)})
    release = release_of(registry)
    async with serve_proxy(settings, client_ssl) as proxy:
        assert (await proxy.get(archive()))[0] == 200
    registry.signing_keys_override = None
    async with serve_proxy(settings, client_ssl) as proxy:
        assert (await proxy.get(archive(PROVIDER)))[0] == 200  # signed: same bytes, another address
    code, output = await registry_proxy_in_process("verify", "--data-dir", str(settings.data_dir))
    assert code == 0, output
    lines = [line for line in output.splitlines() if line.startswith("UNSIGNED")]
    assert lines == [
        f"UNSIGNED {TOFU_PROVIDER} 1.0.0 linux_amd64 {FILE} sha256={release.sha256('linux_amd64')}: "
        "its registry lists no signing keys; checked against SHA256SUMS and the registry's shasum only"
    ]
    assert "1 unsigned" in output


async def test_export_leaves_unsigned_archives_out_and_import_refuses_them(
    make_local_settings, client_ssl, registry, tmp_path
):
    """A bundle carries signatures across an air gap, not TLS: an unsigned archive cannot be vouched for."""
    from tests.integration.test_lock_warm_bundle import _export, _import, _stores

    settings = make_local_settings(upstream_map={TOFU: URL(registry.url), REGISTRY_HOST: URL(registry.url)})
    registry.signing_keys_override = []
    async with serve_proxy(settings, client_ssl) as proxy:
        assert (await proxy.get(archive()))[0] == 200
    registry.signing_keys_override = None
    async with serve_proxy(settings, client_ssl) as proxy:
        assert (await proxy.get(archive(PROVIDER)))[0] == 200
    bundle = tmp_path / "bundle.tar"
    report = await _export(settings.data_dir, bundle)
    assert report.providers == [f"{PROVIDER} 1.0.0 linux_amd64"]
    assert report.unsigned_left_out == [f"{TOFU_PROVIDER}/1.0.0/linux_amd64"]

    # A bundle that carries the unsigned archive anyway (made by hand) is rejected as a whole.
    cache, store = await _stores(settings.data_dir)
    try:
        archive_key = keys.archive(*ADDRESS)
        download_key = keys.download(*ADDRESS)
        unsigned_sums = [
            key
            async for key in cache.keys()  # noqa: SIM118 - an async iterator, not a dict
            if keys.SUMS.parse(key) and records.decode(await cache.get(key), SumsRecord).unsigned
        ]
        assert len(unsigned_sums) == 1
        sums_key = unsigned_sums[0]
        extra = {k: await cache.get(k) for k in (archive_key, download_key, sums_key)}
    finally:
        await cache.close()
        await store.close()
    with tarfile.open(bundle) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}
    manifest = json.loads(members["manifest.json"])
    manifest["providers"].append(
        {
            "archive_key": archive_key,
            "download_key": download_key,
            "sums_key": sums_key,
            "sha256": release_of(registry).sha256("linux_amd64"),
            "filename": FILE,
            "other_platforms": [],
        }
    )
    members["manifest.json"] = json.dumps(manifest).encode()
    members["metadata.jsonl"] += "".join(
        json.dumps({"key": k, "value": base64.b64encode(v).decode()}) + "\n" for k, v in extra.items()
    ).encode()
    forged = tmp_path / "forged.tar"
    with tarfile.open(forged, "w") as tar:
        for name, data in members.items():
            entry = tarfile.TarInfo(name)
            entry.size = len(data)
            tar.addfile(entry, io.BytesIO(data))
    with pytest.raises(CommandError, match="a bundle cannot vouch for an unsigned provider"):
        await _import(tmp_path / "other", forged, None)
