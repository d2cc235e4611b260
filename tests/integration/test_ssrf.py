"""The SSRF guard: upstream documents cannot point the proxy at private or loopback addresses."""

from __future__ import annotations

import pytest

from tests.conftest import PROVIDER, serve_proxy
from tests.fakes.registry import Fault

# The metadata store does not matter to what these tests check (the contract suites, the warm-path,
# freshness and failure tests run over both): the embedded store only.
pytestmark = pytest.mark.one_metadata_store

ARCHIVE = f"/mirror/v1/{PROVIDER}/1.0.0/linux_amd64/terraform-provider-foo_1.0.0_linux_amd64.zip"
INDEX = f"/mirror/v1/{PROVIDER}/index.json"


async def test_download_url_on_another_loopback_port_is_refused(proxy, registry):
    registry.files_base = "https://127.0.0.1:1"
    status, body = await proxy.json(ARCHIVE)
    assert (status, body["code"]) == (502, "forbidden_upstream_address")


async def test_download_url_on_cloud_metadata_address_is_refused(proxy, registry):
    registry.files_base = "https://169.254.169.254"
    status, body = await proxy.json(ARCHIVE)
    assert (status, body["code"]) == (502, "forbidden_upstream_address")
    assert "169.254.169.254 is not a public address" in body["errors"][0]  # names the address refused


async def test_hostname_resolving_to_loopback_is_refused(proxy, registry):
    registry.files_base = f"https://localhost:{registry.port}"
    status, body = await proxy.json(ARCHIVE)
    assert (status, body["code"]) == (502, "forbidden_upstream_address")


async def test_operator_can_allow_a_private_host(make_settings, client_ssl, registry):
    registry.files_base = f"https://localhost:{registry.port}"
    async with serve_proxy(make_settings(allowed_private_hosts=frozenset({"localhost"})), client_ssl) as running:
        status, _, _ = await running.get(ARCHIVE)
        assert status == 200


async def test_plain_http_download_urls_are_refused(proxy, registry):
    registry.files_base = "http://downloads.example.com"
    status, body = await proxy.json(ARCHIVE)
    assert (status, body["code"]) == (502, "forbidden_upstream_address")


async def test_redirect_to_a_private_address_is_refused(proxy, registry):
    registry.faults["/.well-known/terraform.json"] = Fault(
        status=302, headers={"Location": "https://10.0.0.1/.well-known/terraform.json"}
    )
    status, body = await proxy.json(INDEX)
    assert (status, body["code"]) == (502, "forbidden_upstream_address")
    assert "10.0.0.1 is not a public address" in body["errors"][0]  # the redirect's target, named


async def test_service_url_pointing_at_metadata_address_is_refused(proxy, registry):
    registry.discovery = {"providers.v1": "https://[::ffff:169.254.169.254]/v1/providers/"}
    status, body = await proxy.json(INDEX)
    assert (status, body["code"]) == (502, "forbidden_upstream_address")
