"""Operations hygiene over real HTTPS: the client address behind trusted proxies, health probes at debug,
and a Server header without versions."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from proxy import __version__
from proxy.settings.config import parse_networks
from tests.conftest import METADATA_SECRET, PROVIDER, serve_proxy

INDEX = f"/mirror/v1/{PROVIDER}/index.json"


def _remotes(logs: list[dict]) -> list[str]:
    return [entry["remote"] for entry in logs if entry["event"] == "request"]


async def test_x_forwarded_for_is_believed_only_from_trusted_proxies(make_local_settings, client_ssl):
    forged = {"X-Forwarded-For": "6.6.6.6, 203.0.113.9"}
    async with serve_proxy(make_local_settings(), client_ssl) as untrusting:  # default: trust no one
        with capture_logs() as logs:
            await untrusting.get(INDEX, headers=forged)
    assert _remotes(logs) == ["127.0.0.1"]
    trusted = parse_networks(["127.0.0.0/8"])
    async with serve_proxy(make_local_settings(trusted_proxies=trusted), client_ssl) as behind_proxy:
        with capture_logs() as logs:
            await behind_proxy.get(INDEX, headers=forged)
            await behind_proxy.get(INDEX)
    assert _remotes(logs) == ["203.0.113.9", "127.0.0.1"]
    other = parse_networks(["10.0.0.0/8"])
    async with serve_proxy(make_local_settings(trusted_proxies=other), client_ssl) as elsewhere:
        with capture_logs() as logs:
            await elsewhere.get(INDEX, headers=forged)
    assert _remotes(logs) == ["127.0.0.1"]  # the peer is not a trusted proxy: its header is ignored


@pytest.mark.one_metadata_store
async def test_health_probes_are_logged_at_debug(proxy):
    with capture_logs() as logs:
        for path in ("/healthz", "/readyz", INDEX):
            await proxy.get(path)
    access = [(entry["log_level"], entry.get("path")) for entry in logs if entry["event"] == "request"]
    assert access == [("debug", "/healthz"), ("debug", "/readyz"), ("info", INDEX)]


@pytest.mark.one_metadata_store
@pytest.mark.parametrize("kind", ["ok", "not found", "not modified", "bad request", "metrics"])
async def test_no_server_version(proxy, kind):
    if kind == "not modified":
        _, first, _ = await proxy.get(INDEX)
        status, headers, _ = await proxy.get(INDEX, headers={"If-None-Match": first["ETag"]})
        assert status == 304
    else:
        path = {
            "ok": INDEX,
            "not found": "/no/such/thing",
            "bad request": "/mirror/v1/bad..host/a/b/index.json",
            "metrics": "/metrics",
        }[kind]
        status, headers, _ = await proxy.get(path)
        assert status == {"ok": 200, "not found": 404, "bad request": 400, "metrics": 200}[kind]
    assert headers.getall("Server") == ["registry-proxy"]


ARCHIVE = f"/mirror/v1/{PROVIDER}/1.0.0/linux_amd64/terraform-provider-foo_1.0.0_linux_amd64.zip"


def _samples(exposition: bytes) -> dict[str, float]:
    lines = exposition.decode().splitlines()
    return {line.rpartition(" ")[0]: float(line.rpartition(" ")[2]) for line in lines if not line.startswith("#")}


async def test_metric_names_follow_the_conventions(proxy, metadata_backend):
    status, _, archive = await proxy.get(ARCHIVE)
    assert status == 200
    samples = _samples((await proxy.get("/metrics"))[2])
    assert [k for k in samples if k.startswith("registry_proxy_build_info{")] == [
        next(k for k in samples if f'version="{__version__}"' in k and k.startswith("registry_proxy_build_info"))
    ]
    assert samples['registry_proxy_request_duration_seconds_bucket{le="900.0",route="mirror_archive"}'] == 1
    assert 'registry_proxy_request_duration_seconds_bucket{le="600.0",route="mirror_archive"}' in samples
    assert not [k for k in samples if k.startswith("registry_proxy_request_seconds")]  # the old name is gone
    upstream = [k for k in samples if k.startswith("registry_proxy_upstream_request_duration_seconds_count{")]
    assert upstream == ['registry_proxy_upstream_request_duration_seconds_count{host="127.0.0.1"}']
    assert samples[upstream[0]] >= 4  # discovery, versions, download document, SHA256SUMS (+ signature, archive)
    assert samples["registry_proxy_archive_served_bytes_total"] == len(archive)
    assert samples["registry_proxy_store_objects"] == 1
    assert samples["registry_proxy_store_bytes"] == len(archive)
    if metadata_backend == "redis":
        assert samples["registry_proxy_redis_up"] == 1
    else:
        assert "registry_proxy_redis_up" not in samples
    counters = [
        line.split()[2]
        for line in (await proxy.get("/metrics"))[2].decode().splitlines()
        if line.startswith("# TYPE") and line.split()[3] == "counter"
    ]
    assert counters and all(name.endswith("_total") for name in counters)


async def test_redis_up_is_0_while_redis_does_not_answer(make_local_settings, client_ssl, refused_port):
    settings = make_local_settings(redis_url=f"redis://127.0.0.1:{refused_port}/0", metadata_secret=METADATA_SECRET)
    async with serve_proxy(settings, client_ssl) as running:
        samples = _samples((await running.get("/metrics"))[2])
    assert samples["registry_proxy_redis_up"] == 0
