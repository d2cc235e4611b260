"""`--config FILE` (TOML): same keys as the long flags; flags > environment > file > defaults."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from proxy.cli import build_parser, main, settings_from_args
from proxy.config import ConfigError
from proxy.options import OptionParser


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
    assert (settings.listen_host, settings.listen_port) == ("0.0.0.0", 9443)
    assert settings.plain_http is True
    assert settings.allowed_hosts == {"registry.example", "other.example"}
    assert settings.freshness.versions == 300
    assert settings.limits.upstream_concurrency == 4
    assert settings.min_free_space.percent == 5


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
    assert settings.allowed_hosts == {"file.example"}  # file replaces the default list
    assert settings.plain_http is False  # an env false beats a file true
    assert settings.limits.max_archive_bytes == 4 * 2**30  # default


def test_config_file_from_the_environment(clean_env, tmp_path: Path) -> None:
    clean_env.setenv("REGISTRY_PROXY_CONFIG", str(_file(tmp_path, 'log-level = "debug"\n')))
    assert settings_from_args(_args("serve", "--data-dir", str(tmp_path))).log_level == "debug"


def test_every_serve_option_can_come_from_the_file(clean_env, tmp_path: Path) -> None:
    """Generic: the file reaches every option `serve` declares, including ones added later."""
    parser = build_parser()
    serve = parser._subcommands().choices["serve"]  # type: ignore[union-attr]
    assert isinstance(serve, OptionParser) and len(serve.option_specs) > 40
    for spec in serve.option_specs:
        value = {"switch": "true", "repeat": '["x.example"]', "value": '"some-value"'}[spec.kind]
        config = _file(tmp_path, f"{spec.key.replace('-', '_')} = {value}\n")
        args = parser.parse_args(["serve", "--config", str(config)])
        expected = {"switch": True, "repeat": ["x.example"], "value": "some-value"}[spec.kind]
        assert getattr(args, spec.dest) == expected, spec.flag


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
    assert _args("verify", "--config", str(config)).data_dir == str(tmp_path / "from-file")
    exported = _args("export", "--config", str(config), "--out", "b.tar")
    assert (exported.data_dir, exported.redis_prefix) == (str(tmp_path / "from-file"), "p")
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
    assert _args("serve", "--data-dir", str(tmp_path)).data_dir == str(tmp_path)
