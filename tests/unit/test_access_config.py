"""The access flags: parsed into Settings, checked at start-up, and the start-up warnings."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from proxy.cli import build_parser, settings_from_args, warn_about_access
from proxy.identity.tokens import hash_token, token_entry
from proxy.settings.config import ConfigError


@pytest.fixture(autouse=True)
def no_tf_tokens(monkeypatch):
    """The machine's own TF_TOKEN_* variables must not count."""
    import os

    for name in [name for name in os.environ if name.startswith("TF_TOKEN_")]:
        monkeypatch.delenv(name)


def settings(tmp_path, *flags: str):
    return settings_from_args(build_parser().parse_args(["serve", "--data-dir", str(tmp_path), *flags]))


def warnings(made) -> list[dict]:
    with capture_logs() as logs:
        warn_about_access(made)
    return [entry for entry in logs if entry["log_level"] == "warning"]


def test_upstream_credentials_from_the_file_and_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TF_TOKEN_env_example_com", "from-env")
    monkeypatch.setenv("TF_TOKEN_both_example_com", "env-wins")
    config = tmp_path / "creds.tfrc"
    config.write_text(
        'credentials "file.example.com" { token = "from-file" }\n'
        'credentials "both.example.com" { token = "file-loses" }\n'
    )
    made = settings(
        tmp_path, "--upstream-credentials", str(config), "--upstream-map", "file.example.com=https://10.0.0.1:8443"
    )
    creds = made.upstreams.upstream_credentials
    assert dict(creds.tokens) == {
        "env.example.com": "from-env",
        "both.example.com": "env-wins",
        "file.example.com": "from-file",
    }
    assert str(creds.mapped["file.example.com"]) == "https://10.0.0.1:8443"
    assert "from-file" not in repr(made) and "from-env" not in repr(made)


def test_a_broken_file_stops_start_up(tmp_path):
    (tmp_path / "tokens.toml").write_text("[tokens.a]\nhash = 'nope'\n")
    with pytest.raises(ConfigError, match="hash"):
        settings(tmp_path, "--auth-tokens", str(tmp_path / "tokens.toml"))
    (tmp_path / "creds.tfrc").write_text('credentials "x.example" {}\n')
    with pytest.raises(ConfigError, match="token"):
        settings(tmp_path, "--upstream-credentials", str(tmp_path / "creds.tfrc"))
    with pytest.raises(ConfigError, match="--metrics-token-required needs --auth-tokens"):
        settings(tmp_path, "--metrics-token-required")


def test_the_env_variable_names_the_tokens_file(tmp_path, monkeypatch):
    (tmp_path / "tokens.toml").write_text(f"[tokens.a]\nhash = '{hash_token('t')}'\nhosts = ['*']\n")
    monkeypatch.setenv("REGISTRY_PROXY_AUTH_TOKENS", str(tmp_path / "tokens.toml"))
    assert settings(tmp_path).access.auth_tokens == tmp_path / "tokens.toml"


def test_one_warning_when_anonymous_beyond_loopback(tmp_path):
    assert [w["event"] for w in warnings(settings(tmp_path, "--listen", "0.0.0.0:8443"))] == ["auth.anonymous"]
    assert warnings(settings(tmp_path, "--listen", "127.0.0.1:8443")) == []
    assert warnings(settings(tmp_path, "--listen", "[::1]:8443")) == []
    (tmp_path / "tokens.toml").write_text(token_entry("ci", "rpt_anything", ["*"]))  # an empty file is refused
    assert (
        warnings(settings(tmp_path, "--listen", "0.0.0.0:8443", "--auth-tokens", str(tmp_path / "tokens.toml"))) == []
    )


def test_private_hosts_without_client_tokens_are_announced(tmp_path, monkeypatch):
    monkeypatch.setenv("TF_TOKEN_private_example", "secret")
    found = warnings(settings(tmp_path))
    assert [w["event"] for w in found] == ["auth.private_hosts_refused"]
    assert found[0]["hosts"] == ["private.example"] and "secret" not in repr(found)
