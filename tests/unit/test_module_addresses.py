"""Unit tests for proxy.domain.addresses.ModuleAddr.parse."""

from __future__ import annotations

import pytest

from proxy.domain.addresses import AddressError, Hostname, ModuleAddr


@pytest.mark.parametrize(
    ("hostname", "namespace", "name", "system"),
    [
        ("registry.example.test", "acme", "vpc", "aws"),
        ("registry.example.test", "hashicorp", "consul", "aws"),
        ("registry.example.test", "Acme", "VPC", "azurerm"),
        ("registry.example.test", "acme_corp", "my_module", "google"),
        ("registry.example.test", "acme-corp", "my-module", "kubernetes"),
        ("registry.example.test", "a_b-c", "x-_y", "aws"),
        ("registry.example.test", "a", "b", "c"),
        ("registry.example.test", "0", "9", "0"),
        ("registry.example.test", "a1", "2b", "aws2"),
        ("registry.example.test", "a" * 64, "b" * 64, "c" * 64),
        ("registry.example.test:8443", "acme", "vpc", "aws"),
    ],
)
def test_module_addr_parse_accepts(hostname: str, namespace: str, name: str, system: str) -> None:
    addr = ModuleAddr.parse(hostname, namespace, name, system)
    assert (addr.namespace, addr.name, addr.system) == (namespace, name, system)
    assert addr.hostname == Hostname.parse(hostname)


def test_module_addr_normalises_the_hostname_only() -> None:
    addr = ModuleAddr.parse("MÜNCHEN.de:443", "Acme_Corp", "My-Vpc", "aws")
    assert addr == ModuleAddr(Hostname("xn--mnchen-3ya.de"), "Acme_Corp", "My-Vpc", "aws")
    assert str(addr) == "xn--mnchen-3ya.de/Acme_Corp/My-Vpc/aws"


def test_module_addr_str_with_port() -> None:
    assert str(ModuleAddr.parse("r.example:8443", "a", "b", "c")) == "r.example:8443/a/b/c"


@pytest.mark.parametrize(
    ("namespace", "name", "system"),
    [
        # empty parts
        ("", "vpc", "aws"),
        ("acme", "", "aws"),
        ("acme", "vpc", ""),
        # leading or trailing dash or underscore
        ("-acme", "vpc", "aws"),
        ("acme-", "vpc", "aws"),
        ("_acme", "vpc", "aws"),
        ("acme_", "vpc", "aws"),
        ("acme", "-vpc", "aws"),
        ("acme", "vpc-", "aws"),
        ("acme", "_vpc", "aws"),
        ("acme", "vpc_", "aws"),
        ("-", "vpc", "aws"),
        ("_", "vpc", "aws"),
        # the target system: lower-case letters and digits only
        ("acme", "vpc", "AWS"),
        ("acme", "vpc", "Aws"),
        ("acme", "vpc", "aws-gov"),
        ("acme", "vpc", "aws_gov"),
        ("acme", "vpc", "-aws"),
        ("acme", "vpc", "aws."),
        # overlong
        ("a" * 65, "vpc", "aws"),
        ("acme", "b" * 65, "aws"),
        ("acme", "vpc", "c" * 65),
        # trailing newline (a `$` regex anchor would let it through)
        ("acme\n", "vpc", "aws"),
        ("acme", "vpc\n", "aws"),
        ("acme", "vpc", "aws\n"),
        # other characters
        ("ac me", "vpc", "aws"),
        ("acme", "v.pc", "aws"),
        ("acme", "vpc/x", "aws"),
        ("acme", "..", "aws"),
        ("acme", "vpc", "a/b"),
        ("acme", "vpc%2F", "aws"),
        ("müller", "vpc", "aws"),
        ("acme", "vpc", "\uff41ws"),  # a full-width letter
        ("acme", "vpc", "a\x00"),
    ],
)
def test_module_addr_parse_refuses(namespace: str, name: str, system: str) -> None:
    with pytest.raises(AddressError):
        ModuleAddr.parse("registry.example.test", namespace, name, system)


@pytest.mark.parametrize("hostname", ["", "bad host", "registry.example.test.", "h:0", "h:99999"])
def test_module_addr_parse_refuses_bad_hostnames(hostname: str) -> None:
    with pytest.raises(AddressError):
        ModuleAddr.parse(hostname, "acme", "vpc", "aws")
