"""A provider's metadata from its registry: version lists, what a version offers, download documents.

Everything comes through the document cache (`proxy.services.documents`: freshness, stale-if-error,
remembered 404s, one parse per stored value). A provider's version list is also kept in this
process's memory while it and the discovery document it was found through are fresh (the
fresh-until shortcut: a warm hit reads no store). Versions and platforms named in requests are
checked against the cached list before any per-version upstream request (`proxy.protocol.offers`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import structlog
from yarl import URL

from proxy.domain.addresses import Platform, ProviderAddr, Version
from proxy.errors import (
    OfflineMissError,
    PackageNotFoundError,
    ProviderNotFoundError,
    UpstreamError,
    VersionNotFoundError,
)
from proxy.metadata_store import CacheEntry, keys
from proxy.protocol import provider_registry
from proxy.protocol.offers import RecheckGate, list_ttl, listed, missing_platforms, no_package_message
from proxy.protocol.provider_registry import DownloadInfo, VersionInfo
from proxy.runtime.memo import Memo
from proxy.services.documents import DocumentCache
from proxy.services.freshness import note_fresh_for
from proxy.settings.config import Settings

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class _FreshVersions:
    """A provider's parsed version list, fresh from `since` until `until` (`DocumentCache.clock` times)."""

    since: float
    until: float
    versions: dict[Version, VersionInfo]


class ProviderMetadata:
    """Version lists and download documents of providers, as their registries answer them."""

    def __init__(self, settings: Settings, documents: DocumentCache) -> None:
        self._settings = settings
        self._documents = documents
        self._rechecks = RecheckGate(settings.freshness.negative)
        self._fresh_versions: Memo[ProviderAddr, _FreshVersions] = Memo()

    async def versions(self, addr: ProviderAddr, max_age: float | None = None) -> dict[Version, VersionInfo]:
        """The upstream's version list for a provider (cached for the versions TTL, or `max_age` if shorter).

        While the list and the discovery document it was found through are fresh, the list is answered
        from this process's memory without reading the store (the fresh-until shortcut); once either is
        stale, the document cache is asked again, which revalidates them with the upstream.
        """
        known = self._fresh_versions.get(addr)
        if known is not None and max_age is None and known.since <= self._documents.clock() < known.until:
            self._documents.count_hit()
            note_fresh_for(known.until - self._documents.clock())
            return known.versions
        self._documents.check_allowed(addr.hostname)
        await self._versions_early(addr)
        base, discovery_until = await self._documents.service(addr.hostname, "providers.v1")
        entry, versions = await self._versions_entry(addr, base, max_age)
        until = min(discovery_until, self._documents.fresh_until(entry, self._settings.freshness.versions))
        self._fresh_versions.put(addr, _FreshVersions(entry.fetched_at, until, versions))
        return versions

    async def _versions_early(self, addr: ProviderAddr) -> None:
        """With neither the host's discovery document nor the provider's version list in the store, the list
        is fetched at its usual place while discovery says where it is (its answer used only if that is the
        place: one round trip instead of two), and spare connections to the host are opened meanwhile for the
        download documents and release files that follow several at once."""
        usual = await self._documents.usual_service_url(
            addr.hostname, provider_registry.USUAL_PATH, keys.versions(addr)
        )
        if usual is not None:
            versions = provider_registry.versions_url(usual, addr)
            self._documents.fetch_early(versions)
            self._documents.open_spares(versions)

    async def versions_document(self, addr: ProviderAddr) -> bytes:
        """The upstream's `versions` answer, byte for byte (registry pass-through)."""
        self._documents.check_allowed(addr.hostname)
        await self._versions_early(addr)
        base = await self._documents.service_url(addr.hostname, "providers.v1")
        return (await self._versions_entry(addr, base))[0].body

    async def _versions_entry(
        self, addr: ProviderAddr, base: URL, max_age: float | None = None
    ) -> tuple[CacheEntry, dict[Version, VersionInfo]]:
        entry, versions = await self._documents.document(
            keys.versions(addr),
            provider_registry.versions_url(base, addr),
            ttl=list_ttl(self._settings.freshness.versions, max_age),
            parse=lambda e: provider_registry.parse_versions(e.body, addr),
        )
        if versions is None:
            raise ProviderNotFoundError(f"provider {addr} is not known to its registry")
        return entry, versions

    async def offered(self, addr: ProviderAddr, version: Version, platforms: list[Platform]) -> VersionInfo:
        """The version's entry in the provider's version list, which must offer every one of `platforms`.

        Checked before any per-version or per-platform upstream request, so made-up versions and
        platforms cost nothing upstream; a list missing them is refetched at most once per
        `--ttl-negative` (a version may have been published since the list was cached).
        """

        def lacks(versions: dict[Version, VersionInfo]) -> bool:
            info = versions.get(version)
            return info is None or bool(missing_platforms(info.platforms, platforms))

        versions = await listed(lambda max_age: self.versions(addr, max_age), lacks, self._rechecks, addr)
        info = versions.get(version)
        if info is None:
            raise VersionNotFoundError(f"provider {addr} has no version {version}")
        missing = missing_platforms(info.platforms, platforms)
        if missing:
            raise PackageNotFoundError(no_package_message(f"provider {addr} {version}", missing, info.platforms))
        return info

    async def download(self, addr: ProviderAddr, version: Version, platform: Platform) -> DownloadInfo:
        """The download document of one package (PackageNotFoundError if the registry has none)."""
        d = await self.download_or_none(addr, version, platform)
        if d is None:
            raise PackageNotFoundError(f"provider {addr} {version} has no package for {platform}")
        return d

    async def download_or_none(self, addr: ProviderAddr, version: Version, platform: Platform) -> DownloadInfo | None:
        """The download document of one package, None if the registry answered 404."""
        base = await self._documents.service_url(addr.hostname, "providers.v1")
        url = provider_registry.download_url(base, addr, version, platform)
        key = keys.download(addr, version, platform)
        return (await self._documents.document(key, url, ttl=None, parse=download_parser(addr, version, platform)))[1]

    async def download_if_available(
        self, addr: ProviderAddr, version: Version, platform: Platform
    ) -> DownloadInfo | UpstreamError | None:
        """`download` for a version's archive list: a package that cannot be had now (the registry has none,
        offline and not cached, or the upstream failing for it alone) is left out rather than failing the
        whole list (the upstream's failure given instead, None otherwise)."""
        try:
            return await self.download_or_none(addr, version, platform)
        except OfflineMissError:
            return None
        except UpstreamError as exc:
            log.warning(
                "mirror.platform_unavailable",
                provider=str(addr),
                version=str(version),
                platform=str(platform),
                error=exc.message,
            )
            return exc

    async def cached_download(self, addr: ProviderAddr, version: Version, platform: Platform) -> DownloadInfo | None:
        """The download document of one package if it is cached, never fetching it."""
        key = keys.download(addr, version, platform)
        entry = await self._documents.cached(key)
        if entry is None or entry.negative:
            return None
        return await self._documents.value(key, entry, download_parser(addr, version, platform))


def download_parser(addr: ProviderAddr, version: Version, platform: Platform) -> Callable[[CacheEntry], DownloadInfo]:
    def parse(entry: CacheEntry) -> DownloadInfo:
        return provider_registry.parse_download(entry.body, URL(entry.url), addr, version, platform)

    return parse
