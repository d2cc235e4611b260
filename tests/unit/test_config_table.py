"""The table of options (proxy.settings.config) itself: the user contract of names, valid defaults, one rule for
bounds, and settings built in code that match the command line's defaults."""

from __future__ import annotations

import os
from dataclasses import fields, replace
from pathlib import Path

import pytest

from proxy.cli import build_parser, settings_from_args
from proxy.settings.config import OPTIONS, ConfigError, Settings, options_for
from proxy.settings.optionspec import AREA, Count, Duration, MachineValue, Size

# The REGISTRY_PROXY_* variables are a contract with every deployment (each also names a flag and a
# --config key): a change here must be deliberate, and said in the release notes.
VARIABLES = [
    "ACCESS_LOG",
    "ALLOW_HOST",
    "ALLOW_PRIVATE_HOST",
    "ARCHIVE_REDIRECT",
    "ARCHIVE_REDIRECT_EXPIRY",
    "ARCHIVE_STORE",
    "AUDIT_LOG",
    "AUDIT_REQUIRED",
    "AUTH_TOKENS",
    "CA_FILE",
    "CLIENT_HEADER_TIMEOUT",
    "DATA_DIR",
    "DEFAULT_REGISTRY",
    "DEFAULT_UPSTREAM",
    "DOWNLOAD_IDLE_TIMEOUT",
    "DOWNLOAD_RATE_WINDOW",
    "DOWNLOAD_SLOT_WAIT",
    "EVENT_LOOP",
    "EVICTION_GRACE",
    "EVICTION_INTERVAL",
    "FLEET_LOCK_TTL",
    "FORWARDED_HEADERS",
    "GIT_TIMEOUT",
    "JOBS",
    "KEEPALIVE_TIMEOUT",
    "LISTEN",
    "LOG_FORMAT",
    "LOG_LEVEL",
    "MAX_ARCHIVE_SIZE",
    "MAX_CONNECTIONS",
    "MAX_METADATA_SIZE",
    "MAX_MODULE_ENTRIES",
    "MAX_MODULE_SIZE",
    "MAX_MODULE_UNPACKED_SIZE",
    "MAX_STORE_SIZE",
    "METADATA_SECRET",
    "METADATA_SECRET_ACCEPTED",
    "METADATA_SECRET_ACCEPTED_FILE",
    "METADATA_SECRET_FILE",
    "METRICS_TOKEN_REQUIRED",
    "MIN_DOWNLOAD_RATE",
    "MIN_FREE_SPACE",
    "MODULE_PASSTHROUGH",
    "NEGATIVE_CACHE_BYTES",
    "NEGATIVE_CACHE_ENTRIES",
    "OFFLINE",
    "OIDC_ISSUERS",
    "OIDC_KEYS_REFRESH",
    "PLAIN_HTTP",
    "POLICY",
    "PROXY",
    "PUBLIC_URL",
    "REDIS_CA_FILE",
    "REDIS_PASSWORD",
    "REDIS_PREFIX",
    "REDIS_RETENTION",
    "REDIS_SENTINEL_PASSWORD",
    "REDIS_URL",
    "REQUEST_DEADLINE",
    "S3_CA_FILE",
    "S3_ENDPOINT_URL",
    "S3_PATH_STYLE",
    "S3_REGION",
    "S3_TIMEOUT",
    "SEND_TIMEOUT",
    "SHUTDOWN_GRACE",
    "STALE_DEADLINE",
    "TLS_CERT",
    "TLS_HOSTNAME",
    "TLS_KEY",
    "TOKEN",
    "TRUSTED_PROXIES",
    "TTL_DISCOVERY",
    "TTL_NEGATIVE",
    "TTL_VERSIONS",
    "UNSAFE_SHORT_TIMINGS",
    "UNSIGNED_PROVIDERS",
    "UPSTREAM_CA_FILE",
    "UPSTREAM_CONCURRENCY",
    "UPSTREAM_CREDENTIALS",
    "UPSTREAM_HOST_CONCURRENCY",
    "UPSTREAM_MAP",
    "UPSTREAM_TIMEOUT",
    "WORKERS",
]
FLAG_ONLY = {("healthcheck", "--timeout"), ("gc", "--grace")}
COMMANDS = [
    "serve",
    "lock",
    "warm",
    "export",
    "import",
    "verify",
    "gc",
    "purge",
    "rotate-secret",
    "trust",
    "backup",
    "restore",
    "healthcheck",
    "doctor",
    "token",
    "completion",
]
BOUNDED = [spec for spec in OPTIONS if isinstance(spec.kind, Duration | Size | Count)]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.startswith("REGISTRY_PROXY_"):
            monkeypatch.delenv(name)
    return monkeypatch


def test_the_variables_flags_and_keys_are_the_contract() -> None:
    assert sorted(spec.env_name.removeprefix("REGISTRY_PROXY_") for spec in OPTIONS if spec.env) == VARIABLES
    assert {(command, spec.flag) for spec in OPTIONS if not spec.env for command in spec.commands} == FLAG_ONLY
    for spec in OPTIONS:
        assert spec.flag == "--" + spec.key and spec.key.islower() and "_" not in spec.key


def test_flags_are_declared_once() -> None:
    flags = [spec.flag for spec in OPTIONS]
    assert len(flags) == len(set(flags))
    assert all(set(spec.commands) <= set(COMMANDS) for spec in OPTIONS)


@pytest.mark.parametrize("spec", OPTIONS, ids=lambda spec: spec.flag)
def test_every_declared_default_passes_its_own_checks(spec) -> None:
    value = spec.default_value()
    if value is not None and not isinstance(value, MachineValue) and not spec.kind.repeat:
        spec.kind.check(value)
    assert spec.help and not spec.help.endswith(".")  # --help appends the bounds and the default


@pytest.mark.parametrize("spec", BOUNDED, ids=lambda spec: spec.flag)
def test_zero_is_refused_by_every_bounded_option_unless_it_means_something(spec, clean_env) -> None:
    """One rule for options to come too: zero passes only where the declared minimum is 0."""
    command = spec.commands[0]
    argv = [command, *(["bundle.tar"] if command == "import" else ["--out", "b.tar"] if command == "export" else [])]
    if spec.kind.limits().startswith("0 or more"):
        build_parser().parse_args([*argv, spec.flag, "0"])
        return
    with pytest.raises(ConfigError, match=rf"^invalid {spec.flag} '0': must be at least "):
        build_parser().parse_args([*argv, spec.flag, "0"])


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_with_a_duration_takes_the_test_hatch(command: str) -> None:
    flags = {spec.flag for spec in options_for(command)}
    has_duration = any(isinstance(spec.kind, Duration) for spec in options_for(command))
    assert ("--unsafe-short-timings" in flags) == has_duration


def test_settings_in_code_have_the_command_lines_defaults(clean_env, tmp_path: Path) -> None:
    """Written once: the defaults code gets are the ones `serve` gets, but for the declared exceptions."""
    from_cli = settings_from_args(build_parser().parse_args(["serve", "--data-dir", str(tmp_path)]))
    in_code = Settings(data_dir=tmp_path)
    assert replace(from_cli, server=replace(from_cli.server, workers=1)) == in_code
    assert in_code.server.workers == 1  # code: 1 worker; the command line: one per CPU


def test_every_setting_has_a_name_of_its_own_across_the_areas(tmp_path: Path) -> None:
    """Settings(name=value) finds a setting by its name whichever its area, so no two areas share one."""
    names = [
        leaf.name
        for item in fields(Settings)
        for leaf in (fields(item.metadata[AREA]) if AREA in item.metadata else [item])
    ]
    assert len(names) == len(set(names))
    built = Settings(data_dir=tmp_path, redis_url="redis://r/0", metadata_secret="s" * 16, max_store_size=5, workers=3)
    assert (built.metadata.redis_url, built.archives.max_store_size, built.server.workers) == ("redis://r/0", 5, 3)
    with pytest.raises(TypeError, match="no setting max_store_bytes"):
        Settings(data_dir=tmp_path, max_store_bytes=5)
