"""`GET /api/v1/catalog` and `DELETE /api/v1/catalog/ADDRESS[@VERSION]` against the real application, over
the embedded store and Redis: what a token may read, a page at a time; purges under the `admin` scope that
remove records and archives (an archive another address shares by content stays) and make the next
request fetch from the upstream again."""

from __future__ import annotations

import hashlib
import json

import aiohttp
import pytest
from structlog.testing import capture_logs

from proxy.identity.tokens import hash_token
from proxy.web.app import ARCHIVE_STORE
from tests.conftest import serve_proxy
from tests.fakes.packages import MODULE_FILES, Release, module_tar_gz
from tests.fakes.process import REGISTRY_HOST
from tests.fakes.registry import ModuleRelease

ADMIN, READER, OTHER_NS = "rpt_catalog_admin_0001", "rpt_catalog_reader_002", "rpt_catalog_other_0003"
TOKENS = f"""
[tokens.admin]
hash = "{hash_token(ADMIN)}"
hosts = ["*"]
admin = true

[tokens.reader]
hash = "{hash_token(READER)}"
hosts = ["{REGISTRY_HOST}"]

[tokens.other]
hash = "{hash_token(OTHER_NS)}"
hosts = ["{REGISTRY_HOST}"]
namespaces = ["other"]
admin = true
"""
ARCHIVE = "/mirror/v1/{host}/{ns}/foo/{v}/linux_amd64/terraform-provider-foo_{v}_linux_amd64.zip"


def auth(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def catalog_settings(make_settings, tmp_path):
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(TOKENS)
    return lambda **overrides: make_settings(auth_tokens=tokens, **overrides)


@pytest.fixture
def shared(registry, signing_key) -> Release:
    """`acme/foo` 1.0.0's archives under another namespace: the same bytes, so the same content address."""
    return registry.add(Release("other", "foo", "1.0.0", signing_key))


async def fetch(proxy, namespace: str, version: str, token: str = ADMIN) -> int:
    path = ARCHIVE.format(host=REGISTRY_HOST, ns=namespace, v=version)
    status, _, _ = await proxy.get(path, headers=auth(token))
    return status


async def catalog(proxy, token: str, query: str = "") -> tuple[int, dict]:
    async with proxy.session.get(proxy.url + "/api/v1/catalog" + query, headers=auth(token)) as response:
        return response.status, await answered_json(response)


async def delete(proxy, target: str, token: str | None = ADMIN) -> tuple[int, dict]:
    headers = auth(token) if token else {}
    async with proxy.session.delete(proxy.url + "/api/v1/catalog/" + target, headers=headers) as response:
        return response.status, await answered_json(response)


async def answered_json(response: aiohttp.ClientResponse) -> dict:
    """The body of an answer of the catalog API, which is sent as every JSON answer of the proxy is: exactly
    `application/json`, compact."""
    assert response.headers["Content-Type"] == "application/json"
    body = await response.read()
    assert body == json.dumps(json.loads(body), separators=(",", ":"), ensure_ascii=False).encode()
    return json.loads(body)


async def test_the_catalog_lists_what_the_token_may_read_a_page_at_a_time(catalog_settings, client_ssl, shared):
    async with serve_proxy(catalog_settings(), client_ssl) as proxy:
        for namespace, version in (("acme", "1.0.0"), ("acme", "1.1.0"), ("other", "1.0.0")):
            assert await fetch(proxy, namespace, version) == 200

        status, body = await catalog(proxy, ADMIN)
        assert status == 200 and body["next"] is None and body["complete"] is True and body["modules"] == []
        assert [p["address"] for p in body["providers"]] == [f"{REGISTRY_HOST}/acme/foo", f"{REGISTRY_HOST}/other/foo"]
        acme = body["providers"][0]
        assert [v["version"] for v in acme["versions"]] == ["1.1.0", "1.0.0"]
        archive = acme["versions"][1]["platforms"][0]
        assert archive["platform"] == "linux_amd64" and archive["sha256"] == shared.sha256("linux_amd64")
        assert archive["size"] == len(shared.zips["linux_amd64"]) and archive["last_served"] is not None
        assert archive["signed_by"]

        status, first = await catalog(proxy, ADMIN, "?limit=1")
        assert status == 200 and [p["address"] for p in first["providers"]] == [f"{REGISTRY_HOST}/acme/foo"]
        status, second = await catalog(proxy, ADMIN, f"?limit=1&cursor={first['next']}")
        assert [p["address"] for p in second["providers"]] == [f"{REGISTRY_HOST}/other/foo"]
        assert second["next"] is None

        status, scoped = await catalog(proxy, OTHER_NS)  # a token for namespace `other` only
        assert [p["address"] for p in scoped["providers"]] == [f"{REGISTRY_HOST}/other/foo"]

        async with proxy.session.get(proxy.url + "/api/v1/catalog") as response:
            assert response.status == 401 and (await response.json())["code"] == "token_required"
        for bad in ("?limit=0", "?limit=x", "?cursor=%21%21"):
            status, body = await catalog(proxy, ADMIN, bad)
            assert status == 400 and body["code"] == "invalid_request", bad


@pytest.mark.one_metadata_store
async def test_purge_needs_an_admin_token_that_may_read_the_address(catalog_settings, client_ssl):
    async with serve_proxy(catalog_settings(), client_ssl) as proxy:
        assert await fetch(proxy, "acme", "1.0.0") == 200
        target = f"{REGISTRY_HOST}/acme/foo@1.0.0"
        status, body = await delete(proxy, target, None)
        assert status == 401 and body["code"] == "token_required"
        status, body = await delete(proxy, target, READER)
        assert status == 403 and body["code"] == "admin_scope"
        status, body = await delete(proxy, target, OTHER_NS)  # admin, but for another namespace
        assert status == 403 and body["code"] == "admin_scope"
        status, body = await delete(proxy, f"{REGISTRY_HOST}/acme", ADMIN)
        assert status == 400 and body["code"] == "invalid_address"
        status, body = await delete(proxy, f"{REGISTRY_HOST}/acme/bar", ADMIN)
        assert status == 404 and body["code"] == "not_cached"
        status, body = await catalog(proxy, ADMIN)
        assert [v["version"] for v in body["providers"][0]["versions"]] == ["1.0.0"]  # nothing was purged


@pytest.mark.one_metadata_store
async def test_without_client_tokens_nobody_purges_over_http(make_settings, client_ssl):
    async with serve_proxy(make_settings(), client_ssl) as proxy:
        assert await fetch(proxy, "acme", "1.0.0") == 200
        async with proxy.session.delete(proxy.url + f"/api/v1/catalog/{REGISTRY_HOST}/acme/foo") as response:
            assert response.status == 403 and (await response.json())["code"] == "admin_scope"


async def test_purge_removes_records_and_unshared_archives_and_the_next_request_refetches(
    catalog_settings, client_ssl, registry, shared
):
    async with serve_proxy(catalog_settings(), client_ssl) as proxy:
        for namespace, version in (("acme", "1.0.0"), ("acme", "1.1.0"), ("other", "1.0.0")):
            assert await fetch(proxy, namespace, version) == 200
        store = proxy.app[ARCHIVE_STORE]
        acme_110 = registry.releases[("acme", "foo")]["1.1.0"]
        same, own = shared.sha256("linux_amd64"), acme_110.sha256("linux_amd64")
        upstream = registry.archive_path(acme_110, "linux_amd64")
        assert await store.get(same) is not None and await store.get(own) is not None and registry.count(upstream) == 1

        with capture_logs() as logs:
            status, report = await delete(proxy, f"{REGISTRY_HOST}/acme/foo")  # every version
        assert status == 200, report
        assert report["purged"] == f"{REGISTRY_HOST}/acme/foo" and report["by"] == "token:admin"
        assert own in report["archives_removed"] and same in report["archives_kept"]  # other/foo has the same bytes
        assert await store.get(own) is None and await store.get(same) is not None
        purged = [record for record in logs if record["event"] == "catalog.purged"]
        assert len(purged) == 1 and purged[0]["who"] == "token:admin" and purged[0]["what"] == report["purged"]

        _, body = await catalog(proxy, ADMIN)
        assert [p["address"] for p in body["providers"]] == [f"{REGISTRY_HOST}/other/foo"]
        assert await fetch(proxy, "acme", "1.1.0") == 200  # fetched from the upstream again
        assert registry.count(upstream) == 2 and await store.get(own) is not None

        status, report = await delete(proxy, f"{REGISTRY_HOST}/other/foo@1.0.0")
        assert status == 200 and report["archives_removed"] == [same]  # nothing refers to it any more
        assert await store.get(same) is None
        status, body = await delete(proxy, f"{REGISTRY_HOST}/other/foo@1.0.0")
        assert status == 404 and body["code"] == "not_cached"


MODULE = f"/registry/{REGISTRY_HOST}/modules/v1/acme/net/aws"


async def test_modules_are_listed_and_purged(catalog_settings, client_ssl, registry):
    registry.static["net-1.0.0.tar.gz"] = module_tar_gz(MODULE_FILES)
    registry.add_module(ModuleRelease("acme", "net", "aws", "1.0.0", "{base}/static/net-1.0.0.tar.gz"))
    async with serve_proxy(catalog_settings(), client_ssl) as proxy:
        for _ in range(2):  # the second time from the cache
            status, _, data = await proxy.get(f"{MODULE}/1.0.0/archive.tar.gz", headers=auth(ADMIN))
            assert status == 200 and data == registry.static["net-1.0.0.tar.gz"]
        assert registry.count("/static/net-1.0.0.tar.gz") == 1
        _, body = await catalog(proxy, ADMIN)
        [module] = body["modules"]
        digest = hashlib.sha256(registry.static["net-1.0.0.tar.gz"]).hexdigest()
        assert module["address"] == f"{REGISTRY_HOST}/acme/net/aws"
        assert [(v["version"], v["sha256"]) for v in module["versions"]] == [("1.0.0", digest)]

        status, report = await delete(proxy, f"{REGISTRY_HOST}/acme/net/aws")
        assert status == 200 and report["archives_removed"] == [digest], report
        assert await proxy.app[ARCHIVE_STORE].get(digest) is None
        assert (await catalog(proxy, ADMIN))[1]["modules"] == []
        status, _, data = await proxy.get(f"{MODULE}/1.0.0/archive.tar.gz", headers=auth(ADMIN))
        assert status == 200 and registry.count("/static/net-1.0.0.tar.gz") == 2  # fetched again


async def test_a_purge_removes_the_archive_from_object_storage(
    make_local_settings, s3_server, s3_bucket, tmp_path, client_ssl, registry
):
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(TOKENS)
    settings = make_local_settings(auth_tokens=tokens, **s3_server.settings(s3_bucket))
    release = registry.releases[("acme", "foo")]["1.0.0"]
    async with serve_proxy(settings, client_ssl) as proxy:
        assert await fetch(proxy, "acme", "1.0.0") == 200
        store = proxy.app[ARCHIVE_STORE]
        assert not store.local and await store.get(release.sha256("linux_amd64")) is not None
        status, report = await delete(proxy, f"{REGISTRY_HOST}/acme/foo@1.0.0")
        assert status == 200 and report["archives_removed"] == [release.sha256("linux_amd64")]
        assert await store.get(release.sha256("linux_amd64")) is None
        assert await fetch(proxy, "acme", "1.0.0") == 200
        assert registry.count(registry.archive_path(release, "linux_amd64")) == 2


async def test_a_release_published_again_is_served_new_after_its_purge(
    catalog_settings, client_ssl, registry, signing_key
):
    """The upstream replaced 1.0.0's archives (and its SHA256SUMS, at the same URLs): after the purge the new
    ones are verified against the new SHA256SUMS and served."""
    async with serve_proxy(catalog_settings(), client_ssl) as proxy:
        assert await fetch(proxy, "acme", "1.0.0") == 200
        new = registry.add(Release("acme", "foo", "1.0.0", signing_key, padding=4096))
        status, _ = await delete(proxy, f"{REGISTRY_HOST}/acme/foo@1.0.0")
        assert status == 200
        path = ARCHIVE.format(host=REGISTRY_HOST, ns="acme", v="1.0.0")
        status, _, data = await proxy.get(path, headers=auth(ADMIN))
        assert status == 200 and data == new.zips["linux_amd64"]
