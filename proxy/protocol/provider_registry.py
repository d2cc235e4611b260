"""The provider registry protocol (`providers.v1`): URLs and typed, validated answers.

Pure: builds request URLs from a discovered base URL and parses the upstream's JSON
into records, resolving download URLs against the final URL of the answer.
See docs/protocol.md#provider-registry-protocol.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from yarl import URL

from proxy.domain.addresses import AddressError, Platform, ProviderAddr, Version
from proxy.domain.hashes import Hash
from proxy.errors import UpstreamMalformedError
from proxy.protocol.safe_json import JSONDocumentError, loads

USUAL_PATH = "/v1/providers/"  # where registry.terraform.io (and most registries) serve providers.v1
_HEX64 = re.compile(r"^[0-9a-fA-F]{64}\Z")
_FILENAME = re.compile(r"^[A-Za-z0-9._+-]{1,255}\Z")


@dataclass(frozen=True)
class VersionInfo:
    protocols: tuple[str, ...]
    platforms: tuple[Platform, ...]


@dataclass(frozen=True)
class DownloadInfo:
    """Download metadata for one provider version and platform."""

    platform: Platform
    filename: str
    shasum: Hash  # the registry's `shasum`: the archive's `zh:` hash
    download_url: URL
    shasums_url: URL
    shasums_signature_url: URL
    signing_keys: tuple[str, ...]
    protocols: tuple[str, ...] = ()
    raw: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    document_url: URL | None = field(default=None, compare=False, hash=False)  # where this answer came from

    @property
    def unsigned(self) -> bool:
        """The registry lists no signing keys (empty or missing `signing_keys.gpg_public_keys`)."""
        return not self.signing_keys


def versions_url(base: URL, addr: ProviderAddr) -> URL:
    return base.join(URL(f"{addr.namespace}/{addr.type}/versions"))


def download_url(base: URL, addr: ProviderAddr, version: Version, platform: Platform) -> URL:
    return base.join(URL(f"{addr.namespace}/{addr.type}/{version}/download/{platform.os}/{platform.arch}"))


def _json_object(body: bytes, what: str) -> dict[str, Any]:
    try:
        document = loads(body)
    except JSONDocumentError as exc:
        raise UpstreamMalformedError(f"upstream {what} {exc}") from None
    if not isinstance(document, dict):
        raise UpstreamMalformedError(f"upstream {what} is not a JSON object")
    return document


def parse_versions(body: bytes, addr: ProviderAddr) -> dict[Version, VersionInfo]:
    """`{"versions": [{"version", "protocols", "platforms": [{"os", "arch"}]}]}` → records.

    Entries with an unparseable version or platform are skipped, as the clients skip them.
    """
    document = _json_object(body, f"version list of {addr}")
    entries = document.get("versions")
    if not isinstance(entries, list):
        raise UpstreamMalformedError(f"upstream version list of {addr} has no 'versions' array")
    result: dict[Version, VersionInfo] = {}
    known: dict[tuple[str, str], Platform | None] = {}  # each platform parsed once per list (lists repeat them)
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("version"), str):
            continue
        try:
            version = Version.parse(entry["version"])
        except AddressError:
            continue
        platforms = []
        for item in entry.get("platforms") or []:
            if isinstance(item, dict) and isinstance(item.get("os"), str) and isinstance(item.get("arch"), str):
                pair = (item["os"], item["arch"])
                if pair not in known:
                    known[pair] = _platform(*pair)
                if known[pair] is not None:
                    platforms.append(known[pair])
        protocols = tuple(p for p in entry.get("protocols") or [] if isinstance(p, str))
        result[version] = VersionInfo(protocols, tuple(dict.fromkeys(platforms)))
    return result


def _platform(os_: str, arch: str) -> Platform | None:
    """The platform, or None if it does not parse (skipped, as the clients skip it)."""
    try:
        return Platform.of(os_, arch)
    except AddressError:
        return None


def _signing_keys(keys_doc: Any, what: str) -> tuple[str, ...]:
    """The ASCII-armoured keys of `signing_keys`; () when it lists none (no field, null, no or an empty
    `gpg_public_keys`: what OpenTofu treats as a registry without keys). Keys that are there but unusable
    (not an object with a string `ascii_armor`) are no unsigned provider: refused."""
    keys_list = keys_doc.get("gpg_public_keys") if isinstance(keys_doc, dict) else keys_doc
    if keys_doc is None or (isinstance(keys_doc, dict) and keys_list in (None, [])):
        return ()
    keys = (
        tuple(k["ascii_armor"] for k in keys_list if isinstance(k, dict) and isinstance(k.get("ascii_armor"), str))
        if isinstance(keys_doc, dict) and isinstance(keys_list, list)
        else ()
    )
    if not keys:
        raise UpstreamMalformedError(f"upstream {what} lists no usable signing keys: the archive cannot be verified")
    return keys


def parse_download(
    body: bytes, final_url: URL, addr: ProviderAddr, version: Version, platform: Platform
) -> DownloadInfo:
    """Validate download metadata; URLs are resolved against `final_url` and must be http(s).

    An answer without signing keys parses (`DownloadInfo.unsigned`): whether it may be used is the
    `--unsigned-providers` policy's decision (`proxy.domain.unsigned_policy`), made by the provider service.
    """
    what = f"download metadata of {addr} {version} {platform}"
    document = _json_object(body, what)
    if document.get("os") != platform.os or document.get("arch") != platform.arch:
        raise UpstreamMalformedError(f"upstream {what} is for another platform")
    filename, shasum = document.get("filename"), document.get("shasum")
    if not isinstance(filename, str) or not _FILENAME.match(filename) or filename in (".", ".."):
        raise UpstreamMalformedError(f"upstream {what} has an invalid filename")
    if not isinstance(shasum, str) or not _HEX64.match(shasum):
        raise UpstreamMalformedError(f"upstream {what} has an invalid shasum")
    urls = {}
    for name in ("download_url", "shasums_url", "shasums_signature_url"):
        value = document.get(name)
        if not isinstance(value, str) or not value:
            raise UpstreamMalformedError(f"upstream {what} lacks {name}")
        try:
            url = final_url.join(URL(value))
        except ValueError:
            raise UpstreamMalformedError(f"upstream {what} has an invalid {name}") from None
        if url.scheme not in ("http", "https") or not url.host:
            raise UpstreamMalformedError(f"upstream {what}: {name} must be an http(s) URL")
        urls[name] = url
    keys = _signing_keys(document.get("signing_keys"), what)
    protocols = tuple(p for p in document.get("protocols") or [] if isinstance(p, str))
    return DownloadInfo(
        platform,
        filename,
        Hash.zh(shasum.lower()),
        urls["download_url"],
        urls["shasums_url"],
        urls["shasums_signature_url"],
        keys,
        protocols,
        document,
        final_url,
    )
