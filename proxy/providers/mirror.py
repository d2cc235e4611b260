"""The provider service: what the registry, network mirror, lock file and health handlers ask for.

Handlers call one method here; each job is a service of its own, composed here:

- `proxy.providers.metadata`: version lists, what a version offers, download documents;
- `proxy.providers.release_sums`: each release's SHA256SUMS, verified and recorded once;
- `proxy.providers.archives`: verified archives from the store, or fetched once for the fleet (the one
  place an archive is fetched from an upstream), relayed while the disk is full;
- `proxy.providers.verification`: the verification chain all of them apply (with the one place a provider version and
  platform is admitted: `VerificationChain._admit`, through `admit` and `admit_stored`);
- `proxy.services.readiness`: the stores and the free space, for `/readyz`.

What combines them lives here: a version's archive list for `:version.json` (remembered while
nothing it was made from changed) and the hashes of `/lock/v1`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from proxy.domain.addresses import Platform, ProviderAddr, Version
from proxy.domain.hashes import Hash
from proxy.errors import DiskFullError, UpstreamError
from proxy.metadata_store import MetadataStore, keys
from proxy.metadata_store.records import ArchiveRecord
from proxy.protocol.provider_registry import DownloadInfo, VersionInfo
from proxy.providers.archives import ProviderArchives
from proxy.providers.metadata import ProviderMetadata
from proxy.providers.release_sums import ReleaseSums
from proxy.providers.signatures import Keyring
from proxy.providers.verification import PackageHashes, SignedSums, VerificationChain
from proxy.runtime.memo import Memo, memoised
from proxy.runtime.metrics import Metrics
from proxy.services.documents import DocumentCache
from proxy.services.downloader import Downloader
from proxy.services.readiness import Readiness
from proxy.services.relay import UpstreamRelay
from proxy.services.shared_fetches import SharedFetches, gather_bounded
from proxy.settings.config import Settings
from proxy.storage import ArchiveStore, DiskSpace, SpaceReport, StoredArchive


@dataclass(frozen=True)
class PlatformArchive:
    """One entry of a network mirror `:version.json`."""

    platform: Platform
    filename: str
    hashes: tuple[Hash, ...]


@dataclass(frozen=True)
class LockHashes:
    """Per requested platform its `h1:` (directory form) and `zh:`; `signed`: every `zh:` of SHA256SUMS."""

    h1: dict[str, Hash]
    zh: dict[str, Hash]
    signed: list[Hash]

    @property
    def all(self) -> list[Hash]:
        return sorted(set(self.h1.values()) | set(self.zh.values()) | set(self.signed))


@dataclass(frozen=True)
class _ArchiveList:
    """A version's archive list and what it was made from: the version list's entry, and the stored
    values under `keys` as they were before it was made."""

    info: VersionInfo
    keys: list[str]
    values: list[bytes | None]
    archives: list[PlatformArchive]


class Mirror:
    """The provider service behind the registry, network mirror, lock file and health handlers."""

    def __init__(
        self,
        settings: Settings,
        documents: DocumentCache,
        downloader: Downloader,
        shared_fetches: SharedFetches,
        keyring: Keyring,
        *,
        cache: MetadataStore,
        store: ArchiveStore,
        space: DiskSpace,
        metrics: Metrics,
    ) -> None:
        self._settings = settings
        self._documents = documents
        chain = VerificationChain(keyring, settings.upstreams.unsigned_providers, metrics)
        self._chain = chain
        self._metadata = ProviderMetadata(settings, documents)
        self._sums = ReleaseSums(settings, documents, shared_fetches, keyring, chain, space)
        self._archives = ProviderArchives(
            settings, documents, downloader, shared_fetches, self._metadata, self._sums, chain, metrics
        )
        self._readiness = Readiness(cache, store, space)
        self._archive_lists: Memo[tuple[ProviderAddr, Version, frozenset[Platform] | None], _ArchiveList] = Memo()
        self._narrowed: Memo[tuple, tuple[VersionInfo, VersionInfo]] = Memo()

    # ---- metadata ---------------------------------------------------------------------------

    async def provider_versions(self, addr: ProviderAddr, max_age: float | None = None) -> dict[Version, VersionInfo]:
        """The upstream's version list for a provider (`ProviderMetadata.versions`)."""
        return await self._metadata.versions(addr, max_age)

    def count_reused(self) -> None:
        """Count an answer reused whole (`proxy.web.warm_answers`) as the cache hit it stands for."""
        self._documents.count_hit()

    async def versions_document(self, addr: ProviderAddr) -> bytes:
        """The upstream's `versions` answer, byte for byte (registry pass-through)."""
        return await self._metadata.versions_document(addr)

    async def offered(self, addr: ProviderAddr, version: Version, platforms: list[Platform]) -> VersionInfo:
        """The version's entry in the version list, which must offer every one of `platforms`."""
        return await self._metadata.offered(addr, version, platforms)

    async def download_document(self, addr: ProviderAddr, version: Version, platform: Platform) -> dict[str, Any]:
        """The upstream's download metadata as it sent it, unknown fields included, once admitted."""
        d = await self._package(addr, version, platform)
        self._chain.admit(addr, version, d)  # passed on as sent: without keys when the registry lists none
        self._sums.verify_early(addr, version, d)  # the client's next requests: this release's SHA256SUMS,
        self._archives.fetch_early(addr, version, d)  # then this archive (into a temp file only)
        return d.raw

    async def signed_sums(self, addr: ProviderAddr, version: Version, platform: Platform) -> tuple[bytes, bytes]:
        """SHA256SUMS and its signature, byte-identical to upstream, only once the signature verified."""
        record = await self._sums.record(addr, version, await self._package(addr, version, platform))
        return record.sums, record.signature

    async def _package(self, addr: ProviderAddr, version: Version, platform: Platform) -> DownloadInfo:
        """The download document of a package the version list offers."""
        self._documents.check_allowed(addr.hostname)
        await self._metadata.offered(addr, version, [platform])
        return await self._metadata.download(addr, version, platform)

    async def version_archives(
        self, addr: ProviderAddr, version: Version, only: frozenset[Platform] | None = None
    ) -> list[PlatformArchive]:
        """Every platform of a version (of `only`, when given: nothing about the others is fetched) with its
        `zh:` (signed SHA256SUMS) and known `h1:` hashes.

        The same list object as last time while nothing it was made from changed: the version's entry
        in the version list (the same object while the list is unchanged) and the stored download
        documents, SHA256SUMS records and archive records (compared in one store round trip).
        """
        info = await self._metadata.offered(addr, version, [])
        memo_key = (addr, version, only)
        if only is not None:  # the same narrowed object while the list's entry is the same
            info = memoised(self._narrowed, memo_key, info, lambda i: _only(i, only))
        known = self._archive_lists.get(memo_key)
        if known is not None and known.info is info and await self._documents.stored(known.keys) == known.values:
            return known.archives
        platform_keys = [
            k for p in info.platforms for k in (keys.download(addr, version, p), keys.archive(addr, version, p))
        ]
        before = await self._documents.stored(platform_keys)  # read first: a later change makes the memo miss
        downloads, archives = await self._platform_archives(addr, version, info)
        if len(downloads) == len(info.platforms):  # every platform known for good (no failure, no 404)
            sums_keys = sorted({self._sums.key(addr, d) for d in downloads})  # written once, present now
            values = before + await self._documents.stored(sums_keys)
            self._archive_lists.put(memo_key, _ArchiveList(info, platform_keys + sums_keys, values, archives))
        return archives

    async def _platform_archives(
        self, addr: ProviderAddr, version: Version, info: VersionInfo
    ) -> tuple[list[DownloadInfo], list[PlatformArchive]]:
        async def facts(platform: Platform) -> tuple[DownloadInfo | UpstreamError | None, SignedSums | None]:
            # The release's SHA256SUMS is fetched and verified as soon as one platform's download document
            # names it, while the other platforms' documents are still on their way (one fetch: a flight).
            d = await self._metadata.download_if_available(addr, version, platform)
            return d, (await self._sums.verified(addr, version, d) if isinstance(d, DownloadInfo) else None)

        found = await gather_bounded(
            (facts(platform) for platform in info.platforms), self._settings.limits.upstream_concurrency
        )
        downloads = [d for d, _ in found if isinstance(d, DownloadInfo)]
        failures = [d for d, _ in found if isinstance(d, UpstreamError)]
        if failures and not downloads:
            raise failures[0]
        sums_of = {d.platform: sums for d, sums in found if isinstance(d, DownloadInfo) and sums is not None}
        records = await self._archives.records(addr, version, [d.platform for d in downloads])
        result = []
        for d, record in zip(downloads, records, strict=True):
            listed = self._chain.expected(addr, version, d, sums_of[d.platform])
            result.append(PlatformArchive(d.platform, d.filename, _archive_hashes(listed, record)))
        return downloads, result

    # ---- archives ---------------------------------------------------------------------------

    def on_dated(
        self, note: Callable[[ProviderAddr, Version, str], Awaitable[None]], wanted: Callable[[], bool]
    ) -> None:
        """Tell `note` the `Last-Modified` of each release's SHA256SUMS fetched (the policy's publish times);
        while `wanted()` (a rule may hold a release back by its date), an archive is fetched only after them."""
        self._sums.on_dated = note
        self._sums.dates_wanted = wanted

    def on_signed(
        self,
        check: Callable[[ProviderAddr, Version, str, str], Awaitable[None]],
        check_pin: Callable[[ProviderAddr, Version, str, str], None],
        pinned: Callable[[ProviderAddr], bool],
    ) -> None:
        """Tell `check` the signing key (id, fingerprint) of each release when its signature verified, before it is
        recorded, and when its record is used; `check_pin` that of a recorded release served from the store
        (key continuity and pins: either raises to refuse the release); `pinned` whether a pin selects a provider
        (a stored archive whose release's signer is no longer known is then fetched and verified again)."""
        self._sums.on_signed = check
        self._sums.check_signer = check_pin
        self._sums.pinned = pinned

    def on_fetched(self, note: Callable[[ProviderAddr, Version, str | None], None]) -> None:
        """Call `note` whenever an archive is fetched from its upstream (the audit trail)."""
        self._archives.on_fetched = note

    async def archive(
        self, addr: ProviderAddr, version: Version, platform: Platform
    ) -> tuple[StoredArchive, ArchiveRecord]:
        """A verified archive from the store, fetching it once (for everyone) when missing."""
        return await self._archives.archive(addr, version, platform)

    async def archive_for_client(
        self, addr: ProviderAddr, version: Version, platform: Platform, *, follow: bool = False
    ) -> tuple[StoredArchive | UpstreamRelay, str]:
        """The verified archive (or its relay) and its file name (`ProviderArchives.for_client`)."""
        return await self._archives.for_client(addr, version, platform, follow=follow)

    async def lock_hashes(self, addr: ProviderAddr, version: Version, platforms: list[Platform]) -> LockHashes:
        """What `providers lock` would record: each platform's `h1:` and a `zh:` per signed SHA256SUMS line.

        Each requested platform's archive is fetched and verified if it is not cached yet; a platform
        the version does not offer fails the whole request before anything is fetched.
        """
        info = await self._metadata.offered(addr, version, platforms)
        try:
            results = await gather_bounded(
                (self._archives.archive(addr, version, p) for p in platforms),
                self._settings.limits.upstream_concurrency,
            )
        except DiskFullError as exc:
            raise DiskFullError(
                f"cannot compute the h1: hashes of {addr} {version}: they need the archives, "
                f"which the proxy cannot store now; free space on the proxy and retry ({exc.message})"
            ) from None
        recorded = [PackageHashes.of_record(record) for _, record in results]  # parse: `archive` checked them
        h1 = {str(p): hashes.h1_dir for p, hashes in zip(platforms, recorded, strict=True) if hashes}
        zh = {str(p): hashes.zh for p, hashes in zip(platforms, recorded, strict=True) if hashes}
        signed: set[Hash] = set()
        for platform in platforms or info.platforms[:1]:
            d = await self._metadata.download_or_none(addr, version, platform)
            if d is not None:
                signed |= (await self._sums.verified(addr, version, d)).hashes
        return LockHashes(h1, zh, sorted(signed))

    # ---- readiness --------------------------------------------------------------------------

    async def ready(self) -> dict[str, bool]:
        """Readiness of the metadata store, the data directory and its free space."""
        return await self._readiness.ready()

    async def metadata_store_up(self) -> bool:
        """Whether the metadata store answers now."""
        return await self._readiness.metadata_store_up()

    async def disk_space(self) -> SpaceReport:
        """Free space of the data directory against `--min-free-space` (measured at most once a second)."""
        return await self._readiness.disk_space()

    def metadata_problem(self) -> str | None:
        """Why the metadata store is unusable now (for /readyz), or None."""
        return self._readiness.metadata_problem()


def _only(info: VersionInfo, only: frozenset[Platform]) -> VersionInfo:
    """`info` with only the platforms in `only`."""
    return replace(info, platforms=tuple(p for p in info.platforms if p in only))


def _archive_hashes(listed: Hash, record: ArchiveRecord | None) -> tuple[Hash, ...]:
    """A platform's hashes for `:version.json`: its signed `zh:`, and both `h1:` forms once its archive is stored
    with that digest."""
    hashes = {listed}
    stored = None if record is None else PackageHashes.of_record(record)
    if stored is not None and stored.zh == listed:
        hashes.update((stored.h1_dir, stored.h1_zip))
    return tuple(sorted(hashes))
