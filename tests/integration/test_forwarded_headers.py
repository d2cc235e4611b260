"""RFC 7239 `Forwarded` from a trusted balancer (`--forwarded-headers forwarded`), against `serve` in process:
the balancer is a client connecting from 127.0.0.2, the one trusted address; 127.0.0.1 is any other peer."""

from __future__ import annotations

import aiohttp

from tests.e2e.test_page_e2e import mirror_url
from tests.fakes.nginx import NGINX_ADDRESS
from tests.fakes.process import wait_for

BALANCER = NGINX_ADDRESS


async def page_mirror_url(proxy, source: str, headers: dict[str, str]) -> str:
    """The network mirror URL of the page's snippet, for a request from `source` with `headers`."""
    connector = aiohttp.TCPConnector(local_addr=(source, 0))
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.get(proxy.url + "/", headers=headers) as response,
    ):
        assert response.status == 200
        return mirror_url(await response.text())


async def page_remotes(proxy, count: int) -> list[str]:
    """The `remote` of the page's requests in the access log, once `count` are there (it is written a moment after
    the answers)."""

    def remotes() -> list[str]:
        return [record["remote"] for record in proxy.events("request") if record["path"] == "/"]

    await wait_for(lambda: len(remotes()) >= count, 10, f"{count} page requests logged")
    return remotes()


async def test_forwarded_from_the_trusted_balancer_only(in_process_proxy) -> None:
    proxy = await in_process_proxy("--plain-http", "--trusted-proxies", BALANCER, "--forwarded-headers", "forwarded")
    chain = 'for=203.0.113.9;proto=https;host="mirror.example.com:8443", for=10.0.0.7;proto=http;host=lb.internal'
    x_forwarded = {"X-Forwarded-Proto": "http", "X-Forwarded-Host": "x-forwarded.example", "X-Forwarded-For": "6.6.6.6"}

    # The balancer's Forwarded chain: the edge element (10.0.0.7 is not trusted here) names the client's view.
    url = await page_mirror_url(
        proxy, BALANCER, {"Forwarded": "for=203.0.113.9;proto=https;host=m.example", **x_forwarded}
    )
    assert url == "https://m.example/mirror/v1/"  # X-Forwarded-* ignored in this mode
    assert await page_mirror_url(proxy, BALANCER, {"Forwarded": chain}) == "http://lb.internal/mirror/v1/"
    # The same headers from any other peer: ignored.
    direct = f"http://127.0.0.1:{proxy.port}/mirror/v1/"
    assert await page_mirror_url(proxy, "127.0.0.1", {"Forwarded": chain, **x_forwarded}) == direct

    assert await page_remotes(proxy, 3) == ["203.0.113.9", "10.0.0.7", "127.0.0.1"]


async def test_a_chain_of_trusted_balancers(in_process_proxy) -> None:
    proxy = await in_process_proxy(
        "--plain-http",
        "--trusted-proxies",
        BALANCER,
        "--trusted-proxies",
        "10.0.0.0/8",
        "--forwarded-headers",
        "forwarded",
    )
    chain = 'for=203.0.113.9;proto=https;host="mirror.example.com:8443", for=10.0.0.7;proto=http;host=lb.internal'
    assert await page_mirror_url(proxy, BALANCER, {"Forwarded": chain}) == "https://mirror.example.com:8443/mirror/v1/"
    assert await page_remotes(proxy, 1) == ["203.0.113.9"]
