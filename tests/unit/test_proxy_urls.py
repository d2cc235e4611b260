"""Unit tests for proxy.protocol.proxy_urls: the proxy's own URLs and rewriting of provider download documents."""

from __future__ import annotations

import copy

import pytest

from proxy.domain.addresses import ModuleAddr, Platform, ProviderAddr, Version
from proxy.protocol.proxy_urls import (
    archive_filename,
    mirror_archive_path,
    module_archive_path,
    registry_base,
    registry_download_path,
    rewrite_download_document,
    under,
)

LINUX = Platform("linux", "amd64")


@pytest.mark.parametrize(
    ("addr", "version", "platform", "expected"),
    [
        (
            ProviderAddr.parse("registry.example.test", "acme", "foo"),
            "1.2.3",
            LINUX,
            "/mirror/v1/registry.example.test/acme/foo/1.2.3/linux_amd64/terraform-provider-foo_1.2.3_linux_amd64.zip",
        ),
        (
            ProviderAddr.parse("Registry.Example.TEST", "ACME", "Foo"),
            "v1.2.3",
            Platform("darwin", "arm64"),
            "/mirror/v1/registry.example.test/acme/foo/1.2.3/darwin_arm64/terraform-provider-foo_1.2.3_darwin_arm64.zip",
        ),
        (
            ProviderAddr.parse("registry.example.test", "acme", "foo"),
            "1.0.0-beta.1+build.5",
            LINUX,
            "/mirror/v1/registry.example.test/acme/foo/1.0.0-beta.1+build.5/linux_amd64/"
            "terraform-provider-foo_1.0.0-beta.1%2Bbuild.5_linux_amd64.zip",
        ),
        # Unicode hostnames appear in their punycode form
        (
            ProviderAddr.parse("münchen.de", "acme", "foo"),
            "1.0.0",
            LINUX,
            "/mirror/v1/xn--mnchen-3ya.de/acme/foo/1.0.0/linux_amd64/terraform-provider-foo_1.0.0_linux_amd64.zip",
        ),
        (
            ProviderAddr.parse("xn--mnchen-3ya.de", "acme", "foo"),
            "1.0.0",
            LINUX,
            "/mirror/v1/xn--mnchen-3ya.de/acme/foo/1.0.0/linux_amd64/terraform-provider-foo_1.0.0_linux_amd64.zip",
        ),
        # a port is one path segment, its colon encoded; :443 disappears
        (
            ProviderAddr.parse("registry.example.test:8443", "acme", "foo"),
            "1.0.0",
            LINUX,
            "/mirror/v1/registry.example.test%3A8443/acme/foo/1.0.0/linux_amd64/"
            "terraform-provider-foo_1.0.0_linux_amd64.zip",
        ),
        (
            ProviderAddr.parse("registry.example.test:443", "acme", "foo"),
            "1.0.0",
            LINUX,
            "/mirror/v1/registry.example.test/acme/foo/1.0.0/linux_amd64/terraform-provider-foo_1.0.0_linux_amd64.zip",
        ),
        # non-ASCII namespaces and types are percent-encoded as UTF-8
        (
            ProviderAddr.parse("registry.example.test", "Müller", "straße"),
            "1.0.0",
            LINUX,
            "/mirror/v1/registry.example.test/m%C3%BCller/stra%C3%9Fe/1.0.0/linux_amd64/"
            "terraform-provider-stra%C3%9Fe_1.0.0_linux_amd64.zip",
        ),
    ],
)
def test_mirror_archive_path(addr: ProviderAddr, version: str, platform: Platform, expected: str) -> None:
    assert mirror_archive_path(addr, Version.parse(version), platform) == expected


def test_archive_filename() -> None:
    addr = ProviderAddr.parse("registry.example.test", "acme", "foo")
    assert archive_filename(addr, Version.parse("2.0.1"), LINUX) == "terraform-provider-foo_2.0.1_linux_amd64.zip"


@pytest.mark.parametrize(
    ("hostname", "service", "expected"),
    [
        ("registry.example.test", "providers", "/registry/registry.example.test/providers/v1/"),
        ("registry.example.test", "modules", "/registry/registry.example.test/modules/v1/"),
        ("MÜNCHEN.de:8080", "modules", "/registry/xn--mnchen-3ya.de%3A8080/modules/v1/"),
    ],
)
def test_registry_base(hostname: str, service: str, expected: str) -> None:
    assert registry_base(ProviderAddr.parse(hostname, "a", "b").hostname, service) == expected


@pytest.mark.parametrize(
    ("addr", "version", "platform", "expected"),
    [
        (
            ProviderAddr.parse("registry.example.test", "acme", "foo"),
            "1.2.3",
            LINUX,
            "/registry/registry.example.test/providers/v1/acme/foo/1.2.3/download/linux/amd64",
        ),
        (
            ProviderAddr.parse("münchen.de:8443", "acme", "foo"),
            "v0.1.0",
            Platform("windows", "386"),
            "/registry/xn--mnchen-3ya.de%3A8443/providers/v1/acme/foo/0.1.0/download/windows/386",
        ),
        (
            ProviderAddr.parse("registry.example.test", "Müller", "foo"),
            "1.0.0",
            LINUX,
            "/registry/registry.example.test/providers/v1/m%C3%BCller/foo/1.0.0/download/linux/amd64",
        ),
    ],
)
def test_registry_download_path(addr: ProviderAddr, version: str, platform: Platform, expected: str) -> None:
    assert registry_download_path(addr, Version.parse(version), platform) == expected


UPSTREAM_DOCUMENT = {
    "protocols": ["5.0"],
    "os": "linux",
    "arch": "amd64",
    "filename": "terraform-provider-foo_1.2.3_linux_amd64.zip",
    "download_url": "https://releases.example.test/foo/1.2.3/terraform-provider-foo_1.2.3_linux_amd64.zip",
    "shasums_url": "https://releases.example.test/foo/1.2.3/terraform-provider-foo_1.2.3_SHA256SUMS",
    "shasums_signature_url": "https://releases.example.test/foo/1.2.3/terraform-provider-foo_1.2.3_SHA256SUMS.sig",
    "shasum": "5f9c7aa76b7c34d722fc9123208e26b22d60440cb47150dd04733b9b94f4541a",
    "signing_keys": {"gpg_public_keys": [{"key_id": "ABCDEF0123456789", "ascii_armor": "-----BEGIN PGP..."}]},
    "packages": [{"name": "extra", "url": "https://releases.example.test/extra"}],
    "x_vendor": {"nested": {"value": 1}, "list": [1, 2, 3]},
}


def test_rewrite_download_document_replaces_the_three_urls() -> None:
    addr = ProviderAddr.parse("registry.example.test", "acme", "foo")
    version = Version.parse("1.2.3")
    result = rewrite_download_document(UPSTREAM_DOCUMENT, addr, version, LINUX)
    base = "/registry/registry.example.test/providers/v1/acme/foo/1.2.3/download/linux/amd64"
    assert result["download_url"] == (
        "/mirror/v1/registry.example.test/acme/foo/1.2.3/linux_amd64/terraform-provider-foo_1.2.3_linux_amd64.zip"
    )
    assert result["shasums_url"] == f"{base}/SHA256SUMS"
    assert result["shasums_signature_url"] == f"{base}/SHA256SUMS.sig"
    assert result["download_url"] == mirror_archive_path(addr, version, LINUX)


def test_rewrite_download_document_keeps_every_other_field_and_does_not_mutate_its_input() -> None:
    original = copy.deepcopy(UPSTREAM_DOCUMENT)
    addr = ProviderAddr.parse("registry.example.test", "acme", "foo")
    result = rewrite_download_document(UPSTREAM_DOCUMENT, addr, Version.parse("1.2.3"), LINUX)
    assert original == UPSTREAM_DOCUMENT
    assert result is not UPSTREAM_DOCUMENT
    assert set(result) == set(original)
    urls = {"download_url", "shasums_url", "shasums_signature_url"}
    assert {k: v for k, v in result.items() if k not in urls} == {k: v for k, v in original.items() if k not in urls}
    assert result["packages"] == [{"name": "extra", "url": "https://releases.example.test/extra"}]
    assert result["x_vendor"] == {"nested": {"value": 1}, "list": [1, 2, 3]}


def test_rewrite_download_document_adds_missing_urls() -> None:
    addr = ProviderAddr.parse("registry.example.test", "acme", "foo")
    result = rewrite_download_document({"shasum": "ab"}, addr, Version.parse("1.0.0"), LINUX)
    assert result["shasum"] == "ab"
    assert result["download_url"].startswith("/mirror/v1/")
    assert result["shasums_url"].endswith("/download/linux/amd64/SHA256SUMS")
    assert result["shasums_signature_url"].endswith("/download/linux/amd64/SHA256SUMS.sig")


@pytest.mark.parametrize(
    ("addr", "version", "extension", "expected"),
    [
        (
            ModuleAddr.parse("registry.example.test", "acme", "vpc", "aws"),
            "1.0.0",
            ".tar.gz",
            "/registry/registry.example.test/modules/v1/acme/vpc/aws/1.0.0/archive.tar.gz",
        ),
        (
            ModuleAddr.parse("registry.example.test", "acme", "vpc", "aws"),
            "v2.1.0-rc.1",
            ".zip",
            "/registry/registry.example.test/modules/v1/acme/vpc/aws/2.1.0-rc.1/archive.zip",
        ),
        (
            ModuleAddr.parse("registry.example.test", "Acme_Corp", "my_vpc-x", "azurerm"),
            "1.0.0",
            ".tar.xz",
            "/registry/registry.example.test/modules/v1/Acme_Corp/my_vpc-x/azurerm/1.0.0/archive.tar.xz",
        ),
        (
            ModuleAddr.parse("münchen.de", "acme", "vpc", "aws"),
            "1.0.0",
            ".tar",
            "/registry/xn--mnchen-3ya.de/modules/v1/acme/vpc/aws/1.0.0/archive.tar",
        ),
        (
            ModuleAddr.parse("registry.example.test:8443", "acme", "vpc", "aws"),
            "1.0.0",
            ".tar.bz2",
            "/registry/registry.example.test%3A8443/modules/v1/acme/vpc/aws/1.0.0/archive.tar.bz2",
        ),
    ],
)
def test_module_archive_path(addr: ModuleAddr, version: str, extension: str, expected: str) -> None:
    assert module_archive_path(addr, Version.parse(version), extension) == expected


@pytest.mark.parametrize(
    ("prefix", "url", "expected"),
    [
        ("/", "/mirror/v1/x.zip", "/mirror/v1/x.zip"),
        ("/tf/", "/mirror/v1/x.zip?grant=abc", "/tf/mirror/v1/x.zip?grant=abc"),
        ("/a/b/", "/registry/h/modules/v1/", "/a/b/registry/h/modules/v1/"),
        ("/tf/", "1.0.0/linux_amd64/x.zip", "1.0.0/linux_amd64/x.zip"),  # relative: resolved under the prefix already
        ("/tf/", "https://cdn.example.com/x.zip", "https://cdn.example.com/x.zip"),
        ("/tf/", "git::https://example.com/x.git?ref=v1", "git::https://example.com/x.git?ref=v1"),
        ("/tf/", "//cdn.example.com/x.zip", "//cdn.example.com/x.zip"),
    ],
)
def test_under_a_public_path_prefix(prefix: str, url: str, expected: str) -> None:
    assert under(prefix, url) == expected
