"""The client's address behind trusted proxies: right-most untrusted X-Forwarded-For hop, else the peer."""

from __future__ import annotations

import pytest

from proxy.cli import build_parser, settings_from_args
from proxy.config import ConfigError, parse_networks
from proxy.forwarded import client_address

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
