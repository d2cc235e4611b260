"""The warm path: metadata answered from rendered bytes with a strong ETag, 304s, and the access log modes."""

from __future__ import annotations

import hashlib
import json
import time

import pytest
from structlog.testing import capture_logs

from proxy.settings.config import FreshnessTtls
from proxy.web.app_keys import MIRROR, RENDERINGS
from tests.conftest import PROVIDER, serve_proxy
from tests.fakes.packages import MODULE_FILES, Release, module_tar_gz
from tests.fakes.process import wait_for
from tests.fakes.registry import ModuleRelease

INDEX = f"/mirror/v1/{PROVIDER}/index.json"
VERSION_DOC = f"/mirror/v1/{PROVIDER}/1.0.0.json"
ARCHIVE = f"/mirror/v1/{PROVIDER}/1.0.0/linux_amd64/terraform-provider-foo_1.0.0_linux_amd64.zip"
P = "/registry/registry.example.test/providers/v1/acme/foo"
M = "/registry/registry.example.test/modules/v1/acme/net/aws"
METADATA = [
    INDEX,
    VERSION_DOC,
    f"{P}/versions",
    f"{P}/1.0.0/download/linux/amd64",
    f"{M}/versions",
    f"{M}/1.0.0/download",
]


@pytest.fixture
def net_module(registry):
    registry.static["net-1.0.0.tar.gz"] = module_tar_gz(MODULE_FILES)
    return registry.add_module(ModuleRelease("acme", "net", "aws", "1.0.0", "{base}/static/net-1.0.0.tar.gz"))


def strong_etag_of(body: bytes) -> str:
    return f'"{hashlib.sha256(body).hexdigest()[:32]}"'


@pytest.mark.parametrize("path", METADATA)
async def test_metadata_has_a_strong_etag_and_answers_304_when_it_matches(proxy, net_module, path):
    status, headers, body = await proxy.get(path)
    assert status == 200 and headers["Content-Type"] == "application/json"
    etag = headers["ETag"]
    assert etag == strong_etag_of(body)
    for given in (etag, f"W/{etag}", f'"other", {etag}', "*"):  # weak comparison (RFC 9110 13.1.2)
        status, headers, again = await proxy.get(path, headers={"If-None-Match": given})
        assert (status, headers["ETag"], again) == (304, etag, b""), given
    status, headers, again = await proxy.get(path, headers={"If-None-Match": '"something-else"'})
    assert (status, headers["ETag"], again) == (200, etag, body)


async def test_module_download_keeps_its_header_on_a_304(proxy, net_module):
    _, headers, _ = await proxy.get(f"{M}/1.0.0/download")
    status, again, _ = await proxy.get(f"{M}/1.0.0/download", headers={"If-None-Match": headers["ETag"]})
    assert status == 304 and again["X-Terraform-Get"] == headers["X-Terraform-Get"]


async def test_a_warm_hit_neither_decodes_nor_encodes_json(proxy, net_module, monkeypatch):
    # The archive first: a download document starts its download, whose record changes `:version.json` (h1:).
    assert (await proxy.get(ARCHIVE))[0] == 200
    for path in METADATA * 2:  # fill the cache; the second answer is a hit (rendered once more, then kept)
        assert (await proxy.get(path))[0] == 200
    calls: list[str] = []
    for name in ("loads", "dumps"):
        original = getattr(json, name)
        monkeypatch.setattr(
            json, name, lambda *a, _name=name, _original=original, **k: (calls.append(_name), _original(*a, **k))[1]
        )
    renders = proxy.app[RENDERINGS].renders
    for path in METADATA * 3:
        assert (await proxy.get(path))[0] == 200
    assert calls == []
    assert proxy.app[RENDERINGS].renders == renders


async def test_the_etag_changes_when_the_version_list_changes(make_settings, client_ssl, registry, signing_key):
    settings = make_settings(freshness=FreshnessTtls(versions=0))  # always refreshed (revalidated)
    async with serve_proxy(settings, client_ssl) as running:
        _, headers, body = await running.get(INDEX)
        _, same, _ = await running.get(INDEX)
        assert same["ETag"] == headers["ETag"]  # revalidated, unchanged: the same answer
        registry.add(Release("acme", "foo", "2.0.0", signing_key))
        status, changed, new_body = await running.get(INDEX, headers={"If-None-Match": headers["ETag"]})
        assert status == 200 and changed["ETag"] != headers["ETag"]
        assert "2.0.0" in json.loads(new_body)["versions"] and "2.0.0" not in json.loads(body)["versions"]


async def test_the_version_document_gains_h1_once_its_archive_is_stored(proxy):
    _, headers, body = await proxy.get(VERSION_DOC)
    assert not [h for h in json.loads(body)["archives"]["linux_amd64"]["hashes"] if h.startswith("h1:")]
    assert (await proxy.get(ARCHIVE))[0] == 200
    status, changed, new_body = await proxy.get(VERSION_DOC, headers={"If-None-Match": headers["ETag"]})
    assert status == 200 and changed["ETag"] == strong_etag_of(new_body) != headers["ETag"]
    assert [h for h in json.loads(new_body)["archives"]["linux_amd64"]["hashes"] if h.startswith("h1:")]


@pytest.mark.parametrize("mode, logged", [("all", {200, 404}), ("errors", {404}), ("off", set())])
async def test_access_log_modes(make_local_settings, client_ssl, mode, logged):
    async with serve_proxy(make_local_settings(access_log=mode), client_ssl) as running:
        with capture_logs() as logs:
            assert (await running.get(INDEX))[0] == 200
            assert (await running.get(f"/mirror/v1/{PROVIDER}/9.9.9.json"))[0] == 404
    assert {e["status"] for e in logs if e["event"] == "request"} == logged


async def test_a_fresh_version_list_is_answered_from_memory_and_revalidated_once_stale(proxy, registry, monkeypatch):
    """The fresh-until shortcut: no store read for the version list while it is fresh, a revalidation
    with the upstream (and nothing served from memory) once it is stale."""
    versions_path = "/v1/providers/acme/foo/versions"
    mirror = proxy.app[MIRROR]
    now = [time.time()]
    monkeypatch.setattr(mirror._documents, "clock", lambda: now[0])
    assert (await proxy.get(VERSION_DOC))[0] == 200
    assert registry.count(versions_path) == 1
    asked: list[str] = []
    metadata = mirror._metadata
    versions_entry = metadata._versions_entry
    monkeypatch.setattr(
        metadata, "_versions_entry", lambda addr, *a, **k: (asked.append(str(addr)), versions_entry(addr, *a, **k))[1]
    )
    for path in (VERSION_DOC, INDEX) * 3:
        assert (await proxy.get(path))[0] == 200
    assert asked == []  # fresh: answered from memory

    now[0] += FreshnessTtls().versions + 1  # the version list is stale now
    status, _, body = await proxy.get(INDEX)
    assert status == 200 and "1.0.0" in json.loads(body)["versions"]
    assert asked == [PROVIDER]
    await wait_for(lambda: registry.completed_count(versions_path) == 2, 10, "the revalidation of the version list")
    status, _, _ = await proxy.get(VERSION_DOC)  # refreshed at the (fake) now: fresh again
    assert status == 200 and asked in ([PROVIDER], [PROVIDER] * 2)  # at most once more, to see the refresh
    for path in (VERSION_DOC, INDEX) * 3:
        assert (await proxy.get(path))[0] == 200
    assert len(asked) <= 2
