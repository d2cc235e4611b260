"""The metadata key scheme: every kind builds the strings stores already hold and parses them back."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from proxy.domain.addresses import Hostname, ModuleAddr, Platform, ProviderAddr, Version
from proxy.metadata_store import keys

PROVIDER = ProviderAddr.parse("registry.example.test:8443", "acme", "foo")
MODULE = ModuleAddr.parse("registry.example.test", "acme", "net", "aws")
VERSION = Version.parse("1.2.3")
PLATFORM = Platform.parse("linux_amd64")


@dataclass
class Download:
    shasums_url: str = "https://releases.example.test/foo_1.2.3_SHA256SUMS"
    shasums_signature_url: str = "https://releases.example.test/foo_1.2.3_SHA256SUMS.sig"
    signing_keys: tuple[str, ...] = ("KEY-B", "KEY-A")


@pytest.mark.parametrize(
    ("built", "expected"),
    [
        (keys.discovery(Hostname.parse("registry.example.test:8443")), "discovery:registry.example.test:8443"),
        (keys.versions(PROVIDER), "versions:registry.example.test:8443/acme/foo"),
        (keys.download(PROVIDER, VERSION, PLATFORM), "download:registry.example.test:8443/acme/foo/1.2.3/linux_amd64"),
        (keys.archive(PROVIDER, VERSION, PLATFORM), "archive:registry.example.test:8443/acme/foo/1.2.3/linux_amd64"),
        (keys.module_versions(MODULE), "module-versions:registry.example.test/acme/net/aws"),
        (keys.module_download(MODULE, VERSION), "module-download:registry.example.test/acme/net/aws/1.2.3"),
        (keys.module(MODULE, VERSION), "module:registry.example.test/acme/net/aws/1.2.3"),
    ],
)
def test_keys_are_the_strings_existing_stores_hold(built: str, expected: str) -> None:
    assert built == expected


def test_sums_key_is_the_digest_of_urls_and_sorted_signing_keys() -> None:
    import hashlib

    source = "\n".join([Download.shasums_url, Download.shasums_signature_url, "KEY-A", "KEY-B"])
    assert keys.sums(Download()) == "sums:" + hashlib.sha256(source.encode()).hexdigest()
    assert keys.sums(Download(signing_keys=("KEY-A", "KEY-B"))) == keys.sums(Download())
    assert keys.sums(Download(signing_keys=("KEY-C",))) != keys.sums(Download())


@pytest.mark.parametrize("pattern", keys.STORED_KINDS, ids=lambda p: p.kind)
def test_every_stored_kind_round_trips(pattern: keys.KeyPattern) -> None:
    parts = {name: f"{name}-part" for name in pattern.fields}
    key = pattern.key(**parts)
    assert pattern.parse(key) == parts
    assert keys.kind_of(key) is pattern
    assert pattern.key_for({**parts, "unrelated": "x"}) == key


@pytest.mark.parametrize("pattern", keys.STORED_KINDS, ids=lambda p: p.kind)
def test_a_kind_rejects_every_other_kinds_keys(pattern: keys.KeyPattern) -> None:
    for other in keys.STORED_KINDS:
        if other is not pattern:
            assert pattern.parse(other.key(**{name: "x" for name in other.fields})) is None


@pytest.mark.parametrize(
    "key",
    [
        "",
        "archive",
        "archive:",
        "archive:a/b/c/d",
        "archive:a/b/c/d/e/f",
        "archive:a//c/d/e",
        "archive:a/b/c/d/",
        "Archive:a/b/c/d/e",
        "xarchive:a/b/c/d/e",
        "module-versions:a/b/c/d/e",
        "lock:archive:a/b/c/d/e",
    ],
)
def test_foreign_and_malformed_keys_do_not_parse_as_archive_keys(key: str) -> None:
    assert keys.ARCHIVE.parse(key) is None


def test_module_and_module_versions_prefixes_are_not_confused() -> None:
    assert keys.MODULE.parse("module-versions:a/b/c/d") is None
    assert keys.MODULE_VERSIONS.parse("module:a/b/c/d/1.0.0") is None
    assert keys.kind_of("module-download:a/b/c/d/1.0.0") is keys.MODULE_DOWNLOAD


@pytest.mark.parametrize("hostile", ["a/b", "", "../x", "/"])
def test_a_part_with_a_slash_or_empty_cannot_make_a_key(hostile: str) -> None:
    with pytest.raises(ValueError):
        keys.ARCHIVE.key(host="h", namespace=hostile, type="t", version="1.0.0", platform="linux_amd64")


def test_a_colon_in_a_part_stays_in_the_part() -> None:
    key = keys.DISCOVERY.key(host="host:8443")
    assert key == "discovery:host:8443"
    assert keys.DISCOVERY.parse(key) == {"host": "host:8443"}
    assert keys.VERSIONS.parse("versions:h:1/a:b/c") == {"host": "h:1", "namespace": "a:b", "type": "c"}


def test_missing_or_extra_parts_are_refused() -> None:
    with pytest.raises(ValueError):
        keys.VERSIONS.key(host="h", namespace="n")
    with pytest.raises(ValueError):
        keys.VERSIONS.key(host="h", namespace="n", type="t", version="1")


def test_subject_is_the_key_without_its_kind() -> None:
    assert keys.MODULE.subject("module:h/n/m/s/1.0.0") == "h/n/m/s/1.0.0"


@pytest.mark.parametrize("wrapper", [keys.DOCUMENT_FLIGHT, keys.FLEET_LOCK, keys.NEGATIVE], ids=lambda w: w.kind)
def test_wrapped_keys_round_trip_and_reject_others(wrapper: keys.WrappedKey) -> None:
    inner = "download:h/n/t/1.0.0/linux_amd64"
    assert wrapper.key(inner) == f"{wrapper.kind}:{inner}"
    assert wrapper.parse(wrapper.key(inner)) == inner
    assert wrapper.parse(inner) is None
    assert wrapper.parse(wrapper.prefix) is None


def test_non_metadata_keys_have_no_stored_kind() -> None:
    for key in (keys.FLEET_LOCK.key("archive:a/b/c/d/e"), keys.NEGATIVE.key("versions:a/b/c"), "negatives", "x"):
        assert keys.kind_of(key) is None
