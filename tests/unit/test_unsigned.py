"""`--unsigned-providers`: the policy's values, its flag and environment variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.cli import build_parser, settings_from_args
from proxy.domain.unsigned_policy import (
    OPENTOFU_DEFAULT_REGISTRY,
    UnsignedPolicy,
    UnsignedPolicyError,
    parse_unsigned_policy,
)
from proxy.settings.config import ConfigError, Settings


def test_opentofu_default_admits_only_the_opentofu_registry() -> None:
    policy = parse_unsigned_policy("opentofu-default")
    assert policy == UnsignedPolicy() and str(policy) == "opentofu-default"
    assert policy.allows(OPENTOFU_DEFAULT_REGISTRY)
    assert not policy.allows("registry.terraform.io")
    assert not policy.allows("registry.opentofu.org.evil.example")
    assert not policy.allows("registry.opentofu.org:8443")


def test_refuse_admits_nothing() -> None:
    policy = parse_unsigned_policy(" refuse ")
    assert not policy.allows(OPENTOFU_DEFAULT_REGISTRY) and str(policy) == "refuse"


def test_allow_hosts_normalises_the_names_as_the_clients_do() -> None:
    policy = parse_unsigned_policy("allow-hosts=Registry.Example.COM, private.example:443,,bücher.example")
    assert policy.hosts == {"registry.example.com", "private.example", "xn--bcher-kva.example"}
    assert policy.allows("registry.example.com") and not policy.allows(OPENTOFU_DEFAULT_REGISTRY)
    assert str(policy) == "allow-hosts=private.example,registry.example.com,xn--bcher-kva.example"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "allow",
        "allow-hosts=",
        "allow-hosts= , ",
        "allow-hosts=bad host",
        "allow-hosts=a..b",
        "allow-hosts=host:99999",
        "OPENTOFU-DEFAULT",
        "refuse,x",
    ],
)
def test_invalid_values_are_refused(text: str) -> None:
    with pytest.raises(UnsignedPolicyError):
        parse_unsigned_policy(text)
    with pytest.raises(ConfigError, match="--unsigned-providers"):
        build_parser().parse_args(["serve", "--unsigned-providers", text])


def _settings(tmp_path: Path, *flags: str) -> Settings:
    return settings_from_args(build_parser().parse_args(["serve", "--data-dir", str(tmp_path), *flags]))


def test_flag_and_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("REGISTRY_PROXY_UNSIGNED_PROVIDERS", raising=False)
    assert _settings(tmp_path).upstreams.unsigned_providers == UnsignedPolicy()
    assert Settings(data_dir=tmp_path).upstreams.unsigned_providers == UnsignedPolicy()
    assert _settings(tmp_path, "--unsigned-providers", "refuse").upstreams.unsigned_providers.hosts == frozenset()
    monkeypatch.setenv("REGISTRY_PROXY_UNSIGNED_PROVIDERS", "allow-hosts=a.example,b.example")
    assert _settings(tmp_path).upstreams.unsigned_providers.hosts == {"a.example", "b.example"}
    assert (
        _settings(tmp_path, "--unsigned-providers", "opentofu-default").upstreams.unsigned_providers == UnsignedPolicy()
    )
    with pytest.raises(ConfigError):
        _settings(tmp_path, "--unsigned-providers", "sometimes")
