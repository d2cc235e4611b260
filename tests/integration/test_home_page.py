"""The page at `/` and `/ca.pem`: the application in process (both metadata stores), `serve` in process (its
generated CA, plain HTTP) and a real proxy process of two workers."""

from __future__ import annotations

import asyncio
import json
import re
import ssl
from html import unescape

import aiohttp
import pytest

from proxy.governance.inventory import InventoryReader
from proxy.web.app_keys import INVENTORY
from proxy.web.home_page import human_size
from tests.conftest import PROVIDER, REGISTRY_HOST
from tests.fakes.packages import MODULE_FILES, module_tar_gz
from tests.fakes.registry import ModuleRelease

ARCHIVE = f"/mirror/v1/{PROVIDER}/1.0.0/linux_amd64/terraform-provider-foo_1.0.0_linux_amd64.zip"
ARCHIVE_ARM = f"/mirror/v1/{PROVIDER}/1.0.0/darwin_arm64/terraform-provider-foo_1.0.0_darwin_arm64.zip"
MODULE = f"/registry/{REGISTRY_HOST}/modules/v1/acme/net/aws/1.0.0"


@pytest.fixture
def net_module(registry):
    registry.static["net-1.0.0.tar.gz"] = module_tar_gz(MODULE_FILES)
    return registry.add_module(ModuleRelease("acme", "net", "aws", "1.0.0", "{base}/static/net-1.0.0.tar.gz"))


async def fetch_module(proxy) -> None:
    status, headers, _ = await proxy.get(f"{MODULE}/download")
    assert status == 200
    status, _, _ = await proxy.get(headers["X-Terraform-Get"])
    assert status == 200


def rows(html: str, table: str) -> list[str]:
    """The text of each body row of a table, tags stripped."""
    body = html[html.index(f'<table id="{table}">') :]
    body = body[: body.index("</table>")]
    found = re.findall(r"<tr data-search.*?</tr>", body.replace("<wbr>", ""), re.S)
    return [" ".join(unescape(re.sub(r"<[^>]+>", " ", row)).split()) for row in found]


async def test_the_page_lists_what_was_just_cached(proxy, registry, net_module, signing_key):
    status, _, before = await proxy.get("/")
    assert status == 200 and b"No provider cached yet" in before
    for path in (ARCHIVE, ARCHIVE_ARM):
        assert (await proxy.get(path))[0] == 200
    await fetch_module(proxy)
    status, headers, body = await proxy.get("/")
    html = body.decode()
    assert status == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
    size = sum(len(registry.releases[("acme", "foo")]["1.0.0"].zips[p]) for p in ("linux_amd64", "darwin_arm64"))
    [provider] = rows(html, "providers")
    assert provider.startswith(f"{PROVIDER} 1.0.0 darwin_arm64 linux_amd64")  # platforms of one version, one row
    assert signing_key.fingerprint[-16:] in provider
    assert "not tracked" not in provider and re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", provider)  # served now
    assert f'title="{signing_key.fingerprint}"' in html
    assert human_size(size) in provider
    [module] = rows(html, "modules")
    assert module.startswith(f"{REGISTRY_HOST}/acme/net/aws 1.0.0") and "/static/net-1.0.0.tar.gz" in module
    # the mapped upstream was discovered for these requests: the page says so without asking it again
    requests = len(registry.requests)
    upstream = html[html.index('id="upstreams"') : html.index('id="cache"')]
    assert REGISTRY_HOST in upstream and registry.url in upstream and ">ok<" in upstream
    assert len(registry.requests) == requests


async def test_search_filters_on_the_server(proxy, net_module):
    assert (await proxy.get(ARCHIVE))[0] == 200
    await fetch_module(proxy)
    html = (await proxy.get("/", params={"q": "acme/net"}))[2].decode()
    assert 'id="providers"' not in html and len(rows(html, "modules")) == 1
    assert 'value="acme/net"' in html
    html = (await proxy.get("/", params={"q": "foo@1.0.0 linux"}))[2].decode()
    assert len(rows(html, "providers")) == 1 and 'id="modules"' not in html
    html = (await proxy.get("/", params={"q": "<script>nothing"}))[2].decode()
    assert "No cached provider matches “&lt;script&gt;nothing”" in html and "<script>nothing" not in html


async def test_the_listing_is_bounded_and_counts_the_rest(proxy, net_module):
    for path in (ARCHIVE, ARCHIVE_ARM):
        assert (await proxy.get(path))[0] == 200
    await fetch_module(proxy)
    inventory = await proxy.app[INVENTORY].scan("", limit=1)
    assert len(inventory.providers) + len(inventory.modules) == 1 and inventory.more == 2 and inventory.complete


async def test_last_served_comes_from_the_lookup(proxy, registry):
    assert (await proxy.get(ARCHIVE))[0] == 200
    sha = registry.releases[("acme", "foo")]["1.0.0"].sha256("linux_amd64")

    class Served:
        asked: list[str] = []

        async def last_served(self, sha256s: list[str]) -> dict[str, float]:
            self.asked.extend(sha256s)
            return {sha: 1_700_000_000.0}

    reader = proxy.app[INVENTORY]
    served = Served()
    inventory = await InventoryReader(proxy.app[INVENTORY]._settings, reader._store, served).scan()
    assert served.asked == [sha]
    assert [p.last_served for p in inventory.providers] == [1_700_000_000.0]


@pytest.mark.one_metadata_store
async def test_head_headers_and_content_security_policy(proxy):
    async with proxy.session.head(proxy.url + "/") as response:
        assert response.status == 200 and await response.read() == b""
        assert response.headers["Content-Type"] == "text/html; charset=utf-8"
    status, headers, body = await proxy.get("/")
    assert status == 200
    policy = headers["Content-Security-Policy"]
    nonce = re.search(r"script-src 'nonce-([A-Za-z0-9_-]+)'", policy).group(1)
    assert "default-src 'none'" in policy and "unsafe-inline" not in policy and f"style-src 'nonce-{nonce}'" in policy
    assert body.count(f'nonce="{nonce}"'.encode()) == 2
    assert (await proxy.get("/"))[1]["Content-Security-Policy"] != policy  # a fresh nonce per response
    assert headers["X-Content-Type-Options"] == "nosniff" and headers["Cache-Control"] == "no-store"


@pytest.mark.one_metadata_store
async def test_no_ca_download_when_the_operator_gave_the_certificate(proxy):
    status, headers, body = await proxy.get("/ca.pem")
    assert status == 404 and headers["Content-Type"] == "application/json"
    assert json.loads(body)["code"] == "ca_not_found"
    assert b'href="ca.pem"' not in (await proxy.get("/"))[2]


@pytest.mark.one_metadata_store
async def test_the_host_header_becomes_the_snippet_url_only_when_it_is_a_plain_host(proxy):
    html = (await proxy.get("/", headers={"Host": "proxy.example.com:9443"}))[2].decode()
    assert 'url = "https://proxy.example.com:9443/mirror/v1/"' in unescape(html)
    html = (await proxy.get("/", headers={"Host": 'x"><script>alert(1)</script>'}))[2].decode()
    settings = proxy.app[INVENTORY]._settings
    assert f'url = "https://{settings.server.listen_host}:{settings.server.listen_port}/mirror/v1/"' in unescape(html)
    assert "<script>alert" not in html


# ---- real processes ----------------------------------------------------------------------------


def trusting(process) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(process.ca_file))


async def page_when(session: aiohttp.ClientSession, process, wanted: str) -> str:
    """The page once it shows `wanted` (a worker counts an archive's bytes after writing the last of them)."""
    async with asyncio.timeout(10):
        while True:
            async with session.get(process.url + "/", ssl=trusting(process)) as response:
                html = await response.text()
            if wanted in html:
                return html
            await asyncio.sleep(0.05)


async def test_a_proxy_process_offers_its_generated_ca_and_counts_what_it_served(in_process_proxy, registry):
    process = await in_process_proxy()
    async with aiohttp.ClientSession() as session:
        async with session.get(process.url + "/ca.pem", ssl=trusting(process)) as response:
            assert response.status == 200 and response.headers["Content-Type"] == "application/x-pem-file"
            assert await response.read() == process.ca_file.read_bytes()
            assert "ca-key" not in response.headers["Content-Disposition"]
        async with session.get(process.url + ARCHIVE, ssl=trusting(process)) as response:
            served = len(await response.read())
            assert response.status == 200
        html = await page_when(session, process, f'id="stat-served">{human_size(served)}<')
    assert 'href="ca.pem"' in html
    assert f'url = "{process.url}/mirror/v1/"' in unescape(html)
    assert [row.split()[:3] for row in rows(html, "providers")] == [[PROVIDER, "1.0.0", "linux_amd64"]]
    assert "of this server process" in html
    assert re.search(r'id="stat-fetches">[1-9]', html)


async def test_with_workers_the_numbers_are_every_workers_and_the_public_url_is_used(proxy_process, registry):
    process = await proxy_process("--workers", "2", "--public-url", "https://mirror.example.org/tf/")
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
        for path in (ARCHIVE, ARCHIVE_ARM):  # a connection each: either worker may take them
            async with session.get(process.url + path, ssl=trusting(process)) as response:
                assert response.status == 200
                await response.read()
        release = registry.releases[("acme", "foo")]["1.0.0"]
        served = human_size(len(release.zips["linux_amd64"]) + len(release.zips["darwin_arm64"]))
        html = unescape(await page_when(session, process, f'id="stat-served">{served}<'))
    assert "summed over all worker processes" in html
    assert 'url = "https://mirror.example.org/tf/mirror/v1/"' in html
    assert '"modules.v1"   = "https://mirror.example.org/tf/registry/registry.example.test/modules/v1/"' in html


async def test_plain_http_has_no_ca_and_warns_that_clients_need_https(in_process_proxy):
    process = await in_process_proxy("--plain-http")
    async with aiohttp.ClientSession() as session:
        async with session.get(process.url + "/ca.pem") as response:
            assert response.status == 404 and (await response.json())["code"] == "ca_not_found"
        async with session.get(process.url + "/") as response:
            html = await response.text()
    assert "accept only <code>https:</code>" in html and 'href="ca.pem"' not in html
