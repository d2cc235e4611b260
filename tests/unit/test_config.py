"""Unit tests for proxy.settings.config (parsers, Settings) and the CLI's flag/environment handling."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from yarl import URL

from proxy.cli import build_parser, settings_from_args
from proxy.settings.config import (
    DEFAULT_ALLOWED_HOSTS,
    ConfigError,
    Settings,
    env_name,
    normalise_hosts,
    normalise_private_hosts,
    parse_duration,
    parse_listen,
    parse_size,
    parse_upstream_map,
)
from proxy.settings.values import parse_certificate_name
from proxy.upstream.netguard import AddressPolicy

# ---------------------------------------------------------------------------------------------
# parse_duration
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90.0),
        ("0", 0.0),
        ("90s", 90.0),
        ("10m", 600.0),
        ("1h", 3600.0),
        ("2h", 7200.0),
        ("1d", 86400.0),
        ("500ms", 0.5),
        ("1.5h", 5400.0),
        ("0.25s", 0.25),
        (" 30s ", 30.0),
        ("30 s", 30.0),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)
    assert isinstance(parse_duration(text), float)


@pytest.mark.parametrize(
    "text",
    ["", "s", "-1s", "1w", "1y", "10 minutes", "1h30m", "abc", "1.s", ".5s", "1e3", "10S", "1,5h", "inf", "nan"],
)
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_duration(text)


# ---------------------------------------------------------------------------------------------
# parse_size
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("0", 0),
        ("1048576", 1048576),
        ("100B", 100),
        ("1KB", 1000),
        ("1KiB", 1024),
        ("10MB", 10_000_000),
        ("512MiB", 512 * 1024 * 1024),
        ("8MiB", 8 * 1024 * 1024),
        ("2GB", 2_000_000_000),
        ("2GiB", 2 * 1024**3),
        ("4GiB", 4 * 1024**3),
        ("1TB", 10**12),
        ("1TiB", 1024**4),
        ("512mib", 512 * 1024 * 1024),
        ("2gib", 2 * 1024**3),
        (" 3 KiB ", 3072),
    ],
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size
    assert isinstance(parse_size(text), int)


@pytest.mark.parametrize("text", ["", "MiB", "-1", "1.5GiB", "1PB", "1 M", "1Mi", "abc", "10 20", "1e6"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_size(text)


# ---------------------------------------------------------------------------------------------
# parse_listen
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "host", "port"),
    [
        ("127.0.0.1:8443", "127.0.0.1", 8443),
        ("0.0.0.0:443", "0.0.0.0", 443),
        ("localhost:1", "localhost", 1),
        ("example.com:65535", "example.com", 65535),
        ("[::1]:8443", "::1", 8443),
        ("[::]:8443", "::", 8443),
        ("[2001:db8::1]:9000", "2001:db8::1", 9000),
        (":8443", "0.0.0.0", 8443),
    ],
)
def test_parse_listen(text: str, host: str, port: int) -> None:
    assert parse_listen(text) == (host, port)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "8443",
        "localhost",
        "localhost:",
        "localhost:0",
        "localhost:65536",
        "localhost:http",
        "host:-1",
        "host:84 43",
    ],
)
def test_parse_listen_rejects(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_listen(text)


# ---------------------------------------------------------------------------------------------
# parse_upstream_map
# ---------------------------------------------------------------------------------------------


def test_parse_upstream_map_normalises_hosts() -> None:
    mapping = parse_upstream_map(
        [
            "Registry.Example=http://127.0.0.1:8080",
            "OTHER.example:443=https://mirror.internal/base/",
            "münchen.de:8443 = https://10.0.0.5:9443",
        ]
    )
    assert mapping == {
        "registry.example": URL("http://127.0.0.1:8080"),
        "other.example": URL("https://mirror.internal/base/"),
        "xn--mnchen-3ya.de:8443": URL("https://10.0.0.5:9443"),
    }


def test_parse_upstream_map_empty() -> None:
    assert parse_upstream_map([]) == {}


def test_parse_upstream_map_value_may_contain_equals() -> None:
    mapping = parse_upstream_map(["reg.example=https://mirror.internal/path?a=b"])
    assert mapping["reg.example"] == URL("https://mirror.internal/path?a=b")


@pytest.mark.parametrize(
    "entry",
    [
        "registry.example",
        "registry.example http://127.0.0.1:8080",
        "registry.example=",
        "registry.example=127.0.0.1:8080",
        "registry.example=ftp://127.0.0.1/",
        "registry.example=file:///etc/passwd",
        "registry.example=unix:///run/sock",
        "registry.example=http://",
        "registry.example=//host/path",
        "=http://127.0.0.1:8080",
        "bad..host=http://127.0.0.1:8080",
        "bad host=http://127.0.0.1:8080",
    ],
)
def test_parse_upstream_map_rejects(entry: str) -> None:
    with pytest.raises(ConfigError):
        parse_upstream_map([entry])


# ---------------------------------------------------------------------------------------------
# env_name, host normalisation
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "env"),
    [
        ("--listen", "REGISTRY_PROXY_LISTEN"),
        ("--upstream-map", "REGISTRY_PROXY_UPSTREAM_MAP"),
        ("--allow-private-host", "REGISTRY_PROXY_ALLOW_PRIVATE_HOST"),
        ("--tls-cert", "REGISTRY_PROXY_TLS_CERT"),
        ("plain-http", "REGISTRY_PROXY_PLAIN_HTTP"),
    ],
)
def test_env_name(flag: str, env: str) -> None:
    assert env_name(flag) == env


def test_normalise_hosts() -> None:
    assert normalise_hosts(["Registry.OpenTofu.org", "  ", "münchen.de", "example.com:443", "example.com:8443"]) == {
        "registry.opentofu.org",
        "xn--mnchen-3ya.de",
        "example.com",
        "example.com:8443",
    }
    with pytest.raises(ConfigError):
        normalise_hosts(["bad..host"])


def test_normalise_private_hosts() -> None:
    assert normalise_private_hosts(["Foo.Internal", " 10.0.0.1:8080 ", "", "[::1]"]) == {
        "foo.internal",
        "10.0.0.1:8080",
        "::1",
    }


@pytest.mark.parametrize(
    ("entry", "host", "port"),
    [
        ("Foo.Internal", "foo.internal", 443),
        ("foo.internal:8443", "foo.internal", 8443),
        ("10.0.0.1", "10.0.0.1", 80),
        ("[::1]", "::1", 8443),
        ("[::1]:8443", "::1", 8443),  # the bracketed IPv6 form with a port, as in --listen
    ],
)
def test_normalised_private_hosts_exempt_in_address_policy(
    entry: str, host: str, port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    policy = AddressPolicy(normalise_private_hosts([entry]))
    assert policy.is_exempt(host, port)
    assert not AddressPolicy(frozenset()).is_exempt(host, port)


# ---------------------------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------------------------


def test_settings_defaults(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    assert settings.upstreams.allowed_hosts == frozenset(DEFAULT_ALLOWED_HOSTS)
    assert settings.upstreams.all_allowed_hosts == frozenset(DEFAULT_ALLOWED_HOSTS)
    assert settings.upstreams.private_host_exceptions == frozenset()
    assert settings.cache_dir == tmp_path / "metadata"
    assert settings.archive_dir == tmp_path / "archives"
    assert settings.gnupg_home == tmp_path / "gnupg"
    assert settings.tls_dir == tmp_path / "tls"


def test_settings_tls_cert_and_key_together(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, tls_cert=tmp_path / "c.pem", tls_key=tmp_path / "k.pem")
    assert settings.tls.tls_cert == tmp_path / "c.pem"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"tls_cert": Path("cert.pem")},
        {"tls_key": Path("key.pem")},
        {"plain_http": True, "tls_cert": Path("cert.pem"), "tls_key": Path("key.pem")},
        {"stale_deadline": 9.0, "request_deadline": 8.0},
    ],
)
def test_settings_that_do_not_fit_together_are_refused(tmp_path: Path, kwargs: dict) -> None:
    with pytest.raises(ConfigError):
        Settings(data_dir=tmp_path, **kwargs)


@pytest.mark.parametrize(("given", "log_format"), [("auto", "auto"), ("json", "json"), ("Console", "console")])
def test_cli_log_formats(tmp_path: Path, given: str, log_format: str) -> None:
    args = build_parser().parse_args(["serve", "--log-format", given])
    assert settings_from_args(args).logging.log_format == log_format


@pytest.mark.parametrize("log_format", ["xml", "", "plain"])
def test_cli_refuses_other_log_formats(tmp_path: Path, log_format: str) -> None:
    with pytest.raises(ConfigError, match=f"invalid --log-format {log_format!r}: use one of auto, json, console"):
        build_parser().parse_args(["serve", "--log-format", log_format])


def test_settings_mapped_hosts(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path,
        allowed_hosts=frozenset({"registry.opentofu.org"}),
        upstream_map=parse_upstream_map(
            [
                "reg.example=http://127.0.0.1:8080/base",
                "other.example:8443=https://Mirror.Internal",
                "v6.example=http://[::1]:9000",
            ]
        ),
        allowed_private_hosts=frozenset({"10.0.0.9"}),
    )
    assert settings.upstreams.all_allowed_hosts == {
        "registry.opentofu.org",
        "reg.example",
        "other.example:8443",
        "v6.example",
    }
    exceptions = settings.upstreams.private_host_exceptions
    assert "127.0.0.1:8080" in exceptions
    assert "mirror.internal:443" in exceptions
    assert "10.0.0.9" in exceptions
    # Not the whole host: only the mapped port is exempt.
    assert "127.0.0.1" not in exceptions
    # The exemptions must be in the form AddressPolicy understands.
    policy = AddressPolicy(exceptions)
    assert policy.is_exempt("127.0.0.1", 8080)
    assert not policy.is_exempt("127.0.0.1", 8081)
    assert policy.is_exempt("mirror.internal", 443)
    assert policy.is_exempt("::1", 9000)
    assert policy.is_exempt("10.0.0.9", 1234)


# ---------------------------------------------------------------------------------------------
# CLI: environment and flags
# ---------------------------------------------------------------------------------------------

_ENV_VARS = [
    "LISTEN",
    "DATA_DIR",
    "TLS_CERT",
    "TLS_KEY",
    "TLS_HOSTNAME",
    "PLAIN_HTTP",
    "ALLOW_HOST",
    "UPSTREAM_MAP",
    "UPSTREAM_CA_FILE",
    "ALLOW_PRIVATE_HOST",
    "REDIS_URL",
    "TTL_DISCOVERY",
    "TTL_VERSIONS",
    "TTL_NEGATIVE",
    "MAX_ARCHIVE_SIZE",
    "MAX_METADATA_SIZE",
    "UPSTREAM_TIMEOUT",
    "UPSTREAM_CONCURRENCY",
    "LOG_FORMAT",
    "LOG_LEVEL",
]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in _ENV_VARS:
        monkeypatch.delenv("REGISTRY_PROXY_" + name, raising=False)
    return monkeypatch


def _settings(tmp_path: Path, *flags: str) -> Settings:
    args = build_parser().parse_args(["serve", "--data-dir", str(tmp_path), *flags])
    return settings_from_args(args)


def test_cli_defaults(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    assert (settings.server.listen_host, settings.server.listen_port) == ("127.0.0.1", 8443)
    assert settings.data_dir == tmp_path
    assert settings.upstreams.allowed_hosts == frozenset(DEFAULT_ALLOWED_HOSTS)
    assert settings.upstreams.upstream_map == {}
    assert settings.tls.plain_http is False
    assert settings.freshness.discovery == 3600
    assert settings.freshness.versions == 600
    assert settings.freshness.negative == 60
    assert settings.limits.max_archive_bytes == 4 * 2**30
    assert settings.limits.max_metadata_bytes == 8 * 2**20
    assert settings.limits.upstream_concurrency == 16


def test_cli_env_listen(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.setenv("REGISTRY_PROXY_LISTEN", "[::1]:9443")
    settings = _settings(tmp_path)
    assert (settings.server.listen_host, settings.server.listen_port) == ("::1", 9443)


def test_cli_env_allow_host_comma_separated(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.setenv("REGISTRY_PROXY_ALLOW_HOST", "Registry.Example, other.example:8443,, ")
    settings = _settings(tmp_path)
    assert settings.upstreams.allowed_hosts == {"registry.example", "other.example:8443"}


def test_cli_env_replaces_default_allow_hosts(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.setenv("REGISTRY_PROXY_ALLOW_HOST", "only.example")
    assert _settings(tmp_path).upstreams.allowed_hosts == {"only.example"}


def test_cli_flags_override_env(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.setenv("REGISTRY_PROXY_LISTEN", "0.0.0.0:9000")
    clean_env.setenv("REGISTRY_PROXY_ALLOW_HOST", "env-a.example,env-b.example")
    clean_env.setenv("REGISTRY_PROXY_TTL_VERSIONS", "1h")
    settings = _settings(
        tmp_path,
        "--listen",
        "127.0.0.2:7000",
        "--allow-host",
        "flag-a.example",
        "--allow-host",
        "Flag-B.example",
        "--ttl-versions",
        "5m",
    )
    assert (settings.server.listen_host, settings.server.listen_port) == ("127.0.0.2", 7000)
    assert settings.upstreams.allowed_hosts == {"flag-a.example", "flag-b.example"}
    assert settings.freshness.versions == 300


def test_cli_env_other_settings(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.setenv(
        "REGISTRY_PROXY_UPSTREAM_MAP", "reg.example=http://127.0.0.1:8080,other.example=https://m.internal"
    )
    clean_env.setenv("REGISTRY_PROXY_PLAIN_HTTP", "true")
    clean_env.setenv("REGISTRY_PROXY_TTL_NEGATIVE", "5s")
    clean_env.setenv("REGISTRY_PROXY_MAX_ARCHIVE_SIZE", "1GiB")
    clean_env.setenv("REGISTRY_PROXY_LOG_FORMAT", "json")
    settings = _settings(tmp_path)
    assert settings.upstreams.upstream_map == {
        "reg.example": URL("http://127.0.0.1:8080"),
        "other.example": URL("https://m.internal"),
    }
    assert settings.tls.plain_http is True
    assert settings.freshness.negative == 5
    assert settings.limits.max_archive_bytes == 2**30
    assert settings.logging.log_format == "json"
    assert "reg.example" in settings.upstreams.all_allowed_hosts


@pytest.mark.parametrize(
    ("raw", "expected"), [("1", True), ("yes", True), ("ON", True), ("0", False), ("false", False), ("", False)]
)
def test_cli_env_switch(clean_env: pytest.MonkeyPatch, tmp_path: Path, raw: str, expected: bool) -> None:
    clean_env.setenv("REGISTRY_PROXY_PLAIN_HTTP", raw)
    assert _settings(tmp_path).tls.plain_http is expected


def test_cli_switch_flag(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert _settings(tmp_path, "--plain-http").tls.plain_http is True


@pytest.mark.parametrize(
    "flags",
    [
        ["--listen", "nowhere"],
        ["--upstream-concurrency", "0"],
        ["--upstream-concurrency", "-3"],
        ["--upstream-concurrency", "many"],
        ["--redis-url", "http://localhost:6379"],
        ["--fleet-lock-ttl", "0s"],
        ["--ttl-versions", "forever"],
        ["--max-archive-size", "huge"],
        ["--tls-cert", "cert.pem"],
        ["--log-format", "xml"],
        ["--upstream-map", "reg.example"],
        ["--allow-host", "bad..host"],
    ],
)
def test_cli_invalid_values(clean_env: pytest.MonkeyPatch, tmp_path: Path, flags: list[str]) -> None:
    with pytest.raises(ConfigError):
        _settings(tmp_path, *flags)


def test_cli_timeout_derivations(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    short = _settings(tmp_path, "--upstream-timeout", "5s").limits
    assert (short.metadata_timeout, short.connect_timeout, short.read_timeout) == (5, 5, 30)
    long = _settings(tmp_path, "--upstream-timeout", "2m", "--download-idle-timeout", "90s").limits
    assert (long.metadata_timeout, long.connect_timeout, long.read_timeout) == (120, 10, 90)


# ---- module archive bombs ------------------------------------------------------------------


@pytest.fixture
def no_module_limit_env(clean_env: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("MAX_MODULE_UNPACKED_SIZE", "MAX_MODULE_ENTRIES"):
        clean_env.delenv("REGISTRY_PROXY_" + name, raising=False)
    return clean_env


def test_cli_module_unpack_limits(no_module_limit_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    assert (settings.modules.max_module_unpacked_bytes, settings.modules.max_module_entries) == (2**30, 100_000)
    settings = _settings(tmp_path, "--max-module-unpacked-size", "64MiB", "--max-module-entries", "500")
    assert (settings.modules.max_module_unpacked_bytes, settings.modules.max_module_entries) == (64 * 2**20, 500)
    no_module_limit_env.setenv("REGISTRY_PROXY_MAX_MODULE_UNPACKED_SIZE", "2GiB")
    no_module_limit_env.setenv("REGISTRY_PROXY_MAX_MODULE_ENTRIES", " 7 ")
    settings = _settings(tmp_path)
    assert (settings.modules.max_module_unpacked_bytes, settings.modules.max_module_entries) == (2 * 2**30, 7)


@pytest.mark.parametrize(
    "flags",
    [
        ["--max-module-unpacked-size", "0"],
        ["--max-module-unpacked-size", "lots"],
        ["--max-module-entries", "0"],
        ["--max-module-entries", "-1"],
        ["--max-module-entries", "1e5"],
        ["--max-module-entries", ""],
    ],
)
def test_cli_invalid_module_unpack_limits(
    no_module_limit_env: pytest.MonkeyPatch, tmp_path: Path, flags: list[str]
) -> None:
    with pytest.raises(ConfigError, match=r"max-module|invalid size"):
        _settings(tmp_path, *flags)


def test_cli_negative_cache_bounds(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    assert (settings.freshness.negative_cache_entries, settings.freshness.negative_cache_bytes) == (10_000, 16 * 2**20)
    clean_env.setenv("REGISTRY_PROXY_NEGATIVE_CACHE_ENTRIES", "500")
    clean_env.setenv("REGISTRY_PROXY_NEGATIVE_CACHE_BYTES", "1MiB")
    settings = _settings(tmp_path)
    assert (settings.freshness.negative_cache_entries, settings.freshness.negative_cache_bytes) == (500, 2**20)
    settings = _settings(tmp_path, "--negative-cache-entries", "7", "--negative-cache-bytes", "64KiB")
    assert (settings.freshness.negative_cache_entries, settings.freshness.negative_cache_bytes) == (7, 64 * 2**10)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--negative-cache-entries", "0"], "invalid --negative-cache-entries '0': must be at least 1"),
        (["--negative-cache-entries=-5"], "invalid --negative-cache-entries '-5': not a whole number"),
        (["--negative-cache-entries", "many"], "invalid --negative-cache-entries 'many': not a whole number"),
        (["--negative-cache-bytes", "100"], "invalid --negative-cache-bytes '100': must be at least 1KiB"),
        (["--negative-cache-bytes", "lots"], "invalid --negative-cache-bytes 'lots': not a size"),
    ],
)
def test_cli_negative_cache_bounds_are_validated(
    clean_env: pytest.MonkeyPatch, tmp_path: Path, flags: list[str], message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        _settings(tmp_path, *flags)


def test_cli_store_size_cap(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("MAX_STORE_SIZE", "EVICTION_GRACE", "EVICTION_INTERVAL"):
        monkeypatch.delenv("REGISTRY_PROXY_" + name, raising=False)
    default = _settings(tmp_path)
    assert (default.archives.max_store_size, default.archives.eviction_grace, default.archives.eviction_interval) == (
        None,
        600.0,
        300.0,
    )
    settings = _settings(tmp_path, "--max-store-size", "200GiB", "--eviction-grace", "15m")
    assert (settings.archives.max_store_size, settings.archives.eviction_grace) == (200 * 2**30, 900.0)
    monkeypatch.setenv("REGISTRY_PROXY_MAX_STORE_SIZE", "1GiB")
    monkeypatch.setenv("REGISTRY_PROXY_EVICTION_INTERVAL", "1m")
    settings = _settings(tmp_path)
    assert (settings.archives.max_store_size, settings.archives.eviction_interval) == (2**30, 60.0)
    for flags in (("--max-store-size", "lots"), ("--max-store-size", "0"), ("--eviction-interval", "0s")):
        with pytest.raises(ConfigError):
            _settings(tmp_path, *flags)


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("Proxy.Example.COM", "proxy.example.com"),
        (" proxy.example.com ", "proxy.example.com"),
        ("*.corp.example", "*.corp.example"),
        ("bücher.example", "xn--bcher-kva.example"),
        ("10.0.0.5", "10.0.0.5"),
        ("[fd00::1]", "fd00::1"),
    ],
)
def test_a_certificate_name_is_a_dns_name_or_an_address(text: str, name: str) -> None:
    assert parse_certificate_name(text) == name


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("https://proxy.example.com/", "not a URL"),
        ("proxy.example.com/mirror", "not a URL"),
        ("proxy.example.com:8443", "no port"),
        ("proxy..example", "invalid hostname"),
    ],
)
def test_a_certificate_name_is_never_a_url_a_path_or_a_port(text: str, reason: str) -> None:
    """Such a name was written into the generated certificate as a DNS name no client would ever match."""
    with pytest.raises(ConfigError, match=reason) as refused:
        parse_certificate_name(text)
    if reason != "invalid hostname":
        assert "--tls-hostname proxy.example.com" in str(refused.value)
