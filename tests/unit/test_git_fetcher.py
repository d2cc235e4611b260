"""GitFetcher's host checks, without running git: scheme rules and address pinning."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.errors import ForbiddenAddressError, GitSourceError
from proxy.modules import git_sources as git_module
from proxy.modules.git_sources import GitFetcher
from proxy.upstream.netguard import AddressPolicy


def fetcher(*exempt: str) -> GitFetcher:
    return GitFetcher(AddressPolicy(frozenset(exempt)), Path("/nonexistent"))


async def test_ipv6_address_is_pinned_in_brackets(monkeypatch):
    async def resolved(host, port, policy):
        return ["2606:2800:220:1::1"]

    monkeypatch.setattr(git_module, "check_resolved", resolved)
    assert await fetcher()._check_host("https://git.example.com/r.git") == [
        "-c",
        "http.curloptResolve=git.example.com:443:[2606:2800:220:1::1]",
    ]


async def test_ipv4_pin_and_exempt_hosts(monkeypatch):
    async def resolved(host, port, policy):
        return [] if policy.is_exempt(host, port) else ["93.184.216.34"]

    monkeypatch.setattr(git_module, "check_resolved", resolved)
    assert await fetcher()._check_host("https://git.example.com:8443/r.git") == [
        "-c",
        "http.curloptResolve=git.example.com:8443:93.184.216.34",
    ]
    assert await fetcher("127.0.0.1:9000")._check_host("https://127.0.0.1:9000/r.git") == []


@pytest.mark.parametrize("url", ["http://git.example.com/r.git", "ssh://git.example.com/r.git", "file:///srv/r.git"])
async def test_only_https_is_cloned(url):
    with pytest.raises(ForbiddenAddressError, match="https only"):
        await fetcher()._check_host(url)


async def test_plain_http_is_allowed_for_an_operator_named_host():
    assert await fetcher("127.0.0.1:9000")._check_host("http://127.0.0.1:9000/r.git") == []


async def test_loopback_name_is_refused():
    with pytest.raises(ForbiddenAddressError, match="non-public"):
        await fetcher()._check_host("https://localhost/r.git")


async def test_invalid_port_is_a_git_source_error():
    with pytest.raises(GitSourceError):
        await fetcher()._check_host("https://git.example.com:99999999/r.git")
