"""Unit tests for proxy.domain.addresses: hostnames, provider parts, versions and platforms."""

from __future__ import annotations

import random

import pytest

from proxy.domain.addresses import (
    MAX_HOSTNAME_LENGTH,
    MAX_PART_LENGTH,
    AddressError,
    Hostname,
    Platform,
    ProviderAddr,
    Version,
)
from proxy.errors import ProxyError

# ---------------------------------------------------------------------------------------------
# Hostname.parse
# ---------------------------------------------------------------------------------------------

# "münchen" in punycode is "xn--mnchen-3ya" (RFC 3492 encoding, as produced by any IDNA tool).
MUENCHEN_ASCII = "xn--mnchen-3ya.de"


@pytest.mark.parametrize(
    ("given", "ascii_name", "port"),
    [
        ("registry.opentofu.org", "registry.opentofu.org", None),
        ("Registry.OpenTofu.ORG", "registry.opentofu.org", None),
        ("REGISTRY.TERRAFORM.IO", "registry.terraform.io", None),
        ("münchen.de", MUENCHEN_ASCII, None),
        ("MÜNCHEN.de", MUENCHEN_ASCII, None),
        ("xn--mnchen-3ya.de", MUENCHEN_ASCII, None),
        ("XN--MNCHEN-3YA.DE", MUENCHEN_ASCII, None),
        ("Xn--Mnchen-3ya.De", MUENCHEN_ASCII, None),
        ("example.com:443", "example.com", None),
        ("Example.COM:443", "example.com", None),
        ("example.com:8443", "example.com", 8443),
        ("example.com:80", "example.com", 80),
        ("example.com:1", "example.com", 1),
        ("example.com:65535", "example.com", 65535),
        ("münchen.de:8443", MUENCHEN_ASCII, 8443),
        ("localhost", "localhost", None),
        ("a-b.example", "a-b.example", None),
        ("127.0.0.1:8443", "127.0.0.1", 8443),
    ],
)
def test_hostname_parse_normalises(given: str, ascii_name: str, port: int | None) -> None:
    parsed = Hostname.parse(given)
    assert parsed.ascii == ascii_name
    assert parsed.port == port
    assert parsed == Hostname(ascii_name, port)


def test_hostname_unicode_and_punycode_spellings_are_equal() -> None:
    assert Hostname.parse("münchen.de") == Hostname.parse("xn--mnchen-3ya.de") == Hostname.parse("MÜNCHEN.DE")
    assert hash(Hostname.parse("münchen.de")) == hash(Hostname.parse("XN--MNCHEN-3YA.de"))


@pytest.mark.parametrize(
    ("given", "text"),
    [
        ("registry.opentofu.org", "registry.opentofu.org"),
        ("Example.com:443", "example.com"),
        ("example.com:8443", "example.com:8443"),
        ("münchen.de:8080", "xn--mnchen-3ya.de:8080"),
    ],
)
def test_hostname_str(given: str, text: str) -> None:
    assert str(Hostname.parse(given)) == text


@pytest.mark.parametrize(
    ("given", "display"),
    [
        ("registry.opentofu.org", "registry.opentofu.org"),
        ("xn--mnchen-3ya.de", "münchen.de"),
        ("MÜNCHEN.de", "münchen.de"),
        ("xn--mnchen-3ya.de:8443", "münchen.de:8443"),
        ("example.com:443", "example.com"),
    ],
)
def test_hostname_display_is_unicode(given: str, display: str) -> None:
    assert Hostname.parse(given).display == display


def test_hostname_parse_roundtrips_through_str() -> None:
    for given in ("münchen.de:8443", "example.com", "EXAMPLE.com:443", "xn--mnchen-3ya.de"):
        parsed = Hostname.parse(given)
        assert Hostname.parse(str(parsed)) == parsed
        assert Hostname.parse(parsed.display) == parsed


def _long_name(length: int) -> str:
    """A syntactically valid hostname of exactly `length` characters (labels of at most 51)."""
    name = ("a" * 50 + ".") * (length // 51 + 1)
    name = name[:length]
    if name.endswith("."):
        name = name[:-2] + "bb"
    return name


def test_long_name_helper_builds_exact_lengths() -> None:
    for length in (1, 63, 64, 65, 200, 253, 254, 300):
        assert len(_long_name(length)) == length


def test_hostname_at_max_length_is_accepted() -> None:
    name = _long_name(MAX_HOSTNAME_LENGTH)
    assert Hostname.parse(name).ascii == name
    assert Hostname.parse(name + ":8443") == Hostname(name, 8443)


@pytest.mark.parametrize("length", [MAX_HOSTNAME_LENGTH + 1, MAX_HOSTNAME_LENGTH + 6, MAX_HOSTNAME_LENGTH + 7, 1000])
def test_hostname_overlong_is_rejected(length: int) -> None:
    with pytest.raises(AddressError):
        Hostname.parse(_long_name(length))


def test_hostname_overlong_after_punycode_is_rejected() -> None:
    # "bücher" (6 characters) encodes to "xn--bcher-kva" (13): 30 labels are 209 characters as given
    # but 419 once encoded, past the 253 limit.
    name = ".".join(["bücher"] * 30)
    assert len(name) <= MAX_HOSTNAME_LENGTH
    with pytest.raises(AddressError):
        Hostname.parse(name)


@pytest.mark.parametrize(
    "given",
    [
        "",
        ":443",
        ":8443",
        "example.com.",
        "example.com.:8443",
        ".example.com",
        "a..b",
        "example..com",
        "example.com/evil",
        "a/b",
        "/",
        "..",
        ".",
        "a%2fb",
        "a%2Fb",
        "example.com%2f..%2fetc",
        "exa mple.com",
        " example.com",
        "example.com ",
        "exam\tple.com",
        "exam\nple.com",
        "example.com\x00",
        "☃",
        "☃.com",
        "\U0001f600.example",
        "-example.com",
        "example-.com",
        "exa_mple.com",
        "user@example.com",
        "xn--abc",
        "a" * 64 + ".com",  # label longer than 63
        "[::1]:8443",
    ],
)
def test_hostname_parse_rejects_invalid_names(given: str) -> None:
    with pytest.raises(AddressError):
        Hostname.parse(given)


@pytest.mark.parametrize(
    "given",
    [
        "example.com:",
        "example.com:0",
        "example.com:65536",
        "example.com:99999",
        "example.com:123456",
        "example.com:abc",
        "example.com:-1",
        "example.com:+443",
        "example.com: 443",
        "example.com:443 ",
        "example.com:4 43",
        "example.com:१२३",  # non-ASCII digits
        "example.com:8443\n",  # `$` must not let a trailing newline through
        "example.com:8443:8443",
    ],
)
def test_hostname_parse_rejects_bad_ports(given: str) -> None:
    with pytest.raises(AddressError):
        Hostname.parse(given)


def test_address_error_is_neutral() -> None:
    """Pure code: a neutral ValueError with the message; only the web layer makes it a 400."""
    with pytest.raises(AddressError) as info:
        Hostname.parse("bad..name")
    assert isinstance(info.value, ValueError)
    assert not isinstance(info.value, ProxyError)
    assert "bad..name" in str(info.value)


# ---------------------------------------------------------------------------------------------
# parse_provider_part via ProviderAddr.parse
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "normalised"),
    [
        ("hashicorp", "hashicorp"),
        ("aws", "aws"),
        ("HashiCorp", "hashicorp"),
        ("AWS", "aws"),
        ("a", "a"),
        ("0", "0"),
        ("9a", "9a"),
        ("google-beta", "google-beta"),
        ("a-b-c", "a-b-c"),
        ("Terraform-Provider-X", "terraform-provider-x"),
        ("x" * MAX_PART_LENGTH, "x" * MAX_PART_LENGTH),
        ("ünïcode", "ünïcode"),
        ("ÜNÏCODE", "ünïcode"),
        ("café-42", "café-42"),
        ("провайдер", "провайдер"),
    ],
)
def test_provider_part_valid(given: str, normalised: str) -> None:
    addr = ProviderAddr.parse("registry.opentofu.org", given, given)
    assert addr.namespace == normalised
    assert addr.type == normalised


def test_provider_addr_parse_and_str() -> None:
    addr = ProviderAddr.parse("Registry.OpenTofu.org:443", "HashiCorp", "AWS")
    assert addr == ProviderAddr(Hostname("registry.opentofu.org"), "hashicorp", "aws")
    assert str(addr) == "registry.opentofu.org/hashicorp/aws"
    assert str(ProviderAddr.parse("example.com:8443", "ns", "t")) == "example.com:8443/ns/t"


def test_provider_addr_rejects_bad_hostname() -> None:
    with pytest.raises(AddressError):
        ProviderAddr.parse("bad..host", "hashicorp", "aws")


INVALID_PARTS = [
    "",
    "-aws",
    "aws-",
    "-",
    "--",
    "a--b",
    "aws--provider",
    "xn--80ak6aa92e",  # punycode prefix, excluded by the `--` rule
    "a..b",
    "..",
    ".",
    "a.b",
    "a%2fb",
    "%2f",
    "%2e%2e",
    "a/b",
    "/",
    "a b",
    " aws",
    "aws ",
    "a_b",
    "a+b",
    "a:b",
    "a\\b",
    "aws\n",  # `$` in a regex must not accept a trailing newline
    "aws\x00",
    "x" * (MAX_PART_LENGTH + 1),
    "x" * 1000,
    "☃",
    "ünï code",
    "-ünï",
    "ünï-",
    "ünï--x",  # consecutive dashes are refused for non-ASCII names as for ASCII ones
    "ünï/x",
    "ünï.x",
]


@pytest.mark.parametrize("given", INVALID_PARTS)
def test_provider_namespace_invalid(given: str) -> None:
    with pytest.raises(AddressError):
        ProviderAddr.parse("registry.opentofu.org", given, "aws")


@pytest.mark.parametrize("given", INVALID_PARTS)
def test_provider_type_invalid(given: str) -> None:
    with pytest.raises(AddressError):
        ProviderAddr.parse("registry.opentofu.org", "hashicorp", given)


def test_provider_part_error_names_what() -> None:
    with pytest.raises(AddressError, match="namespace"):
        ProviderAddr.parse("registry.opentofu.org", "-bad", "aws")
    with pytest.raises(AddressError, match="type"):
        ProviderAddr.parse("registry.opentofu.org", "hashicorp", "-bad")


# ---------------------------------------------------------------------------------------------
# Version
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "fields", "canonical"),
    [
        ("0.0.0", (0, 0, 0, "", ""), "0.0.0"),
        ("1.2.3", (1, 2, 3, "", ""), "1.2.3"),
        ("v1.2.3", (1, 2, 3, "", ""), "1.2.3"),
        ("10.20.30", (10, 20, 30, "", ""), "10.20.30"),
        ("1.0.0-alpha", (1, 0, 0, "alpha", ""), "1.0.0-alpha"),
        ("1.0.0-alpha.1", (1, 0, 0, "alpha.1", ""), "1.0.0-alpha.1"),
        ("1.0.0-0.3.7", (1, 0, 0, "0.3.7", ""), "1.0.0-0.3.7"),
        ("1.0.0-x.7.z.92", (1, 0, 0, "x.7.z.92", ""), "1.0.0-x.7.z.92"),
        ("1.0.0-x-y-z.--", (1, 0, 0, "x-y-z.--", ""), "1.0.0-x-y-z.--"),
        ("1.0.0+20130313144700", (1, 0, 0, "", "20130313144700"), "1.0.0+20130313144700"),
        ("1.0.0-beta+exp.sha.5114f85", (1, 0, 0, "beta", "exp.sha.5114f85"), "1.0.0-beta+exp.sha.5114f85"),
        ("v5.31.0-rc1+build.7", (5, 31, 0, "rc1", "build.7"), "5.31.0-rc1+build.7"),
        ("1.0.0+21AF26D3----117B344092BD", (1, 0, 0, "", "21AF26D3----117B344092BD"), "1.0.0+21AF26D3----117B344092BD"),
        ("999999999.0.1", (999999999, 0, 1, "", ""), "999999999.0.1"),
    ],
)
def test_version_parse(given: str, fields: tuple, canonical: str) -> None:
    version = Version.parse(given)
    assert (version.major, version.minor, version.patch, version.prerelease, version.build) == fields
    assert str(version) == canonical
    assert Version.parse(str(version)) == version


@pytest.mark.parametrize(
    "given",
    [
        "",
        "1",
        "1.0",
        "1.0.0.0",
        "01.0.0",
        "1.01.0",
        "1.0.01",
        "00.0.0",
        "1.0.0-",
        "1.0.0+",
        "1.0.0-+",
        "1.0.0-alpha..1",
        "1.0.0-alpha.",
        "1.0.0-.alpha",
        "1.0.0+build..1",
        "1.0.0-alpha_1",
        "1.0.0-\u03b1",
        "V1.0.0",
        "vv1.0.0",
        "=1.0.0",
        " 1.0.0",
        "1.0.0 ",
        "1.0.0\n",  # `$` in a regex must not accept a trailing newline
        "1.0.0/../x",
        "a.b.c",
        "-1.0.0",
        "1.-1.0",
        "1.0.x",
        "latest",
        "1.0.0-" + "a" * 200,
    ],
)
def test_version_parse_rejects(given: str) -> None:
    with pytest.raises(AddressError):
        Version.parse(given)


def test_version_length_limit() -> None:
    # 128 characters is the documented limit; one more is refused even if otherwise well-formed.
    base = "1.0.0-"
    ok = base + "a" * (128 - len(base))
    assert len(ok) == 128
    assert str(Version.parse(ok)) == ok
    with pytest.raises(AddressError):
        Version.parse(ok + "a")


# The precedence example from semver.org §11, plus more.
SEMVER_ORDER = [
    "0.0.1",
    "0.1.0",
    "0.9.0",
    "0.10.0",
    "1.0.0-0",
    "1.0.0-1",
    "1.0.0-2",
    "1.0.0-10",
    "1.0.0-alpha",
    "1.0.0-alpha.1",
    "1.0.0-alpha.beta",
    "1.0.0-beta",
    "1.0.0-beta.2",
    "1.0.0-beta.11",
    "1.0.0-rc.1",
    "1.0.0",
    "1.0.1",
    "1.1.0-alpha",
    "1.1.0",
    "1.2.0",
    "1.10.0",
    "2.0.0",
    "10.0.0",
]


def test_semver_precedence_pairwise() -> None:
    versions = [Version.parse(v) for v in SEMVER_ORDER]
    for i, lower in enumerate(versions):
        for higher in versions[i + 1 :]:
            assert lower < higher, (str(lower), str(higher))
            assert higher > lower
            assert lower <= higher
            assert not higher < lower
            assert lower != higher


def test_semver_sort_from_shuffled() -> None:
    versions = [Version.parse(v) for v in SEMVER_ORDER]
    shuffled = versions[:]
    random.Random(1234).shuffle(shuffled)
    assert shuffled != versions
    assert [str(v) for v in sorted(shuffled)] == SEMVER_ORDER
    assert str(max(shuffled)) == "10.0.0"


@pytest.mark.parametrize(
    ("lower", "higher"),
    [
        ("1.0.0-alpha", "1.0.0-alpha.1"),
        ("1.0.0-alpha.1", "1.0.0-alpha.beta"),
        ("1.0.0-alpha.beta", "1.0.0-beta"),
        ("1.0.0-beta", "1.0.0-beta.2"),
        ("1.0.0-beta.2", "1.0.0-beta.11"),  # numeric, not lexical: 2 < 11
        ("1.0.0-beta.11", "1.0.0-rc.1"),
        ("1.0.0-rc.1", "1.0.0"),
        ("1.0.0-999", "1.0.0-a"),  # numeric identifiers sort before alphanumeric ones
        ("1.0.0-a.999", "1.0.0-a.a"),
        ("1.0.0-A", "1.0.0-a"),  # ASCII order
        ("1.0.0-rc.9", "1.0.0-rc.10"),
        ("1.9.0", "1.10.0"),
        ("1.0.0", "1.0.1-alpha"),
        ("v0.9.9", "1.0.0-0"),
    ],
)
def test_semver_precedence_pairs(lower: str, higher: str) -> None:
    assert Version.parse(lower) < Version.parse(higher)
    assert not Version.parse(higher) < Version.parse(lower)
    assert Version.parse(higher) >= Version.parse(lower)


def test_version_v_prefix_equal() -> None:
    assert Version.parse("v1.2.3") == Version.parse("1.2.3")
    assert Version.parse("v1.2.3-rc.1") == Version.parse("1.2.3-rc.1")


def test_build_metadata_does_not_affect_precedence() -> None:
    plain, built = Version.parse("1.0.0"), Version.parse("1.0.0+build.5")
    assert not plain < built
    assert not built < plain
    assert Version.parse("1.0.0-rc.1+b") < plain


def test_version_compare_with_other_types() -> None:
    with pytest.raises(TypeError):
        _ = Version.parse("1.0.0") < "2.0.0"  # type: ignore[operator]
    assert Version.parse("1.0.0") != "1.0.0"


# ---------------------------------------------------------------------------------------------
# Platform
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "os_", "arch"),
    [
        ("linux_amd64", "linux", "amd64"),
        ("darwin_arm64", "darwin", "arm64"),
        ("windows_386", "windows", "386"),
        ("freebsd_arm", "freebsd", "arm"),
        ("openbsd_amd64", "openbsd", "amd64"),
        ("solaris_amd64", "solaris", "amd64"),
        ("a_b", "a", "b"),
    ],
)
def test_platform_parse(given: str, os_: str, arch: str) -> None:
    platform = Platform.parse(given)
    assert (platform.os, platform.arch) == (os_, arch)
    assert str(platform) == given
    assert Platform.of(os_, arch) == platform


@pytest.mark.parametrize(
    "given",
    [
        "",
        "_",
        "linux",
        "linux_",
        "_amd64",
        "linux-amd64",
        "linux_amd64_v2",
        "Linux_amd64",
        "linux_AMD64",
        "linux_amd64\n",  # `$` in a regex must not accept a trailing newline
        "linux_amd 64",
        "linux_amd64/..",
        "linux_%2f",
        "../linux_amd64",
        "lïnux_amd64",
        "x" * 33 + "_amd64",
        "linux_" + "x" * 33,
    ],
)
def test_platform_parse_rejects(given: str) -> None:
    with pytest.raises(AddressError):
        Platform.parse(given)


def test_platform_of_rejects_bad_parts() -> None:
    with pytest.raises(AddressError):
        Platform.of("linux", "amd64_v2")
    with pytest.raises(AddressError):
        Platform.of("", "amd64")
