"""The server-limit flags: defaults, environment variables, validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.cli import build_parser, settings_from_args
from proxy.settings.config import ConfigError, Settings

_ENV = ("MAX_CONNECTIONS", "CLIENT_HEADER_TIMEOUT", "KEEPALIVE_TIMEOUT", "SEND_TIMEOUT")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in _ENV:
        monkeypatch.delenv("REGISTRY_PROXY_" + name, raising=False)
    return monkeypatch


def _settings(tmp_path: Path, *flags: str) -> Settings:
    return settings_from_args(build_parser().parse_args(["serve", "--data-dir", str(tmp_path), *flags]))


def test_defaults_are_nginx_like(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    assert settings.server.max_connections == 1024
    assert settings.server.client_header_timeout == 10.0
    assert settings.server.keepalive_timeout == 15.0
    assert settings.server.send_timeout == 60.0


def test_flags_and_environment(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.setenv("REGISTRY_PROXY_MAX_CONNECTIONS", "64")
    clean_env.setenv("REGISTRY_PROXY_SEND_TIMEOUT", "2m")
    settings = _settings(tmp_path, "--client-header-timeout", "1500ms", "--keepalive-timeout", "5s")
    assert (settings.server.max_connections, settings.server.send_timeout) == (64, 120.0)
    assert (settings.server.client_header_timeout, settings.server.keepalive_timeout) == (1.5, 5.0)
    assert _settings(tmp_path, "--max-connections", "8").server.max_connections == 8  # the flag wins


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--max-connections", "0"), "invalid --max-connections '0': must be at least 1"),
        (("--max-connections", "-5"), "invalid --max-connections '-5': not a whole number"),
        (("--max-connections", "lots"), "invalid --max-connections 'lots': not a whole number"),
        (("--send-timeout", "0s"), "invalid --send-timeout '0s': must be at least 1s"),
        (("--keepalive-timeout", "0"), "invalid --keepalive-timeout '0': must be at least 1s"),
        (("--client-header-timeout", "soon"), "not a duration"),
    ],
)
def test_invalid_values_stop_start_up(
    clean_env: pytest.MonkeyPatch, tmp_path: Path, flags: tuple, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        _settings(tmp_path, *flags)
