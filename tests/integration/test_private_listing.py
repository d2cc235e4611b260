"""What the proxy lists of itself (the page, /metrics, error messages) shows a client only what its token
may read: a private host's name, its upstream URL, its discovery time and its `host` block never reach a
client scoped to another host, against `serve` in process (`in_process_proxy`).

The private registry listens on `localhost` and its archives are on a CDN at `127.0.0.1` (the public fake
registry's address too), so the private registry's own URL host appears nowhere but for its fetches.
"""

from __future__ import annotations

import html
import json
import ssl

import aiohttp
import pytest

from proxy.identity.tokens import hash_token
from tests.fakes.packages import Release
from tests.fakes.process import REGISTRY_HOST
from tests.fakes.registry import FakeRegistry

PRIVATE = "evilpriv.test"
UPSTREAM_TOKEN = "upstream-secret-5c1d"
ALL, SCOPED, PRIVATE_ONLY = "rpt_all_listing_01", "rpt_scoped_listing_02", "rpt_private_listing_03"
TOKENS = f"""
[tokens.all]
hash = "{hash_token(ALL)}"
hosts = ["*"]

[tokens.scoped]
hash = "{hash_token(SCOPED)}"
hosts = ["{REGISTRY_HOST}"]
namespaces = ["acme"]

[tokens.private]
hash = "{hash_token(PRIVATE_ONLY)}"
hosts = ["{PRIVATE}"]
"""
PRIVATE_VERSION = f"/mirror/v1/{PRIVATE}/corp/vault/1.0.0.json"
PUBLIC_VERSION = f"/mirror/v1/{REGISTRY_HOST}/acme/foo/1.0.0.json"


@pytest.fixture
async def cdn(upstream_ssl):
    fake = FakeRegistry(upstream_ssl)  # 127.0.0.1, like the public registry
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
async def private(upstream_ssl, signing_key, cdn):
    fake = FakeRegistry(upstream_ssl, host="localhost")
    fake.require_token = UPSTREAM_TOKEN
    cdn.add(fake.add(Release("corp", "vault", "1.0.0", signing_key)))
    fake.files_base = cdn.url
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
def private_args(tmp_path, private, cdn) -> list[str]:
    credentials = tmp_path / "upstream.tfrc"
    credentials.write_text(f'credentials "{PRIVATE}" {{\n  token = "{UPSTREAM_TOKEN}"\n}}\n')
    return [
        "--upstream-map",
        f"{PRIVATE}={private.url}",
        "--allow-private-host",
        f"127.0.0.1:{cdn.port}",
        "--upstream-credentials",
        str(credentials),
    ]


async def get(proxy, path: str, token: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    context = ssl.create_default_context(cafile=str(proxy.ca_file))
    async with aiohttp.ClientSession() as session, session.get(proxy.url + path, ssl=context, headers=headers) as r:
        text = (await r.read()).decode(errors="replace")
        return r.status, html.unescape(text) if r.content_type == "text/html" else text


async def fetch_archive(proxy, version_path: str, token: str) -> None:
    """What `init` does: the version document with a token, then its archive with the grant it carries."""
    status, body = await get(proxy, version_path, token)
    assert status == 200, body
    url = json.loads(body)["archives"]["linux_amd64"]["url"]
    status, _ = await get(proxy, version_path.rpartition("/")[0] + "/" + url)
    assert status == 200


def private_traces(text: str, private: FakeRegistry) -> list[str]:
    """Whatever of the private registry the text names: its host, its upstream URL, its URL's host."""
    return [trace for trace in (PRIVATE, private.url, "localhost") if trace in text]


async def test_the_page_and_metrics_show_a_token_only_the_hosts_it_may_read(
    in_process_proxy, tmp_path, private_args, private
):
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(TOKENS)
    proxy = await in_process_proxy(*private_args, "--auth-tokens", str(tokens))
    await fetch_archive(proxy, PRIVATE_VERSION, ALL)  # discovered, fetched, cached
    await fetch_archive(proxy, PUBLIC_VERSION, ALL)

    status, everything = await get(proxy, "/", ALL)
    assert status == 200 and PRIVATE in everything and f'host "{PRIVATE}"' in everything  # the listing is there
    assert f"{REGISTRY_HOST}/acme/foo" in everything
    status, page = await get(proxy, "/", SCOPED)
    assert status == 200 and f"{REGISTRY_HOST}/acme/foo" in page
    assert private_traces(page, private) == []  # no name, no upstream URL, no host block, no discovery row
    status, page = await get(proxy, "/", PRIVATE_ONLY)
    assert status == 200 and f"{PRIVATE}/corp/vault" in page and f"{REGISTRY_HOST}/acme" not in page

    # /metrics is open here (no --metrics-token-required): a private host's series only for its readers
    status, metrics = await get(proxy, "/metrics")
    assert status == 200 and "registry_proxy_upstream_request_duration_seconds" in metrics
    assert private_traces(metrics, private) == []
    assert private_traces((await get(proxy, "/metrics", SCOPED))[1], private) == []
    assert f'host="{PRIVATE}"' in (await get(proxy, "/metrics", ALL))[1]

    # a refusal names only what the client asked for
    status, body = await get(proxy, PRIVATE_VERSION, SCOPED)
    assert status == 403 and private.url not in body and "localhost" not in body


async def test_without_client_tokens_nothing_names_a_private_host(in_process_proxy, tmp_path, private_args, private):
    with_tokens = tmp_path / "tokens.toml"
    with_tokens.write_text(TOKENS)
    first = await in_process_proxy(*private_args, "--auth-tokens", str(with_tokens), data_dir=tmp_path / "data")
    await fetch_archive(first, PRIVATE_VERSION, ALL)
    await first.stop()
    proxy = await in_process_proxy(*private_args, data_dir=tmp_path / "data")  # the same store, no client tokens
    await fetch_archive(proxy, PUBLIC_VERSION, "")
    await get(proxy, PRIVATE_VERSION)  # refused: nothing fetched

    status, page = await get(proxy, "/")
    assert status == 200 and f"{REGISTRY_HOST}/acme/foo" in page
    assert private_traces(page, private) == []
    status, metrics = await get(proxy, "/metrics")
    assert status == 200 and private_traces(metrics, private) == []
    # a private host is refused as any host the proxy does not serve: the answer does not confirm it exists
    private_status, private_body = await get(proxy, PRIVATE_VERSION)
    unknown_status, unknown_body = await get(proxy, "/mirror/v1/unknown.test/corp/vault/1.0.0.json")
    assert private_status == unknown_status == 403
    assert json.loads(private_body) == json.loads(unknown_body.replace("unknown.test", PRIVATE))
