"""SSRF guard: which upstream addresses the proxy may connect to.

Lazy discovery means a client can make the proxy fetch URLs chosen by an upstream
document. Every connection therefore goes through `GuardedResolver`, which drops
loopback, private, link-local (cloud metadata), shared, reserved and multicast
addresses unless the operator named the host (`--upstream-map`, `--allow-private-host`).
IP literals never reach a resolver, so `check_literal` covers them before each request.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
from typing import Any
from urllib.request import getproxies, proxy_bypass

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver
from yarl import URL


class RefusedAddressError(OSError):
    """Raised inside the connector when every address of a host is refused."""


# IPv6 ranges that are never an upstream registry, whatever Python's `is_global` says (it
# changes between versions): translation, tunnelling and deprecated forms, and recent
# special-purpose blocks.
_NON_PUBLIC_V6 = tuple(
    ipaddress.IPv6Network(net)
    for net in (
        "::/96",  # IPv4-compatible (deprecated, RFC 4291), also :: and ::1
        "::ffff:0:0:0/96",  # IPv4-translated (SIIT, RFC 2765)
        "64:ff9b:1::/48",  # local-use NAT64 (RFC 8215): translates to whatever the site chose
        "100::/64",  # discard-only (RFC 6666)
        "2001::/23",  # IETF protocol assignments, including Teredo 2001::/32 (RFC 4380)
        "2001:db8::/32",  # documentation
        "3fff::/20",  # documentation (RFC 9637)
        "5f00::/16",  # SRv6 SIDs (RFC 9602)
        "fc00::/7",  # unique local
        "fe80::/10",  # link-local
        "fec0::/10",  # site-local (deprecated, RFC 3879)
    )
)
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # well-known NAT64 prefix (RFC 6052)


def is_public_address(address: str) -> bool:
    """True for globally routable unicast addresses.

    IPv6 forms that carry an IPv4 address reach that IPv4 address, so they are judged by it:
    IPv4-mapped (`::ffff:a.b.c.d`), NAT64 (`64:ff9b::a.b.c.d`) and 6to4 (`2002:AABB:CCDD::`).
    Deprecated and translation-only forms are never public (`_NON_PUBLIC_V6`).
    """
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return _is_public(ip.ipv4_mapped)
        if any(ip in net for net in _NON_PUBLIC_V6):
            return False
        embedded = _embedded_ipv4(ip)
        if embedded is not None and not _is_public(embedded):
            return False
    return _is_public(ip)


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address a NAT64 or 6to4 address leads to."""
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip.sixtofour


def _is_public(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    return ip.is_global and not ip.is_multicast


def proxy_hosts_from_environment() -> frozenset[str]:
    """`host:port` of HTTPS_PROXY/HTTP_PROXY: the operator's egress proxy may live on a private address."""
    hosts = set()
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        value = os.environ.get(name)
        if value:
            url = URL(value if "://" in value else f"http://{value}")
            if url.host:
                hosts.add(f"{url.host.lower()}:{url.port}")
    return frozenset(hosts)


def uses_egress_proxy(url: URL) -> bool:
    """Whether aiohttp (trust_env) will send this request through HTTPS_PROXY/HTTP_PROXY."""
    return bool(getproxies().get(url.scheme)) and not proxy_bypass(url.host or "")


async def check_resolved(host: str, port: int | None, policy: AddressPolicy) -> list[str]:
    """Resolve `host` here and refuse it unless every address is public (for connections that our
    resolver never sees: through an egress proxy, or made by git). Returns the addresses ([] if exempt)."""
    if policy.is_exempt(host, port):
        return []
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port or 443, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise RefusedAddressError(f"cannot resolve {host}: {exc}") from None
    addresses = {info[4][0] for info in infos}
    if not addresses or not all(is_public_address(a) for a in addresses):
        raise RefusedAddressError(f"{host} resolves to a non-public address")
    return sorted(addresses)


class AddressPolicy:
    """Decides whether a (host, port, address) may be connected to."""

    def __init__(self, exceptions: frozenset[str]) -> None:
        self._exceptions = frozenset(e.lower() for e in exceptions) | proxy_hosts_from_environment()

    def is_exempt(self, host: str, port: int | None) -> bool:
        host = host.lower().strip("[]")
        return host in self._exceptions or f"{host}:{port}" in self._exceptions

    def check_literal(self, url: URL) -> None:
        """Refuse a URL whose host is an IP literal in a forbidden range."""
        host = (url.host or "").strip("[]")
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return
        if not self.is_exempt(host, url.port) and not is_public_address(host):
            raise RefusedAddressError(f"{host} is not a public address")


class GuardedResolver(AbstractResolver):
    """A resolver that only returns addresses the policy allows."""

    def __init__(self, policy: AddressPolicy, inner: AbstractResolver | None = None) -> None:
        self._policy = policy
        self._inner = inner or DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        if self._policy.is_exempt(host, port):
            return results
        allowed = [r for r in results if is_public_address(r["host"])]
        if not allowed:
            refused = ", ".join(sorted({r["host"] for r in results}))
            raise RefusedAddressError(f"{host} resolves only to non-public addresses ({refused})")
        return allowed

    async def close(self) -> None:
        await self._inner.close()

    def __getattr__(self, name: str) -> Any:  # pragma: no cover - passthrough for aiohttp internals
        return getattr(self._inner, name)
