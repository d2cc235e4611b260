"""The client's view of a request behind trusted reverse proxies: its address, scheme and host. Pure.

Only when the peer (the connection's address) is a trusted proxy (`--trusted-proxies`) are the
forwarding headers read; from any other peer they are ignored entirely, so a client cannot choose
the address it is logged and rate-limited as, nor the URLs the proxy writes for it. Which headers
are read is the operator's choice (`--forwarded-headers`), because a proxy passes on unchanged the
headers it does not set itself, and those are the client's:

- `X-Forwarded-For` gives the client (the right-most address that is not a trusted proxy, as nginx's
  `real_ip_recursive`), `X-Forwarded-Proto` and `X-Forwarded-Host` the scheme and host: the right-most
  value of each, the one the trusted peer wrote or passed on (a list of them records no hops).
- RFC 7239 `Forwarded` (`for=…;proto=…;host=…`, one element per hop) is walked from the right: each
  element was written by the trusted proxy to its right; while an element's `for` is a trusted proxy
  the walk goes on to the element that proxy received, and the first one whose `for` is not (a client,
  or an obfuscated or unparsable node) describes the request as the client made it: its `for` is the
  client, its `proto` and `host` what the client used. A header that does not parse is ignored.

A scheme other than http or https, or a host that is not a plain `host[:port]`, is ignored.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

SCHEMES = frozenset({"http", "https"})
# A host as a client writes it in `Host`: a name or an IPv4 address, or a bracketed IPv6 one, with an optional port.
_HOST = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?)(?::[0-9]{1,5})?")
_TOKEN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_PAIR = re.compile(rf"\s*({_TOKEN})\s*=\s*({_TOKEN}|\"(?:[^\"\\]|\\.)*\")\s*")


@dataclass(frozen=True)
class ClientView:
    """The request as the client made it: its address, and the scheme and host it used (None: the
    request's own, as this server received it)."""

    remote: str | None
    scheme: str | None = None
    host: str | None = None


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


def plain_host(text: str | None) -> str | None:
    """`text` lower-cased if it is a plain `host[:port]` (what a `Host` header may hold), else None."""
    if not text or not _HOST.fullmatch(text):
        return None
    return text.lower()


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


def client_view(
    peer: str | None, headers: Mapping[str, Iterable[str]], trusted: Iterable[Network], *, rfc7239: bool = False
) -> ClientView:
    """The client's address, scheme and host when `peer` is a trusted proxy, from its `X-Forwarded-For`,
    `-Proto` and `-Host` headers, or with `rfc7239` from its `Forwarded` headers (`headers`: every value of
    each, by name); else `peer` and the request's own scheme and host."""
    networks = tuple(trusted)
    address = parse_address(peer) if peer else None
    if address is None or not networks or not is_trusted(address, networks):
        return ClientView(peer)
    if rfc7239:
        elements = parse_forwarded(headers.get("Forwarded", ()))
        return _from_forwarded(address, elements, networks) if elements else ClientView(peer)
    return ClientView(
        client_address(peer, headers.get("X-Forwarded-For", ()), networks),
        _scheme(_rightmost(headers.get("X-Forwarded-Proto", ()))),
        plain_host(_rightmost(headers.get("X-Forwarded-Host", ()))),
    )


def _from_forwarded(peer: Address, elements: list[dict[str, str]], trusted: tuple[Network, ...]) -> ClientView:
    address: Address = peer
    edge = elements[-1]
    for element in reversed(elements):
        edge = element
        node = _node_address(element.get("for", ""))
        if node is None:  # obfuscated ("_hidden"), "unknown" or absent: no further hop can be vouched for
            break
        address = node
        if not is_trusted(node, trusted):
            break
    return ClientView(str(address), _scheme(edge.get("proto")), plain_host(edge.get("host")))


def parse_forwarded(values: Iterable[str]) -> list[dict[str, str]]:
    """The elements of RFC 7239 `Forwarded` header values (all of them, in order), each a dict of its
    parameters (names lower-cased, quoted values unquoted); [] when any element does not parse."""
    elements = []
    for value in values:
        for text in _split(value, ","):
            if not text.strip():  # an empty list element (`a, , b`) is allowed and means nothing
                continue
            element = _parse_element(text)
            if element is None:
                return []
            elements.append(element)
    return elements


def _split(text: str, separator: str) -> Iterator[str]:
    """`text` split at each `separator` outside quoted strings."""
    start, quoted, escaped = 0, False, False
    for index, char in enumerate(text):
        if escaped:
            escaped = False
        elif char == "\\" and quoted:
            escaped = True
        elif char == '"':
            quoted = not quoted
        elif char == separator and not quoted:
            yield text[start:index]
            start = index + 1
    yield text[start:]


def _parse_element(text: str) -> dict[str, str] | None:
    element: dict[str, str] = {}
    for pair in _split(text, ";"):
        match = _PAIR.fullmatch(pair)
        if match is None:
            return None
        name, value = match.group(1).lower(), match.group(2)
        if name in element:  # RFC 7239 4: each parameter at most once per element
            return None
        if value.startswith('"'):
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        element[name] = value
    return element


def _node_address(node: str) -> Address | None:
    """The IP address of a `for=` node (`192.0.2.43`, `192.0.2.43:4711`, `[2001:db8::17]:4711`), or None for
    an obfuscated identifier, `unknown` or anything else."""
    node = node.strip()
    if node.startswith("["):
        return parse_address(node[: node.find("]") + 1]) if "]" in node else None
    if node.count(":") == 1:
        node = node.partition(":")[0]
    return parse_address(node)


def _rightmost(values: Iterable[str]) -> str | None:
    items = [item.strip() for value in values for item in value.split(",")]
    return items[-1] if items else None


def _scheme(text: str | None) -> str | None:
    scheme = (text or "").strip().lower()
    return scheme if scheme in SCHEMES else None
