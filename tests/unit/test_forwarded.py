"""The client's view behind trusted proxies: its address (right-most untrusted X-Forwarded-For hop, or the
edge element of RFC 7239 Forwarded), and the scheme and host it used; from any other peer, nothing."""

from __future__ import annotations

import pytest

from proxy.cli import build_parser, settings_from_args
from proxy.protocol.forwarded import ClientView, client_address, client_view, parse_forwarded
from proxy.settings.config import ConfigError, parse_networks

TRUSTED = parse_networks(["10.0.0.0/8", "192.0.2.7", "fd00::/8"])


@pytest.mark.parametrize(
    ("peer", "xff", "expected"),
    [
        ("10.1.2.3", ["203.0.113.9"], "203.0.113.9"),  # one trusted hop
        ("10.1.2.3", ["203.0.113.9, 10.2.2.2"], "203.0.113.9"),  # two trusted hops
        ("10.1.2.3", ["1.1.1.1, 203.0.113.9"], "203.0.113.9"),  # spoofed left part ignored
        ("10.1.2.3", ["1.1.1.1", "203.0.113.9, 192.0.2.7"], "203.0.113.9"),  # several headers, in order
        ("198.51.100.4", ["1.1.1.1"], "198.51.100.4"),  # untrusted peer: header ignored
        ("10.1.2.3", [], "10.1.2.3"),  # no header: the proxy itself
        ("10.1.2.3", ["10.9.9.9, 10.8.8.8"], "10.9.9.9"),  # all trusted: the left-most
        ("10.1.2.3", ["1.1.1.1, garbage, 10.4.4.4"], "10.4.4.4"),  # malformed: stop at the trusted hop
        ("10.1.2.3", ["[2001:db8::1]"], "2001:db8::1"),
        ("fd00::5", ["2001:db8::1"], "2001:db8::1"),
        ("::ffff:10.1.2.3", ["203.0.113.9"], "203.0.113.9"),  # IPv4-mapped peer
        ("10.1.2.3", ["::ffff:203.0.113.9"], "203.0.113.9"),
        (None, ["203.0.113.9"], None),
    ],
)
def test_client_address(peer, xff, expected) -> None:
    assert client_address(peer, xff, TRUSTED) == expected


def test_without_trusted_proxies_the_header_is_ignored() -> None:
    assert client_address("10.1.2.3", ["203.0.113.9"], ()) == "10.1.2.3"


def test_flag_and_env(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("REGISTRY_PROXY_TRUSTED_PROXIES", raising=False)
    parse = build_parser().parse_args
    assert settings_from_args(parse(["serve", "--data-dir", str(tmp_path)])).server.trusted_proxies == frozenset()
    monkeypatch.setenv("REGISTRY_PROXY_TRUSTED_PROXIES", "10.0.0.0/8, 192.0.2.7")
    assert {
        str(n) for n in settings_from_args(parse(["serve", "--data-dir", str(tmp_path)])).server.trusted_proxies
    } == {
        "10.0.0.0/8",
        "192.0.2.7/32",
    }
    with pytest.raises(ConfigError, match=r"--trusted-proxies 'proxy\.example'"):
        settings_from_args(parse(["serve", "--data-dir", str(tmp_path), "--trusted-proxies", "proxy.example"]))


def headers(**given: str | list[str]) -> dict[str, list[str]]:
    names = {"xff": "X-Forwarded-For", "proto": "X-Forwarded-Proto", "host": "X-Forwarded-Host", "fwd": "Forwarded"}
    return {names[key]: value if isinstance(value, list) else [value] for key, value in given.items()}


@pytest.mark.parametrize(
    ("peer", "given", "expected"),
    [
        # nginx in front (deploy/nginx.conf): it sets all three
        (
            "10.1.2.3",
            headers(xff="203.0.113.9", proto="https", host="mirror.example.com"),
            ClientView("203.0.113.9", "https", "mirror.example.com"),
        ),
        (
            "10.1.2.3",
            headers(proto="HTTPS", host="Mirror.Example.com:8443"),
            ClientView("10.1.2.3", "https", "mirror.example.com:8443"),
        ),
        # the right-most value is the one the trusted peer wrote (appended to what the client sent)
        (
            "10.1.2.3",
            headers(proto="http, https", host=["evil.example", "mirror.example.com"]),
            ClientView("10.1.2.3", "https", "mirror.example.com"),
        ),
        # nonsense is ignored: the request's own scheme and host stay
        ("10.1.2.3", headers(proto="gopher", host='evil"}\nprovider_installation {'), ClientView("10.1.2.3")),
        ("10.1.2.3", headers(host="x.com/path"), ClientView("10.1.2.3")),
        ("10.1.2.3", headers(), ClientView("10.1.2.3")),
        # an untrusted peer: every header ignored, whatever it claims
        ("198.51.100.4", headers(xff="1.1.1.1", proto="https", host="evil.example"), ClientView("198.51.100.4")),
        # X-Forwarded-* mode: a Forwarded header (passed through from the client) is ignored
        (
            "10.1.2.3",
            headers(fwd="for=6.6.6.6;proto=http;host=evil.example", xff="203.0.113.9"),
            ClientView("203.0.113.9"),
        ),
        (None, headers(proto="https"), ClientView(None)),
    ],
)
def test_client_view_from_x_forwarded_headers(peer, given, expected) -> None:
    assert client_view(peer, given, TRUSTED) == expected


@pytest.mark.parametrize(
    ("peer", "forwarded", "expected"),
    [
        (
            "10.1.2.3",
            "for=203.0.113.9;proto=https;host=mirror.example.com",
            ClientView("203.0.113.9", "https", "mirror.example.com"),
        ),
        # two trusted hops: the element the edge proxy wrote describes the client's request
        (
            "10.1.2.3",
            'for=203.0.113.9;proto=https;host="mirror.example.com:8443", for=10.2.2.2;proto=http;host=internal-lb',
            ClientView("203.0.113.9", "https", "mirror.example.com:8443"),
        ),
        # what a client wrote left of the edge element is ignored
        (
            "10.1.2.3",
            "for=10.9.9.9;proto=http;host=evil.example, for=203.0.113.9;proto=https;host=m.example",
            ClientView("203.0.113.9", "https", "m.example"),
        ),
        # several header fields are one list; quoted nodes with ports; IPv6
        (
            "10.1.2.3",
            ['for="[2001:db8::17]:4711";proto=https;host=m.example'],
            ClientView("2001:db8::17", "https", "m.example"),
        ),
        (
            "10.1.2.3",
            ["for=203.0.113.9;proto=https", 'for="10.2.2.2:8080";proto=http'],
            ClientView("203.0.113.9", "https"),
        ),
        # an obfuscated or unknown node ends the walk: the element it is in is the edge
        ("10.1.2.3", "for=_hidden;proto=https;host=m.example", ClientView("10.1.2.3", "https", "m.example")),
        ("10.1.2.3", "for=unknown;proto=https, for=10.2.2.2;proto=http", ClientView("10.2.2.2", "https")),
        # case-insensitive parameter names; empty list elements allowed
        ("10.1.2.3", "For=203.0.113.9;PROTO=https, ,", ClientView("203.0.113.9", "https")),
        # a header that does not parse is ignored as a whole
        ("10.1.2.3", "for=203.0.113.9;proto=https;proto=http", ClientView("10.1.2.3")),
        ("10.1.2.3", "for=203.0.113.9;proto", ClientView("10.1.2.3")),
        ("10.1.2.3", 'for="203.0.113.9;proto=https', ClientView("10.1.2.3")),
        # an untrusted peer: ignored
        ("198.51.100.4", "for=1.1.1.1;proto=https;host=evil.example", ClientView("198.51.100.4")),
    ],
)
def test_client_view_from_rfc7239_forwarded(peer, forwarded, expected) -> None:
    given = headers(fwd=forwarded, xff="6.6.6.6", proto="http", host="evil.example")  # X-Forwarded-* ignored
    assert client_view(peer, given, TRUSTED, rfc7239=True) == expected


def test_forwarded_values_are_unquoted_and_unescaped() -> None:
    assert parse_forwarded(['for="[::1]:80";host="a\\"b.example", by=_x']) == [
        {"for": "[::1]:80", "host": 'a"b.example'},
        {"by": "_x"},
    ]
