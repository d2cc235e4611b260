"""`--public-url` (`REGISTRY_PROXY_PUBLIC_URL`): the URL the page at `/` puts into the CLI configuration."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.cli import build_parser, settings_from_args
from proxy.settings.config import ConfigError


def settings(tmp_path: Path, *flags: str):
    return settings_from_args(build_parser().parse_args(["serve", "--data-dir", str(tmp_path), *flags]))


def test_public_url_from_the_flag_or_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("REGISTRY_PROXY_PUBLIC_URL", raising=False)
    assert settings(tmp_path).server.public_url is None
    assert (
        settings(tmp_path, "--public-url", "https://proxy.example.com/").server.public_url
        == "https://proxy.example.com/"
    )
    monkeypatch.setenv("REGISTRY_PROXY_PUBLIC_URL", "https://mirror.example.org:8443/tf/")
    assert settings(tmp_path).server.public_url == "https://mirror.example.org:8443/tf/"


@pytest.mark.parametrize(
    "url",
    [
        "proxy.example.com",
        "ftp://proxy.example.com/",
        "https://user:pw@proxy.example.com/",
        "https://proxy.example.com/?x=1",
        "https://proxy.example.com/#top",
        "https://",
        "http://[::1",
    ],
)
def test_a_public_url_that_is_not_a_plain_http_url_is_refused(tmp_path, monkeypatch, url):
    monkeypatch.delenv("REGISTRY_PROXY_PUBLIC_URL", raising=False)
    with pytest.raises(ConfigError, match="invalid --public-url"):
        settings(tmp_path, "--public-url", url)


@pytest.mark.parametrize(
    ("url", "path"),
    [
        (None, "/"),
        ("https://proxy.example.com", "/"),
        ("https://proxy.example.com/", "/"),
        ("https://lb.example.com/tf", "/tf/"),
        ("https://lb.example.com/a/b/", "/a/b/"),
        ("https://lb.example.com/t%20f/", "/t%20f/"),  # as written in URLs
    ],
)
def test_the_public_path_clients_reach_the_proxy_under(tmp_path, monkeypatch, url, path):
    monkeypatch.delenv("REGISTRY_PROXY_PUBLIC_URL", raising=False)
    assert settings(tmp_path, *(["--public-url", url] if url else [])).server.public_path == path
