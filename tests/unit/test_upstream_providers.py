"""Unit tests for proxy.protocol.provider_registry: providers.v1 URLs and validation of upstream answers."""

from __future__ import annotations

import json
from typing import Any

import pytest
from yarl import URL

from proxy.domain.addresses import Platform, ProviderAddr, Version
from proxy.domain.hashes import Hash
from proxy.errors import UpstreamMalformedError
from proxy.protocol.provider_registry import (
    DownloadInfo,
    VersionInfo,
    download_url,
    parse_download,
    parse_versions,
    versions_url,
)

ADDR = ProviderAddr.parse("registry.example.test", "acme", "foo")
BASE = URL("https://registry.example.test/v1/providers/")
VERSION = Version.parse("1.2.0")
LINUX = Platform.of("linux", "amd64")
FINAL_URL = URL("https://registry.example.test/v1/providers/acme/foo/1.2.0/download/linux/amd64")
SHASUM = "A" * 64
FILENAME = "terraform-provider-foo_1.2.0_linux_amd64.zip"
KEY = "-----BEGIN PGP PUBLIC KEY BLOCK-----\n...\n-----END PGP PUBLIC KEY BLOCK-----\n"


def versions_body(*entries: Any) -> bytes:
    return json.dumps({"versions": list(entries)}).encode()


def download_doc(**changes: Any) -> dict[str, Any]:
    """A good download document, with fields replaced (or removed, given `None`)."""
    document = {
        "protocols": ["5.0", 6],
        "os": "linux",
        "arch": "amd64",
        "filename": FILENAME,
        "download_url": f"https://releases.example.test/foo/1.2.0/{FILENAME}",
        "shasums_url": "../../../../../files/SHA256SUMS",
        "shasums_signature_url": "/files/SHA256SUMS.sig",
        "shasum": SHASUM,
        "signing_keys": {"gpg_public_keys": [{"key_id": "ABCD", "ascii_armor": KEY}]},
    }
    document.update(changes)
    return {name: value for name, value in document.items() if value is not None}


def parse(document: Any) -> DownloadInfo:
    return parse_download(json.dumps(document).encode(), FINAL_URL, ADDR, VERSION, LINUX)


# ---------------------------------------------------------------------------------------------
# URLs
# ---------------------------------------------------------------------------------------------


def test_urls_are_built_under_the_discovered_base() -> None:
    assert str(versions_url(BASE, ADDR)) == "https://registry.example.test/v1/providers/acme/foo/versions"
    assert str(download_url(BASE, ADDR, VERSION, LINUX)) == str(FINAL_URL)


# ---------------------------------------------------------------------------------------------
# parse_versions
# ---------------------------------------------------------------------------------------------


def test_versions_good_document() -> None:
    body = versions_body(
        {
            "version": "1.2.0",
            "protocols": ["5.0"],
            "platforms": [{"os": "linux", "arch": "amd64"}, {"os": "darwin", "arch": "arm64"}],
        },
        {"version": "2.0.0-beta.1", "protocols": ["5.0", "6.0"], "platforms": []},
    )
    assert parse_versions(body, ADDR) == {
        VERSION: VersionInfo(("5.0",), (LINUX, Platform.of("darwin", "arm64"))),
        Version.parse("2.0.0-beta.1"): VersionInfo(("5.0", "6.0"), ()),
    }


def test_versions_skips_entries_the_clients_skip() -> None:
    body = versions_body(
        "1.0.0",
        None,
        [],
        {},
        {"version": 1},
        {"version": None},
        {"version": "banana"},
        {"version": "1.0"},
        {
            "version": "1.2.0",
            "protocols": ["5.0", 5, None, {"x": 1}],
            "platforms": [
                "linux_amd64",
                None,
                {"os": "linux"},
                {"os": 1, "arch": "amd64"},
                {"os": "../etc", "arch": "amd64"},
                {"os": "Linux", "arch": "amd64"},
                {"os": "linux", "arch": "amd64"},
                {"os": "linux", "arch": "amd64"},
            ],
        },
    )
    assert parse_versions(body, ADDR) == {VERSION: VersionInfo(("5.0",), (LINUX,))}


def test_versions_missing_fields_mean_nothing_offered() -> None:
    body = versions_body({"version": "1.2.0"}, {"version": "1.3.0", "platforms": None, "protocols": None})
    assert parse_versions(body, ADDR) == {VERSION: VersionInfo((), ()), Version.parse("1.3.0"): VersionInfo((), ())}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "not valid JSON"),
        (b"{", "not valid JSON"),
        (b"\xff\xfe{}", "not valid JSON"),
        (b"[]", "not a JSON object"),
        (b'"versions"', "not a JSON object"),
        (b"{}", "no 'versions' array"),
        (b'{"versions": {"1.2.0": {}}}', "no 'versions' array"),
        (b'{"versions": null}', "no 'versions' array"),
    ],
)
def test_versions_malformed_document_is_an_upstream_error(body: bytes, message: str) -> None:
    with pytest.raises(UpstreamMalformedError, match=message) as info:
        parse_versions(body, ADDR)
    assert str(ADDR) in info.value.message


def test_versions_huge_list() -> None:
    """Ten thousand versions, one of them listing a platform ten thousand times, among junk entries."""
    entries = [
        {"version": f"1.{minor}.{patch}", "platforms": [{"os": "linux", "arch": "amd64"}]}
        for minor in range(100)
        for patch in range(100)
    ]
    entries[0]["platforms"] = [{"os": "linux", "arch": "amd64"}] * 10_000 + [{"os": "windows", "arch": "386"}]
    parsed = parse_versions(versions_body(*entries, *[{"version": "junk"}] * 10_000), ADDR)
    assert len(parsed) == 10_000
    assert parsed[Version.parse("1.0.0")].platforms == (LINUX, Platform.of("windows", "386"))
    assert parsed[Version.parse("1.99.99")].platforms == (LINUX,)


# ---------------------------------------------------------------------------------------------
# parse_download
# ---------------------------------------------------------------------------------------------


def test_download_good_document() -> None:
    info = parse(download_doc())
    assert info == DownloadInfo(
        platform=LINUX,
        filename=FILENAME,
        shasum=Hash.zh("a" * 64),
        download_url=URL(f"https://releases.example.test/foo/1.2.0/{FILENAME}"),
        shasums_url=URL("https://registry.example.test/v1/providers/files/SHA256SUMS"),
        shasums_signature_url=URL("https://registry.example.test/files/SHA256SUMS.sig"),
        signing_keys=(KEY,),
        protocols=("5.0",),
    )
    assert info.raw == download_doc()


@pytest.mark.parametrize(
    "changes", [{"os": "darwin"}, {"arch": "arm64"}, {"os": None}, {"arch": None}, {"os": ["linux"]}]
)
def test_download_for_another_platform_is_refused(changes: dict) -> None:
    with pytest.raises(UpstreamMalformedError, match="another platform"):
        parse(download_doc(**changes))


@pytest.mark.parametrize(
    "filename",
    [
        None,
        "",
        7,
        ["a.zip"],
        ".",
        "..",
        "../evil.zip",
        "a/b.zip",
        "a\\b.zip",
        "/etc/passwd",
        "evil\n.zip",
        "evil .zip",
        "evil\x00.zip",
        "é.zip",
        "x" * 256,
    ],
)
def test_download_with_a_hostile_or_missing_filename_is_refused(filename: Any) -> None:
    with pytest.raises(UpstreamMalformedError, match="invalid filename"):
        parse(download_doc(filename=filename))


def test_download_filename_at_the_length_limit_is_fine() -> None:
    assert parse(download_doc(filename="x" * 255)).filename == "x" * 255


@pytest.mark.parametrize("shasum", [None, "", 1, "a" * 63, "a" * 65, "g" * 64, "a" * 63 + "\n", ["a" * 64]])
def test_download_with_an_invalid_shasum_is_refused(shasum: Any) -> None:
    with pytest.raises(UpstreamMalformedError, match="invalid shasum"):
        parse(download_doc(shasum=shasum))


@pytest.mark.parametrize("name", ["download_url", "shasums_url", "shasums_signature_url"])
@pytest.mark.parametrize("value", [None, "", 42, ["https://x.example/a"], {"url": "https://x.example/a"}])
def test_download_without_a_url_is_refused(name: str, value: Any) -> None:
    with pytest.raises(UpstreamMalformedError, match=f"lacks {name}"):
        parse(download_doc(**{name: value}))


@pytest.mark.parametrize("name", ["download_url", "shasums_url", "shasums_signature_url"])
@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("file:///etc/passwd", "must be an http"),
        ("javascript:alert(1)", "must be an http"),
        ("ftp://releases.example.test/a.zip", "must be an http"),
        ("gopher://127.0.0.1:6379/_FLUSHALL", "must be an http"),
        ("data:text/plain,hello", "must be an http"),
        ("http://[::1", "invalid"),
    ],
)
def test_download_with_a_hostile_url_is_refused(name: str, value: str, message: str) -> None:
    with pytest.raises(UpstreamMalformedError, match=message) as info:
        parse(download_doc(**{name: value}))
    assert name in info.value.message


@pytest.mark.parametrize(
    "document",
    [
        download_doc(signing_keys=None),
        {**download_doc(), "signing_keys": None},
        download_doc(signing_keys={}),
        download_doc(signing_keys={"gpg_public_keys": []}),
        download_doc(signing_keys={"gpg_public_keys": None}),
    ],
)
def test_download_listing_no_keys_is_unsigned(document: dict[str, Any]) -> None:
    """No keys at all (as OpenTofu decodes the answer: no field, null or an empty list): an unsigned
    provider, whose admission is `--unsigned-providers`'s decision."""
    info = parse(document)
    assert info.unsigned and info.signing_keys == ()
    assert info.document_url == FINAL_URL


@pytest.mark.parametrize(
    "signing_keys",
    [
        [],
        "KEY",
        {"gpg_public_keys": "KEY"},
        {"gpg_public_keys": {}},
        {"gpg_public_keys": [KEY]},
        {"gpg_public_keys": [{"key_id": "ABCD"}]},
        {"gpg_public_keys": [{"ascii_armor": None}, {"ascii_armor": 1}, {"ascii_armor": [KEY]}]},
    ],
)
def test_download_with_malformed_signing_keys_is_refused(signing_keys: Any) -> None:
    """Keys that are there but unusable are no unsigned provider: OpenTofu fails on them too."""
    with pytest.raises(UpstreamMalformedError, match="no usable signing keys"):
        parse(download_doc(signing_keys=signing_keys))


def test_download_keeps_only_usable_keys_of_a_huge_list() -> None:
    junk = [None, {"ascii_armor": 1}, "KEY"] * 10_000
    info = parse(download_doc(signing_keys={"gpg_public_keys": [*junk, {"ascii_armor": KEY}, {"ascii_armor": "B"}]}))
    assert info.signing_keys == (KEY, "B")


@pytest.mark.parametrize("body", [b"", b"not json", b"[]", b"null", b"\xff"])
def test_download_malformed_document_is_an_upstream_error(body: bytes) -> None:
    with pytest.raises(UpstreamMalformedError) as info:
        parse_download(body, FINAL_URL, ADDR, VERSION, LINUX)
    assert "download metadata of registry.example.test/acme/foo 1.2.0 linux_amd64" in info.value.message
