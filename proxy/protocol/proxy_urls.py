"""The proxy's own URLs for what it serves, and rewriting of upstream documents to point at them. Pure.

All URLs are root-relative paths: the clients resolve them against the URL of the answer
that carried them (the proxy), so they work whatever scheme, host name or port clients use, also
behind a load balancer (no forwarded header enters a document). Under a path prefix the balancer
strips (`--public-url https://lb.example.com/tf/`), `under` puts the prefix in front of them.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from proxy.domain.addresses import Hostname, ModuleAddr, Platform, ProviderAddr, Version


def _seg(text: str) -> str:
    return quote(text, safe="")


def under(prefix: str, url: str) -> str:
    """A root-relative `url` as clients reach it under the public path `prefix` (`/`, or `/tf/`); any other
    URL (relative, absolute, a go-getter source) unchanged."""
    if prefix == "/" or not url.startswith("/") or url.startswith("//"):
        return url
    return prefix.rstrip("/") + url


def archive_filename(addr: ProviderAddr, version: Version, platform: Platform) -> str:
    return f"terraform-provider-{addr.type}_{version}_{platform}.zip"


def mirror_archive_path(addr: ProviderAddr, version: Version, platform: Platform) -> str:
    """Where the network mirror serves an archive (the registry pass-through serves the same one)."""
    return (
        f"/mirror/v1/{_seg(str(addr.hostname))}/{_seg(addr.namespace)}/{_seg(addr.type)}/{version}/{platform}/"
        f"{_seg(archive_filename(addr, version, platform))}"
    )


def registry_base(hostname: Hostname, service: str) -> str:
    """`/registry/HOST/providers/v1/` or `/registry/HOST/modules/v1/`."""
    return f"/registry/{_seg(str(hostname))}/{service}/v1/"


def registry_download_path(addr: ProviderAddr, version: Version, platform: Platform) -> str:
    return (
        registry_base(addr.hostname, "providers")
        + f"{_seg(addr.namespace)}/{_seg(addr.type)}/{version}/download/{platform.os}/{platform.arch}"
    )


def rewrite_download_document(
    document: dict[str, Any], addr: ProviderAddr, version: Version, platform: Platform
) -> dict[str, Any]:
    """The upstream download metadata with its three URLs pointing at the proxy; all else unchanged."""
    base = registry_download_path(addr, version, platform)
    return {
        **document,
        "download_url": mirror_archive_path(addr, version, platform),
        "shasums_url": f"{base}/SHA256SUMS",
        "shasums_signature_url": f"{base}/SHA256SUMS.sig",
    }


def module_archive_path(addr: ModuleAddr, version: Version, extension: str) -> str:
    return (
        registry_base(addr.hostname, "modules")
        + f"{_seg(addr.namespace)}/{_seg(addr.name)}/{_seg(addr.system)}/{version}/archive{extension}"
    )
