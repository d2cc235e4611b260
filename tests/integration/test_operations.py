"""Operations hygiene over real HTTPS: the client address behind trusted proxies, health probes at debug,
and a Server header without versions."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from proxy.config import parse_networks
from tests.conftest import PROVIDER, serve_proxy

INDEX = f"/mirror/v1/{PROVIDER}/index.json"


def _remotes(logs: list[dict]) -> list[str]:
    return [entry["remote"] for entry in logs if entry["event"] == "request"]


async def test_x_forwarded_for_is_believed_only_from_trusted_proxies(make_local_settings, client_ssl):
    forged = {"X-Forwarded-For": "6.6.6.6, 203.0.113.9"}
    async with serve_proxy(make_local_settings(), client_ssl) as untrusting:  # default: trust no one
        with capture_logs() as logs:
            await untrusting.get(INDEX, headers=forged)
    assert _remotes(logs) == ["127.0.0.1"]
    trusted = parse_networks(["127.0.0.0/8"], "--trusted-proxies")
    async with serve_proxy(make_local_settings(trusted_proxies=trusted), client_ssl) as behind_proxy:
        with capture_logs() as logs:
            await behind_proxy.get(INDEX, headers=forged)
            await behind_proxy.get(INDEX)
    assert _remotes(logs) == ["203.0.113.9", "127.0.0.1"]
    other = parse_networks(["10.0.0.0/8"], "--trusted-proxies")
    async with serve_proxy(make_local_settings(trusted_proxies=other), client_ssl) as elsewhere:
        with capture_logs() as logs:
            await elsewhere.get(INDEX, headers=forged)
    assert _remotes(logs) == ["127.0.0.1"]  # the peer is not a trusted proxy: its header is ignored


async def test_health_probes_are_logged_at_debug(proxy):
    with capture_logs() as logs:
        for path in ("/healthz", "/readyz", INDEX):
            await proxy.get(path)
    access = [(entry["log_level"], entry.get("path")) for entry in logs if entry["event"] == "request"]
    assert access == [("debug", "/healthz"), ("debug", "/readyz"), ("info", INDEX)]


@pytest.mark.parametrize("kind", ["ok", "not found", "not modified", "bad request", "metrics"])
async def test_no_server_version(proxy, kind):
    if kind == "not modified":
        _, first, _ = await proxy.get(INDEX)
        status, headers, _ = await proxy.get(INDEX, headers={"If-None-Match": first["ETag"]})
        assert status == 304
    else:
        path = {"ok": INDEX, "not found": "/no/such/thing", "bad request": "/mirror/v1/bad..host/a/b/index.json",
                "metrics": "/metrics"}[kind]
        status, headers, _ = await proxy.get(path)
        assert status == {"ok": 200, "not found": 404, "bad request": 400, "metrics": 200}[kind]
    assert headers.getall("Server") == ["registry-proxy"]
