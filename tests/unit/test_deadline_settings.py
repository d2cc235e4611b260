"""Flags of the upstream deadlines: defaults, environment, validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.cli import build_parser, settings_from_args
from proxy.settings.config import ConfigError, Settings

_FLAGS = (
    "STALE_DEADLINE",
    "REQUEST_DEADLINE",
    "DOWNLOAD_IDLE_TIMEOUT",
    "MIN_DOWNLOAD_RATE",
    "DOWNLOAD_RATE_WINDOW",
    "DOWNLOAD_SLOT_WAIT",
    "UPSTREAM_HOST_CONCURRENCY",
    "SHUTDOWN_GRACE",
    "UPSTREAM_CONCURRENCY",
    "UPSTREAM_TIMEOUT",
)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in _FLAGS:
        monkeypatch.delenv("REGISTRY_PROXY_" + name, raising=False)
    return monkeypatch


def _settings(tmp_path: Path, *flags: str) -> Settings:
    return settings_from_args(build_parser().parse_args(["serve", "--data-dir", str(tmp_path), *flags]))


def test_defaults_fit_the_clients_and_kubernetes(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    assert (settings.limits.stale_deadline, settings.limits.request_deadline) == (2, 8)  # terraform gives up after 10 s
    assert settings.server.shutdown_grace == 15  # below Kubernetes' default 30 s terminationGracePeriodSeconds
    limits = settings.limits
    assert (limits.read_timeout, limits.min_download_rate, limits.download_rate_window) == (30, 32 * 1024, 30)
    assert (limits.download_slot_wait, limits.upstream_host_concurrency, limits.upstream_concurrency) == (30, 8, 16)


def test_flags_and_environment(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.setenv("REGISTRY_PROXY_MIN_DOWNLOAD_RATE", "1MiB")
    clean_env.setenv("REGISTRY_PROXY_SHUTDOWN_GRACE", "5s")
    settings = _settings(
        tmp_path,
        "--stale-deadline",
        "500ms",
        "--request-deadline",
        "9s",
        "--download-rate-window",
        "10s",
        "--download-slot-wait",
        "3s",
        "--upstream-host-concurrency",
        "2",
        "--download-idle-timeout",
        "1m",
    )
    assert (settings.limits.stale_deadline, settings.limits.request_deadline, settings.server.shutdown_grace) == (
        0.5,
        9,
        5,
    )
    limits = settings.limits
    assert (limits.min_download_rate, limits.download_rate_window, limits.download_slot_wait) == (2**20, 10, 3)
    assert (limits.upstream_host_concurrency, limits.read_timeout) == (2, 60)


def test_rate_zero_turns_the_minimum_off(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert _settings(tmp_path, "--min-download-rate", "0").limits.min_download_rate == 0


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--request-deadline", "0s"], "--request-deadline"),
        (["--stale-deadline", "9s"], "--stale-deadline"),
        (["--stale-deadline", "soon"], "not a duration"),
        (["--shutdown-grace", "never"], "not a duration"),
        (["--download-rate-window", "0s"], "--download-rate-window"),
        (["--download-slot-wait", "0s"], "--download-slot-wait"),
        (["--download-idle-timeout", "0s"], "--download-idle-timeout"),
        (["--min-download-rate", "fast"], "not a size"),
        (["--upstream-host-concurrency", "0"], "--upstream-host-concurrency"),
        (["--upstream-host-concurrency", "lots"], "--upstream-host-concurrency"),
    ],
)
def test_invalid_values_stop_start_up(
    clean_env: pytest.MonkeyPatch, tmp_path: Path, flags: list[str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        _settings(tmp_path, *flags)
