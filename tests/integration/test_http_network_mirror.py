"""The network mirror JSON documents: content, status codes, validation, allowlist."""

from __future__ import annotations

import io
import zipfile

import pytest

from proxy.domain.hashes import h1_of_zip
from tests.conftest import PROVIDER, serve_proxy
from tests.fakes.packages import Release, provider_zip

# The metadata store does not matter to what these tests check (the contract suites, the warm-path,
# freshness and failure tests run over both): the embedded store only.
pytestmark = pytest.mark.one_metadata_store


async def test_index_lists_canonical_versions_as_application_json(proxy):
    async with proxy.session.get(f"{proxy.url}/mirror/v1/{PROVIDER}/index.json") as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "application/json"
        assert await response.json() == {"versions": {"1.0.0": {}, "1.1.0": {}}}


async def test_version_document_has_signed_zh_for_every_platform(proxy, registry):
    status, body = await proxy.json(f"/mirror/v1/{PROVIDER}/1.0.0.json")
    assert status == 200
    release = registry.releases[("acme", "foo")]["1.0.0"]
    assert set(body["archives"]) == set(release.platforms)
    for platform, entry in body["archives"].items():
        assert entry["hashes"] == [f"zh:{release.sha256(platform)}"]
        assert entry["url"] == f"1.0.0/{platform}/terraform-provider-foo_1.0.0_{platform}.zip"
    # Lazy: listing a version downloads no archive.
    assert not [path for _, path in registry.requests if path.endswith(".zip")]


async def test_version_document_gains_both_h1_forms_once_archive_is_verified(proxy, registry, signing_key):
    release = Release("acme", "foo", "2.0.0", signing_key, platforms=("linux_amd64",))
    release.zips["linux_amd64"] = provider_zip("foo", "2.0.0", "linux_amd64", directory_entry=True)
    release.resign()
    registry.add(release)
    name = "terraform-provider-foo_2.0.0_linux_amd64.zip"
    status, _, _ = await proxy.get(f"/mirror/v1/{PROVIDER}/2.0.0/linux_amd64/{name}")
    assert status == 200
    status, body = await proxy.json(f"/mirror/v1/{PROVIDER}/2.0.0.json")
    zip_form, dir_form = map(str, h1_of_zip(io.BytesIO(release.zips["linux_amd64"])))
    assert zip_form != dir_form  # the zip has a directory entry
    zh = f"zh:{release.sha256('linux_amd64')}"
    assert body["archives"]["linux_amd64"]["hashes"] == sorted([zip_form, dir_form, zh])
    with zipfile.ZipFile(io.BytesIO(release.zips["linux_amd64"])) as archive:
        assert "docs/" in archive.namelist()


@pytest.mark.parametrize(
    "path, status, code",
    [
        (f"/mirror/v1/{PROVIDER.replace('foo', 'nope')}/index.json", 404, "provider_not_found"),
        (f"/mirror/v1/{PROVIDER}/9.9.9.json", 404, "version_not_found"),
        (f"/mirror/v1/{PROVIDER}/index.txt", 404, "document_not_found"),
        ("/mirror/v1/registry.example.test/acme/../index.json", 404, "endpoint_not_found"),
        ("/mirror/v1/registry.example.test/ac%2fme/foo/index.json", 400, "invalid_address"),
        ("/mirror/v1/registry.example.test/-acme/foo/index.json", 400, "invalid_address"),
        ("/mirror/v1/registry.example.test/acme/" + "f" * 65 + "/index.json", 400, "invalid_address"),
        ("/mirror/v1/registry.example.test/acme/foo/1.0.json", 400, "invalid_address"),
        ("/mirror/v1/registry.example.test/acme/foo/not-a-version.json", 400, "invalid_address"),
        ("/mirror/v1/bad_host!/acme/foo/index.json", 400, "invalid_address"),
        ("/nothing/here", 404, "endpoint_not_found"),
    ],
)
async def test_errors_have_the_right_status_and_a_json_body(proxy, path, status, code):
    got, body = await proxy.json(path)
    assert (got, body["code"]) == (status, code), body
    assert isinstance(body["errors"], list) and body["errors"] and all(isinstance(m, str) for m in body["errors"])


async def test_disallowed_host_is_refused_without_any_upstream_request(proxy, registry):
    got, body = await proxy.json("/mirror/v1/registry.terraform.io/hashicorp/aws/index.json")
    assert (got, body["code"]) == (403, "host_not_allowed")
    assert registry.requests == []


async def test_hostnames_are_normalised_before_the_allowlist(make_settings, client_ssl, registry):
    async with serve_proxy(make_settings(), client_ssl) as running:
        got, body = await running.json("/mirror/v1/REGISTRY.Example.TEST/acme/foo/index.json")
        assert got == 200, body


async def test_default_allowlist_names_the_public_registries(make_settings, client_ssl):
    from proxy.settings.config import DEFAULT_ALLOWED_HOSTS

    async with serve_proxy(
        make_settings(allowed_hosts=frozenset(DEFAULT_ALLOWED_HOSTS), upstream_map={}), client_ssl
    ) as running:
        got, body = await running.json("/mirror/v1/evil.example.com/acme/foo/index.json")
        assert (got, body["code"]) == (403, "host_not_allowed")
        assert "--allow-host" in body["errors"][0]  # says how the operator allows it


async def test_health_ready_and_metrics(proxy):
    assert (await proxy.json("/healthz")) == (200, {"status": "ok"})
    status, body = await proxy.json("/readyz")
    assert status == 200 and body["checks"] == {"metadata_store": True, "archive_store": True, "disk_space": True}
    await proxy.json(f"/mirror/v1/{PROVIDER}/index.json")
    status, _, text = await proxy.get("/metrics")
    assert status == 200
    assert b'registry_proxy_requests_total{route="mirror_json",status="200"} 1.0' in text
