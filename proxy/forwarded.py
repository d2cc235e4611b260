"""The client's address behind trusted reverse proxies (`X-Forwarded-For`), as nginx's `real_ip_recursive`.

Only when the peer (the connection's address) is a trusted proxy is `X-Forwarded-For` read: from
the right, trusted addresses are skipped and the first untrusted one is the client. Anything a
client wrote further left is ignored, and from an untrusted peer the header is ignored entirely,
so a client cannot choose the address it is logged and rate-limited as.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def parse_address(text: str) -> Address | None:
    """An IP address (an IPv6 one may be bracketed; an IPv4-mapped IPv6 one is unmapped), or None."""
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def is_trusted(address: Address, trusted: Iterable[Network]) -> bool:
    return any(address.version == network.version and address in network for network in trusted)


def client_address(peer: str | None, forwarded_for: Iterable[str], trusted: Iterable[Network]) -> str | None:
    """The client's address: `peer`, or, when `peer` is a trusted proxy, the right-most untrusted
    address of the `X-Forwarded-For` values (all of them, in order). A malformed entry ends the walk
    at the trusted hop to its right."""
    networks = tuple(trusted)
    address = parse_address(peer) if peer else None
    if address is None or not networks or not is_trusted(address, networks):
        return peer
    hops = [hop for value in forwarded_for for hop in value.split(",")]
    for hop in reversed(hops):
        parsed = parse_address(hop)
        if parsed is None:
            break
        address = parsed
        if not is_trusted(parsed, networks):
            break
    return str(address)
