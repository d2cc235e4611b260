"""`--config FILE` (TOML): same keys as the long flags; flags > environment > file > defaults."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from proxy.cli import build_parser, main, settings_from_args
from proxy.settings.config import ConfigError, options_for
from proxy.settings.optionspec import LocalPath


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.startswith("REGISTRY_PROXY_"):
            monkeypatch.delenv(name)
    return monkeypatch


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "registry-proxy.toml"
    path.write_text(text)
    return path


def _args(*argv: str):
    return build_parser().parse_args(list(argv))


def test_file_values_with_dashes_or_underscores(clean_env, tmp_path: Path) -> None:
    config = _file(
        tmp_path,
        """
listen = "0.0.0.0:9443"
plain-http = true
allow_host = ["Registry.Example", "other.example"]
ttl-versions = "5m"
upstream_concurrency = 4
min-free-space = "5%"
""",
    )
    settings = settings_from_args(_args("serve", "--config", str(config), "--data-dir", str(tmp_path)))
    assert (settings.server.listen_host, settings.server.listen_port) == ("0.0.0.0", 9443)
    assert settings.tls.plain_http is True
    assert settings.upstreams.allowed_hosts == {"registry.example", "other.example"}
    assert settings.freshness.versions == 300
    assert settings.limits.upstream_concurrency == 4
    assert settings.archives.min_free_space.percent == 5


def test_precedence_flags_then_env_then_file_then_defaults(clean_env, tmp_path: Path) -> None:
    config = _file(
        tmp_path,
        'ttl-versions = "5m"\nttl-discovery = "2h"\nttl-negative = "7s"\n'
        'allow-host = ["file.example"]\nplain-http = true\n',
    )
    clean_env.setenv("REGISTRY_PROXY_TTL_DISCOVERY", "3h")
    clean_env.setenv("REGISTRY_PROXY_TTL_NEGATIVE", "9s")
    clean_env.setenv("REGISTRY_PROXY_PLAIN_HTTP", "false")
    settings = settings_from_args(
        _args("serve", "--config", str(config), "--data-dir", str(tmp_path), "--ttl-negative", "11s")
    )
    assert settings.freshness.negative == 11  # flag over env over file
    assert settings.freshness.discovery == 3 * 3600  # env over file
    assert settings.freshness.versions == 300  # file over default
    assert settings.upstreams.allowed_hosts == {"file.example"}  # file replaces the default list
    assert settings.tls.plain_http is False  # an env false beats a file true
    assert settings.limits.max_archive_bytes == 4 * 2**30  # default


def test_config_file_from_the_environment(clean_env, tmp_path: Path) -> None:
    clean_env.setenv("REGISTRY_PROXY_CONFIG", str(_file(tmp_path, 'log-level = "debug"\n')))
    assert settings_from_args(_args("serve", "--data-dir", str(tmp_path))).logging.log_level == "debug"


# A valid value of each `serve` option without a default (or one the machine decides); the others are
# given their default's text.
SAMPLES = {
    "--data-dir": "data",
    "--workers": "3",
    "--tls-cert": "cert.pem",
    "--tls-key": "key.pem",
    "--tls-hostname": ["proxy.example"],
    "--upstream-map": ["reg.example=https://10.0.0.5/"],
    "--upstream-ca-file": "ca.pem",
    "--allow-private-host": ["artifacts.internal:8443"],
    "--redis-url": "redis://127.0.0.1:6379/0",
    "--redis-password": "hunter2",
    "--redis-sentinel-password": "hunter3",
    "--redis-ca-file": "redis-ca.pem",
    "--metadata-secret": "0123456789abcdef0123",
    "--metadata-secret-file": "secret",
    "--metadata-secret-accepted": "fedcba98765432100123",
    "--metadata-secret-accepted-file": "old-secret",
    "--public-url": "https://proxy.example/",
    "--auth-tokens": "tokens.toml",
    "--policy": "policy.toml",
    "--audit-log": "audit.jsonl",
    "--oidc-issuers": "issuers.toml",
    "--upstream-credentials": "credentials.tfrc",
    "--archive-store": "s3://bucket/prefix",
    "--s3-endpoint-url": "https://minio.internal:9000",
    "--s3-region": "eu-west-1",
    "--s3-ca-file": "s3-ca.pem",
    "--max-store-size": "200GiB",
    "--trusted-proxies": ["10.0.0.0/8"],
}


def _toml(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    return f'"{value}"'


def test_every_serve_option_comes_the_same_from_a_flag_the_environment_and_the_file(
    clean_env, tmp_path, ca_file
) -> None:
    """Generic: the file and the environment reach every option `serve` declares, including ones added
    later, and give it the value the flag gives."""
    parser = build_parser()
    specs = [spec for spec in options_for("serve") if spec.env]
    clean_env.chdir(tmp_path)  # the files the samples name are there, as each option needs them (a CA file: PEM)
    for spec in specs:
        if isinstance(spec.kind, LocalPath) and spec.kind.expects in ("file", "certificates"):
            (tmp_path / SAMPLES[spec.flag]).write_bytes(ca_file.read_bytes())
    assert len(specs) > 60
    for spec in specs:
        sample = SAMPLES.get(spec.flag, True if spec.kind.switch else spec.default)
        assert sample is not None, f"give {spec.flag} a sample value"
        if spec.kind.switch:
            flags = [spec.flag]
            env = "true"
        elif spec.kind.repeat:
            flags = [item for value in sample for item in (spec.flag, value)]
            env = ",".join(sample)
        else:
            flags = [spec.flag, str(sample)]
            env = str(sample)
        from_flag = getattr(parser.parse_args(["serve", *flags]), spec.dest)
        clean_env.setenv(spec.env_name, env)
        from_env = getattr(parser.parse_args(["serve"]), spec.dest)
        clean_env.delenv(spec.env_name)
        config = _file(tmp_path, f"{spec.key.replace('-', '_')} = {_toml(sample)}\n")
        from_file = getattr(parser.parse_args(["serve", "--config", str(config)]), spec.dest)
        assert from_flag == from_env == from_file, spec.flag
        if spec.flag not in SAMPLES and not spec.kind.switch:
            assert from_flag == spec.default_value(), spec.flag


@pytest.mark.parametrize(
    ("text", "phrases"),
    [
        ("plain-htp = true\n", ["unknown key 'plain-htp'", "did you mean 'plain-http'?"]),
        ('config = "other.toml"\n', ["unknown key 'config'"]),
        ('plain-http = "yes"\n', ["'plain-http' must be true or false", "a string"]),
        ("allow-host = [1, 2]\n", ["'allow-host' must be a list of strings"]),
        ("listen = true\n", ["'listen' must be a string or a number", "a boolean"]),
        ('listen = ["a", "b"]\n', ["'listen' must be a string or a number", "a list"]),
        ('[redis]\nurl = "redis://x"\n', ["unknown key 'redis'"]),
        ('ttl-versions = "1m"\nttl_versions = "2m"\n', ["'ttl_versions' given twice"]),
        ("listen = \n", ["invalid TOML"]),
    ],
)
def test_bad_files_name_the_key_and_the_file(clean_env, tmp_path: Path, capsys, text: str, phrases: list[str]) -> None:
    config = _file(tmp_path, text)
    with pytest.raises(ConfigError) as error:
        _args("serve", "--config", str(config), "--data-dir", str(tmp_path))
    assert str(config) in str(error.value)
    for phrase in phrases:
        assert phrase in str(error.value)
    assert main(["serve", "--config", str(config), "--data-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"registry-proxy: error: {error.value}"]


def test_a_missing_file_is_named(clean_env, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config file .*nowhere.toml: no such file"):
        _args("serve", "--config", str(tmp_path / "nowhere.toml"))


def test_data_commands_take_the_serve_file(clean_env, tmp_path: Path) -> None:
    """`verify`/`export`/`import` read the same file as `serve`: the keys they have, the rest checked, unused."""
    config = _file(tmp_path, f'data-dir = "{tmp_path / "from-file"}"\nplain-http = true\nredis-prefix = "p"\n')
    assert _args("verify", "--config", str(config)).data_dir == tmp_path / "from-file"
    exported = _args("export", "--config", str(config), "--out", "b.tar")
    assert (exported.data_dir, exported.redis_prefix) == (tmp_path / "from-file", "p")
    with pytest.raises(ConfigError, match="unknown key 'dta-dir'"):
        _args("verify", "--config", str(_file(tmp_path, 'dta-dir = "x"\n')))
    with pytest.raises(ConfigError, match="'plain-http' must be true or false"):
        _args("verify", "--config", str(_file(tmp_path, "plain-http = 1\n")))


def test_unknown_environment_variables_are_refused_for_every_command(clean_env, tmp_path: Path) -> None:
    clean_env.setenv("REGISTRY_PROXY_DATADIR", str(tmp_path))
    for argv in (["serve"], ["verify"], ["lock", "--proxy", "https://p.example/"]):
        with pytest.raises(ConfigError, match=r"REGISTRY_PROXY_DATADIR .*did you mean REGISTRY_PROXY_DATA_DIR"):
            _args(*argv)
    clean_env.delenv("REGISTRY_PROXY_DATADIR")
    clean_env.setenv("REGISTRY_PROXY_PROXY", "https://p.example/")  # a variable of another command is known
    assert _args("serve", "--data-dir", str(tmp_path)).data_dir == tmp_path
