"""The SSRF guard judges IPv6 forms that carry an IPv4 address by that address (issue 8, item 10).

An upstream (here the fake registry, reached through --upstream-map) answers with URLs whose host
is an IPv6 literal for a loopback/private IPv4 address: NAT64 `64:ff9b::/96`, local-use NAT64
`64:ff9b:1::/48`, 6to4 `2002::/16`, IPv4-translated `::ffff:0:0:0/96`, IPv4-compatible `::/96`.
The old guard let them through and the proxy tried to connect (on a NAT64 network, to 127.0.0.1).
The guard needs no process boundary: the application is served in the test's process.
"""

from __future__ import annotations

import ipaddress
import json

import pytest

from tests.conftest import PROVIDER

INDEX = f"/mirror/v1/{PROVIDER}/index.json"
ARCHIVE = f"/mirror/v1/{PROVIDER}/1.0.0/linux_amd64/terraform-provider-foo_1.0.0_linux_amd64.zip"

LITERALS = [
    "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
    "64:ff9b::a00:1",  # NAT64 of 10.0.0.1
    "64:ff9b:1::7f00:1",  # local-use NAT64
    "2002:7f00:1::",  # 6to4 of 127.0.0.1
    "2002:a9fe:a9fe::1",  # 6to4 of 169.254.169.254 (cloud metadata)
    "::ffff:0:7f00:1",  # IPv4-translated 127.0.0.1
    "::127.0.0.1",  # IPv4-compatible (deprecated)
]


def assert_refused(status: int, body: bytes, literal: str) -> None:
    assert status == 502, body[:300]
    document = json.loads(body)
    assert document["code"] == "forbidden_upstream_address", document
    assert str(ipaddress.ip_address(literal)) in document["errors"][0], document  # names the address refused


@pytest.mark.parametrize("literal", LITERALS)
async def test_service_url_on_an_embedded_private_ipv4_is_never_fetched(in_process_proxy, connect, registry, literal):
    # a path of its own, so a request that went to the literal would show in the registry's log; the version
    # list the proxy asks for at the usual place while discovery answers goes to the allowed host itself
    registry.discovery = {"providers.v1": f"https://[{literal}]:{registry.port}/behind-the-literal/v1/providers/"}
    process = await in_process_proxy()
    client = await connect(process)
    status, _, body = await client.get(INDEX)
    assert_refused(status, body, literal)
    paths = [path for _, path in registry.requests]
    assert "/.well-known/terraform.json" in paths
    assert not [path for path in paths if path.startswith("/behind-the-literal/")], paths
    failures = process.events("request.failed")
    assert failures and failures[-1]["code"] == "forbidden_upstream_address"


@pytest.mark.parametrize("literal", ["64:ff9b::7f00:1", "2002:7f00:1::"])
async def test_archive_url_on_an_embedded_private_ipv4_is_never_fetched(in_process_proxy, connect, registry, literal):
    registry.files_base = f"https://[{literal}]:{registry.port}"
    process = await in_process_proxy()
    client = await connect(process)
    status, _, body = await client.get(ARCHIVE)
    assert_refused(status, body, literal)
    assert not [path for _, path in registry.requests if path.startswith("/files/")]
    assert not [p for p in (process.data_dir / "archives").rglob("*") if p.is_file() and "sha256" in p.parts]
