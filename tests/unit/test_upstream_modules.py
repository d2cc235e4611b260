"""Unit tests for proxy.protocol.module_registry: modules.v1 URLs and validation of upstream answers."""

from __future__ import annotations

import json

import pytest
from yarl import URL

from proxy.domain.addresses import ModuleAddr, Version
from proxy.errors import UpstreamError, UpstreamMalformedError
from proxy.protocol.module_registry import (
    MAX_LOCATION_LENGTH,
    download_url,
    parse_download,
    parse_versions,
    resolve_relative,
    versions_url,
)

ADDR = ModuleAddr.parse("registry.example.test", "acme", "vpc", "aws")

# ---------------------------------------------------------------------------------------------
# URLs
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("base", "expected"),
    [
        ("https://registry.example.test/v1/modules/", "https://registry.example.test/v1/modules/acme/vpc/aws/versions"),
        ("https://registry.example.test/v1/modules", "https://registry.example.test/v1/modules/acme/vpc/aws/versions"),
        ("https://registry.example.test/", "https://registry.example.test/acme/vpc/aws/versions"),
        ("https://registry.example.test", "https://registry.example.test/acme/vpc/aws/versions"),
        (
            "https://modules.example.test:8443/api/v1/modules",
            "https://modules.example.test:8443/api/v1/modules/acme/vpc/aws/versions",
        ),
    ],
)
def test_versions_url(base: str, expected: str) -> None:
    assert str(versions_url(URL(base), ADDR)) == expected


@pytest.mark.parametrize(
    ("base", "version", "expected"),
    [
        (
            "https://registry.example.test/v1/modules/",
            "1.0.0",
            "https://registry.example.test/v1/modules/acme/vpc/aws/1.0.0/download",
        ),
        (
            "https://registry.example.test/v1/modules",
            "v1.0.0",
            "https://registry.example.test/v1/modules/acme/vpc/aws/1.0.0/download",
        ),
        (
            "https://registry.example.test",
            "2.0.0-rc.1",
            "https://registry.example.test/acme/vpc/aws/2.0.0-rc.1/download",
        ),
    ],
)
def test_download_url(base: str, version: str, expected: str) -> None:
    assert str(download_url(URL(base), ADDR, Version.parse(version))) == expected


def test_urls_keep_module_name_case_and_underscores() -> None:
    addr = ModuleAddr.parse("registry.example.test", "Acme_Corp", "My_Vpc", "aws")
    assert str(versions_url(URL("https://r.example/v1/modules"), addr)) == (
        "https://r.example/v1/modules/Acme_Corp/My_Vpc/aws/versions"
    )


# ---------------------------------------------------------------------------------------------
# parse_versions
# ---------------------------------------------------------------------------------------------


def versions_body(*versions: object) -> bytes:
    return json.dumps({"modules": [{"versions": [{"version": v} for v in versions]}]}).encode()


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (versions_body("1.0.0", "1.1.0", "2.0.0-beta.1"), ["1.0.0", "1.1.0", "2.0.0-beta.1"]),
        (versions_body("v1.0.0"), ["1.0.0"]),
        (versions_body(), []),
        (json.dumps({"modules": [{"versions": []}]}).encode(), []),
        (json.dumps({"modules": [{}]}).encode(), []),
        (json.dumps({"modules": [{"versions": None}]}).encode(), []),
        # unparseable entries are skipped, the rest kept
        (versions_body("1.0.0", "not-a-version", "1.2", "", "2.0.0"), ["1.0.0", "2.0.0"]),
        (versions_body("1.0.0", 2, None, ["1.1.0"]), ["1.0.0"]),
        (json.dumps({"modules": [{"versions": [{"version": "1.0.0"}, "1.1.0", 3, None, {}]}]}).encode(), ["1.0.0"]),
        # extra fields are ignored; only the first module counts
        (
            json.dumps(
                {
                    "modules": [
                        {"source": "x", "versions": [{"version": "1.0.0", "submodules": []}]},
                        {"versions": [{"version": "9.9.9"}]},
                    ],
                    "meta": {},
                }
            ).encode(),
            ["1.0.0"],
        ),
        (b'\xef\xbb\xbf{"modules": [{"versions": [{"version": "1.0.0"}]}]}', ["1.0.0"]),
    ],
)
def test_parse_versions(body: bytes, expected: list[str]) -> None:
    assert [str(v) for v in parse_versions(body, ADDR)] == expected


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b"{",
        b"<html>oops</html>",
        b"\xff\xfe\x00garbage",
        b"null",
        b"[]",
        b'"modules"',
        b"{}",
        b'{"modules": null}',
        b'{"modules": []}',
        b'{"modules": {}}',
        b'{"modules": "x"}',
        b'{"modules": ["x"]}',
        b'{"modules": [null]}',
    ],
)
def test_parse_versions_refuses(body: bytes) -> None:
    with pytest.raises(UpstreamMalformedError):
        parse_versions(body, ADDR)


@pytest.mark.parametrize(
    "versions",
    [3, True, 1.5, "1.0.0", {"version": "1.0.0"}],
)
def test_parse_versions_with_a_malformed_versions_field_fails_cleanly(versions: object) -> None:
    """A malformed `versions` value gives no versions or an UpstreamError, never another exception."""
    body = json.dumps({"modules": [{"versions": versions}]}).encode()
    try:
        result = parse_versions(body, ADDR)
    except UpstreamError:
        return
    assert result == []


# ---------------------------------------------------------------------------------------------
# parse_download
# ---------------------------------------------------------------------------------------------

HEADER = "https://archives.example.test/header.tar.gz"
BODY_LOCATION = "https://archives.example.test/body.tar.gz"


def location_body(location: object) -> bytes:
    return json.dumps({"location": location}).encode()


@pytest.mark.parametrize(
    ("status", "header", "body", "expected"),
    [
        (204, HEADER, b"", HEADER),
        (204, HEADER, location_body(BODY_LOCATION), HEADER),  # a 204 has no body to read
        (200, None, location_body(BODY_LOCATION), BODY_LOCATION),
        (200, HEADER, location_body(BODY_LOCATION), BODY_LOCATION),  # the body wins
        (200, HEADER, b"{}", HEADER),
        (200, HEADER, location_body(""), HEADER),
        (200, HEADER, location_body(None), HEADER),
        (200, HEADER, b"", HEADER),
        (200, HEADER, b"   \n", HEADER),
        (200, HEADER, b"not json at all", HEADER),
        (200, HEADER, b"<html></html>", HEADER),
        (200, HEADER, b"[1, 2]", HEADER),
        (200, HEADER, b'"just a string"', HEADER),
        (200, HEADER, b"\xff\xfe\xfd", HEADER),
        (
            200,
            None,
            location_body("git::https://git.example.test/r.git?ref=v1"),
            "git::https://git.example.test/r.git?ref=v1",
        ),
        (200, None, location_body("./archive.tar.gz"), "./archive.tar.gz"),
        (204, "  https://a.example/x.zip  ", b"", "https://a.example/x.zip"),
        (200, None, json.dumps({"location": BODY_LOCATION, "x": 1}).encode(), BODY_LOCATION),
        (204, "a" * MAX_LOCATION_LENGTH, b"", "a" * MAX_LOCATION_LENGTH),
    ],
)
def test_parse_download(status: int, header: str | None, body: bytes, expected: str) -> None:
    assert parse_download(status, header, body, ADDR) == expected


@pytest.mark.parametrize(
    ("status", "header", "body"),
    [
        (204, None, b""),
        (204, "", b""),
        (204, "   ", b""),
        (204, None, location_body(BODY_LOCATION)),  # a 204's body is not read
        (200, None, b""),
        (200, None, b"{}"),
        (200, None, location_body("")),
        (200, None, location_body(None)),
        (200, None, b"not json"),
        (200, None, location_body(42)),
        (200, None, location_body(["https://a.example/x.zip"])),
        # control characters
        (204, "https://a.example/x.zip\n", b""),
        (204, "https://a.example/x.zip\r\nX-Evil: 1", b""),
        (204, "https://a.example/\x00x.zip", b""),
        (204, "https://a.example/\tx.zip", b""),
        (200, None, location_body("https://a.example/x.zip\nrm -rf /")),
        (200, HEADER, location_body("https://a.example/\x1bx.zip")),
        # overlong
        (204, "https://a.example/" + "a" * MAX_LOCATION_LENGTH, b""),
        (200, None, location_body("https://a.example/" + "a" * MAX_LOCATION_LENGTH)),
    ],
)
def test_parse_download_refuses(status: int, header: str | None, body: bytes) -> None:
    with pytest.raises(UpstreamMalformedError):
        parse_download(status, header, body, ADDR)


# ---------------------------------------------------------------------------------------------
# resolve_relative
# ---------------------------------------------------------------------------------------------

DOWNLOAD = URL("https://r.example/v1/modules/a/b/c/1.0.0/download")


@pytest.mark.parametrize(
    ("location", "expected"),
    [
        ("/x", "https://r.example/x"),
        ("/archives/a/b/c/1.0.0.tar.gz", "https://r.example/archives/a/b/c/1.0.0.tar.gz"),
        ("./x", "https://r.example/v1/modules/a/b/c/1.0.0/x"),
        ("./archive.tar.gz?archive=tar.gz", "https://r.example/v1/modules/a/b/c/1.0.0/archive.tar.gz?archive=tar.gz"),
        ("../x", "https://r.example/v1/modules/a/b/c/x"),
        ("../../x.zip", "https://r.example/v1/modules/a/b/x.zip"),
        ("../../../../../../../x", "https://r.example/x"),
        # absolute and forced-getter locations are unchanged
        ("https://archives.example/x.zip", "https://archives.example/x.zip"),
        ("https://archives.example/x.zip//sub?a=1", "https://archives.example/x.zip//sub?a=1"),
        ("git::https://git.example/r.git?ref=v1", "git::https://git.example/r.git?ref=v1"),
        ("git::https://git.example/r.git//sub?ref=v1", "git::https://git.example/r.git//sub?ref=v1"),
        ("github.com/owner/repo", "github.com/owner/repo"),
        ("s3::https://s3.amazonaws.com/b/x.zip", "s3::https://s3.amazonaws.com/b/x.zip"),
        # a bare relative path is not resolved (the clients hand it to go-getter's detectors)
        ("archives/x.tgz", "archives/x.tgz"),
        ("x.zip", "x.zip"),
    ],
)
def test_resolve_relative(location: str, expected: str) -> None:
    assert resolve_relative(location, DOWNLOAD) == expected


def test_resolve_relative_against_a_download_url_with_a_port() -> None:
    download = URL("https://r.example:8443/v1/modules/a/b/c/1.0.0/download")
    assert resolve_relative("./x.zip", download) == "https://r.example:8443/v1/modules/a/b/c/1.0.0/x.zip"
    assert resolve_relative("/x.zip", download) == "https://r.example:8443/x.zip"
