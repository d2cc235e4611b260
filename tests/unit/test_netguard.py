"""Unit tests for proxy.upstream.netguard: the SSRF guard."""

from __future__ import annotations

import socket

import aiohttp
import pytest
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from proxy.upstream.netguard import (
    AddressPolicy,
    GuardedResolver,
    RefusedAddressError,
    is_public_address,
    proxy_hosts_from_environment,
)

PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy")


@pytest.fixture(autouse=True)
def _no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARS:
        monkeypatch.delenv(name, raising=False)


# ---------------------------------------------------------------------------------------------
# is_public_address
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("8.8.8.8", True),
        ("1.1.1.1", True),
        ("140.82.112.3", True),
        ("2001:4860:4860::8888", True),
        ("2606:4700:4700::1111", True),
        ("::ffff:8.8.8.8", True),
        # loopback
        ("127.0.0.1", False),
        ("127.1.2.3", False),
        ("::1", False),
        # RFC 1918 private
        ("10.1.2.3", False),
        ("10.0.0.0", False),
        ("172.16.0.1", False),
        ("172.31.255.254", False),
        ("192.168.1.1", False),
        # link-local, including the cloud metadata endpoint
        ("169.254.169.254", False),
        ("169.254.0.1", False),
        ("fe80::1", False),
        ("fe80::1%eth0", False),
        # shared address space (RFC 6598), e.g. Alibaba metadata 100.100.100.200
        ("100.100.100.200", False),
        ("100.64.0.1", False),
        # unspecified
        ("0.0.0.0", False),
        ("::", False),
        ("0.1.2.3", False),
        # unique local IPv6 (AWS IMDS over IPv6 is fd00:ec2::254)
        ("fd00:ec2::254", False),
        ("fc00::1", False),
        # IPv4-mapped IPv6 judged as IPv4
        ("::ffff:127.0.0.1", False),
        ("::ffff:10.0.0.1", False),
        ("::ffff:169.254.169.254", False),
        # multicast, broadcast, reserved, documentation, benchmarking
        ("224.0.0.1", False),
        ("239.255.255.250", False),
        ("ff02::1", False),
        ("ff0e::1", False),
        ("255.255.255.255", False),
        ("240.0.0.1", False),
        ("192.0.2.1", False),
        ("198.18.0.1", False),
        ("2001:db8::1", False),
        # not an address at all
        ("garbage", False),
        ("", False),
        ("localhost", False),
        ("256.1.1.1", False),
        ("1.2.3", False),
        ("[::1]", False),
    ],
)
def test_is_public_address(address: str, public: bool) -> None:
    assert is_public_address(address) is public


@pytest.mark.parametrize(
    ("address", "public"),
    [
        # NAT64 well-known prefix 64:ff9b::/96 (RFC 6052): the embedded IPv4 is what is reached
        ("64:ff9b::a00:1", False),  # 10.0.0.1
        ("64:ff9b::7f00:1", False),  # 127.0.0.1
        ("64:ff9b::a9fe:a9fe", False),  # 169.254.169.254
        ("64:ff9b::10.1.2.3", False),
        ("64:ff9b::808:808", True),  # 8.8.8.8
        # local-use NAT64 64:ff9b:1::/48 (RFC 8215): translates to whatever the site chooses
        ("64:ff9b:1::a00:1", False),
        ("64:ff9b:1::808:808", False),
        # 6to4 2002::/16 (RFC 3056): the IPv4 in bits 16-48
        ("2002:a00:1::", False),  # 10.0.0.1
        ("2002:7f00:1::", False),  # 127.0.0.1
        ("2002:a9fe:a9fe::1", False),  # 169.254.169.254
        ("2002:c0a8:101::1", False),  # 192.168.1.1
        ("2002:808:808::1", True),  # 8.8.8.8
        # IPv4-mapped ::ffff:0:0/96 and IPv4-translated ::ffff:0:0:0/96 (RFC 2765)
        ("::ffff:10.0.0.1", False),
        ("::ffff:127.0.0.1", False),
        ("::ffff:0:a00:1", False),
        ("::ffff:0:808:808", False),
        # IPv4-compatible ::/96 (deprecated, RFC 4291): never a destination today
        ("::10.0.0.1", False),
        ("::127.0.0.1", False),
        ("::8.8.8.8", False),
        # Teredo 2001::/32 (RFC 4380): server and (obfuscated) client IPv4 inside
        ("2001:0:a00:1::f5ff:fffe", False),  # server 10.0.0.1
        ("2001:0:808:808:0:0:f5ff:fffe", False),  # client 10.0.0.1 (XOR-ed)
        ("2001:0:808:808:8000:f227:f7f7:f7f7", False),  # both public: still a tunnel, not a registry
        # other special-purpose IPv6
        ("3fff::1", False),  # documentation (RFC 9637)
        ("5f00::1", False),  # SRv6 SIDs (RFC 9602)
        ("100::1", False),  # discard-only
        ("fec0::1", False),  # site-local (deprecated)
        ("2001:4860:4860::8844", True),
    ],
)
def test_is_public_address_judges_embedded_ipv4(address: str, public: bool) -> None:
    assert is_public_address(address) is public


@pytest.mark.parametrize(
    "url",
    [
        "https://[64:ff9b::7f00:1]:8443/",
        "https://[2002:a00:1::]/",
        "https://[::ffff:0:a00:1]/",
        "https://[::127.0.0.1]/",
        "https://[64:ff9b:1::a9fe:a9fe]/",
    ],
)
def test_check_literal_refuses_embedded_private_ipv4(url: str) -> None:
    with pytest.raises(RefusedAddressError):
        AddressPolicy(frozenset()).check_literal(URL(url))


async def test_resolver_refuses_names_resolving_to_embedded_private_ipv4() -> None:
    table = {"nat64.example": ["64:ff9b::a00:1", "2002:7f00:1::1"]}
    with pytest.raises(RefusedAddressError):
        await GuardedResolver(AddressPolicy(frozenset()), FakeResolver(table)).resolve("nat64.example", 443)


# ---------------------------------------------------------------------------------------------
# proxy_hosts_from_environment
# ---------------------------------------------------------------------------------------------


def test_proxy_hosts_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert proxy_hosts_from_environment() == frozenset()
    monkeypatch.setenv("HTTPS_PROXY", "http://Egress.Internal:3128")
    monkeypatch.setenv("http_proxy", "10.0.0.7:8080")
    assert proxy_hosts_from_environment() == {"egress.internal:3128", "10.0.0.7:8080"}


def test_policy_exempts_egress_proxy_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://10.0.0.7:3128")
    policy = AddressPolicy(frozenset())
    assert policy.is_exempt("10.0.0.7", 3128)
    policy.check_literal(URL("http://10.0.0.7:3128/"))
    assert not policy.is_exempt("10.0.0.8", 3128)
    assert not policy.is_exempt("10.0.0.7", 8080)  # only the proxy's own port


# ---------------------------------------------------------------------------------------------
# AddressPolicy.check_literal
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/",
        "https://127.0.0.1:8443/x",
        "https://10.0.0.1/",
        "https://169.254.169.254/latest/meta-data/",
        "http://[::1]:8080/",
        "https://[fd00:ec2::254]/",
        "https://[::ffff:127.0.0.1]/",
        "https://0.0.0.0/",
        "https://100.100.100.200/",
    ],
)
def test_check_literal_refuses_private_literals(url: str) -> None:
    with pytest.raises(RefusedAddressError):
        AddressPolicy(frozenset()).check_literal(URL(url))


@pytest.mark.parametrize(
    "url",
    [
        "https://8.8.8.8/",
        "https://[2001:4860:4860::8888]/",
        "https://registry.opentofu.org/v1/providers/",
        "https://localhost/",  # a name: judged by the resolver, not here
        "https://internal.example:8443/",
    ],
)
def test_check_literal_passes_public_literals_and_names(url: str) -> None:
    AddressPolicy(frozenset()).check_literal(URL(url))


def test_check_literal_exemption_is_per_port() -> None:
    policy = AddressPolicy(frozenset({"127.0.0.1:8443"}))
    policy.check_literal(URL("https://127.0.0.1:8443/"))
    policy.check_literal(URL("http://127.0.0.1:8443/discovery"))
    with pytest.raises(RefusedAddressError):
        policy.check_literal(URL("https://127.0.0.1/"))  # port 443
    with pytest.raises(RefusedAddressError):
        policy.check_literal(URL("https://127.0.0.1:8444/"))
    with pytest.raises(RefusedAddressError):
        policy.check_literal(URL("https://10.0.0.1:8443/"))


def test_check_literal_host_exemption_covers_all_ports() -> None:
    policy = AddressPolicy(frozenset({"10.0.0.5"}))
    for url in ("https://10.0.0.5/", "http://10.0.0.5:8080/", "https://10.0.0.5:1/"):
        policy.check_literal(URL(url))
    with pytest.raises(RefusedAddressError):
        policy.check_literal(URL("https://10.0.0.6/"))


def test_check_literal_ipv6_exemption() -> None:
    policy = AddressPolicy(frozenset({"::1:8443"}))
    policy.check_literal(URL("https://[::1]:8443/"))
    with pytest.raises(RefusedAddressError):
        policy.check_literal(URL("https://[::1]:9443/"))


def test_is_exempt_case_insensitive() -> None:
    policy = AddressPolicy(frozenset({"Mirror.Internal:8443"}))
    assert policy.is_exempt("mirror.internal", 8443)
    assert policy.is_exempt("MIRROR.INTERNAL", 8443)
    assert not policy.is_exempt("mirror.internal", 443)
    assert not policy.is_exempt("other.internal", 8443)


# ---------------------------------------------------------------------------------------------
# GuardedResolver
# ---------------------------------------------------------------------------------------------


def _result(hostname: str, host: str, port: int) -> ResolveResult:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return ResolveResult(hostname=hostname, host=host, port=port, family=family, proto=0, flags=socket.AI_NUMERICHOST)


class FakeResolver(AbstractResolver):
    def __init__(self, table: dict[str, list[str]]) -> None:
        self.table = table
        self.calls: list[tuple[str, int, int]] = []
        self.closed = False

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        self.calls.append((host, port, family))
        if host not in self.table:
            raise OSError(f"unknown host {host}")
        return [_result(host, address, port) for address in self.table[host]]

    async def close(self) -> None:
        self.closed = True


TABLE = {
    "public.example": ["8.8.8.8", "2001:4860:4860::8888"],
    "mixed.example": ["10.0.0.1", "8.8.4.4", "127.0.0.1", "::1", "2606:4700:4700::1111", "169.254.169.254"],
    "private.example": ["10.0.0.1", "192.168.1.1", "::1", "::ffff:127.0.0.1"],
    "metadata.example": ["169.254.169.254"],
    "internal.example": ["10.0.0.5", "127.0.0.1"],
    "empty.example": [],
}


async def test_resolver_passes_public_addresses() -> None:
    inner = FakeResolver(TABLE)
    resolver = GuardedResolver(AddressPolicy(frozenset()), inner)
    results = await resolver.resolve("public.example", 443, socket.AF_UNSPEC)
    assert [r["host"] for r in results] == ["8.8.8.8", "2001:4860:4860::8888"]
    assert all(r["port"] == 443 and r["hostname"] == "public.example" for r in results)
    assert inner.calls == [("public.example", 443, socket.AF_UNSPEC)]


async def test_resolver_filters_private_addresses() -> None:
    resolver = GuardedResolver(AddressPolicy(frozenset()), FakeResolver(TABLE))
    results = await resolver.resolve("mixed.example", 443)
    assert [r["host"] for r in results] == ["8.8.4.4", "2606:4700:4700::1111"]


@pytest.mark.parametrize("host", ["private.example", "metadata.example", "internal.example", "empty.example"])
async def test_resolver_refuses_when_nothing_is_left(host: str) -> None:
    resolver = GuardedResolver(AddressPolicy(frozenset()), FakeResolver(TABLE))
    with pytest.raises(RefusedAddressError, match=host):
        await resolver.resolve(host, 443)


async def test_resolver_error_lists_refused_addresses() -> None:
    resolver = GuardedResolver(AddressPolicy(frozenset()), FakeResolver(TABLE))
    with pytest.raises(RefusedAddressError) as info:
        await resolver.resolve("metadata.example", 80)
    assert "169.254.169.254" in str(info.value)


async def test_resolver_exempt_host_gets_everything() -> None:
    resolver = GuardedResolver(AddressPolicy(frozenset({"internal.example"})), FakeResolver(TABLE))
    results = await resolver.resolve("internal.example", 443)
    assert [r["host"] for r in results] == ["10.0.0.5", "127.0.0.1"]


async def test_refusal_reaches_aiohttp_callers_as_the_connector_error_cause() -> None:
    """The upstream client tells a refused address from other connect failures by `os_error`."""
    connector = aiohttp.TCPConnector(resolver=GuardedResolver(AddressPolicy(frozenset()), FakeResolver(TABLE)))
    async with aiohttp.ClientSession(connector=connector) as session:
        with pytest.raises(aiohttp.ClientConnectorError) as info:
            await session.get("https://metadata.example/latest/meta-data/")
    assert isinstance(info.value.os_error, RefusedAddressError)
    assert "169.254.169.254" in str(info.value.os_error)


async def test_resolver_exempt_host_port_only_on_that_port() -> None:
    resolver = GuardedResolver(AddressPolicy(frozenset({"internal.example:8443"})), FakeResolver(TABLE))
    results = await resolver.resolve("internal.example", 8443)
    assert [r["host"] for r in results] == ["10.0.0.5", "127.0.0.1"]
    with pytest.raises(RefusedAddressError):
        await resolver.resolve("internal.example", 443)


async def test_resolver_exemption_does_not_leak_to_other_hosts() -> None:
    resolver = GuardedResolver(AddressPolicy(frozenset({"internal.example"})), FakeResolver(TABLE))
    with pytest.raises(RefusedAddressError):
        await resolver.resolve("private.example", 443)
    assert [r["host"] for r in await resolver.resolve("mixed.example", 443)] == ["8.8.4.4", "2606:4700:4700::1111"]


async def test_resolver_propagates_inner_errors() -> None:
    resolver = GuardedResolver(AddressPolicy(frozenset()), FakeResolver(TABLE))
    with pytest.raises(OSError, match="unknown host"):
        await resolver.resolve("nowhere.example", 443)


async def test_resolver_close_closes_inner() -> None:
    inner = FakeResolver(TABLE)
    resolver = GuardedResolver(AddressPolicy(frozenset()), inner)
    await resolver.close()
    assert inner.closed is True
