"""The module registry protocol (`modules.v1`): URLs and validated answers. Pure.

The download answer carries the source location either in the `X-Terraform-Get` header
(Terraform reads only this) or in a JSON body `{"location": ...}` (OpenTofu prefers it).
Relative locations (`/`, `./`, `../`) are resolved against the download request URL.
See docs/protocol.md#module-registry-protocol.
"""

from __future__ import annotations

from typing import Any

from yarl import URL

from proxy.domain.addresses import AddressError, ModuleAddr, Version
from proxy.errors import UpstreamMalformedError
from proxy.protocol.safe_json import JSONDocumentError, loads

MAX_LOCATION_LENGTH = 4096


def base_with_slash(base: URL) -> URL:
    """The clients append a `/` to the modules.v1 base URL when it lacks one."""
    return base if base.path.endswith("/") else base.with_path(base.path + "/")


def versions_url(base: URL, addr: ModuleAddr) -> URL:
    return base_with_slash(base).join(URL(f"{addr.namespace}/{addr.name}/{addr.system}/versions"))


def download_url(base: URL, addr: ModuleAddr, version: Version) -> URL:
    return base_with_slash(base).join(URL(f"{addr.namespace}/{addr.name}/{addr.system}/{version}/download"))


def parse_versions(body: bytes, addr: ModuleAddr) -> list[Version]:
    """`{"modules": [{"versions": [{"version": "1.0.0"}, ...]}]}` → versions (unparseable ones skipped)."""
    try:
        document = loads(body)
    except JSONDocumentError as exc:
        raise UpstreamMalformedError(f"upstream version list of module {addr} {exc}") from None
    modules = document.get("modules") if isinstance(document, dict) else None
    if not isinstance(modules, list) or not modules or not isinstance(modules[0], dict):
        raise UpstreamMalformedError(f"upstream version list of module {addr} has no 'modules' entry")
    entries = modules[0].get("versions") or []
    if not isinstance(entries, list):
        raise UpstreamMalformedError(f"upstream version list of module {addr} has no 'versions' array")
    versions = []
    for entry in entries:
        if isinstance(entry, dict) and isinstance(entry.get("version"), str):
            try:
                versions.append(Version.parse(entry["version"]))
            except AddressError:
                continue
    return versions


def parse_download(status: int, header: str | None, body: bytes, addr: ModuleAddr) -> str:
    """The source location of a download answer (200 with JSON and/or header, or 204 with header)."""
    location: Any = None
    unreadable = ""  # why a JSON body gave no location (the header may still give one)
    if status == 200 and body.strip():
        try:
            document = loads(body)
        except JSONDocumentError as exc:
            document, unreadable = None, f" (its JSON body {exc})"
        if isinstance(document, dict):
            location = document.get("location")
    if not location:
        location = header
    if not isinstance(location, str) or not location.strip():
        raise UpstreamMalformedError(f"upstream download answer for module {addr} has no location{unreadable}")
    if len(location) > MAX_LOCATION_LENGTH or any(ord(ch) < 32 for ch in location):
        raise UpstreamMalformedError(f"upstream download location for module {addr} is malformed")
    return location.strip()


def resolve_relative(location: str, download: URL) -> str:
    """Resolve `/…`, `./…`, `../…` against the download request URL, as the clients do."""
    if location.startswith(("/", "./", "../")):
        return str(download.join(URL(location)))
    return location
