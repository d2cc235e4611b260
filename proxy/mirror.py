"""The provider service: the registry's metadata and verified archives, one fetch per artifact.

Handlers call one method here. Metadata comes through the document cache (`proxy.documents`:
freshness, stale-if-error, remembered 404s). For archives: download metadata → SHA256SUMS
and signature (verified with the registry's keys) → download to a temp file while hashing
(`proxy.downloader`) → compare → compute `h1:` → publish to the content-addressed store →
record the hashes (`proxy.records`). Nothing unverified is stored or served whole: clients
waiting for a cold archive get it as it downloads, its last chunk held back until verified
(`proxy.growing`). While the disk
is full, an archive a client asks for is relayed from the upstream without being stored, its
last chunk held back until the SHA-256 matched the signed SHA256SUMS (`archive_for_client`).
"""

from __future__ import annotations

import asyncio
import zipfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from yarl import URL

from proxy import deadline, verify
from proxy.addrs import Platform, ProviderAddr, Version
from proxy.cache import CacheEntry, MetadataStore, keys
from proxy.config import Settings
from proxy.documents import DocumentCache
from proxy.downloader import Downloader
from proxy.errors import DiskFullError, NotFoundError, OfflineMissError, UpstreamError, VerificationError
from proxy.flights import Flights, gather_bounded
from proxy.gpg import Keyring, SignatureError
from proxy.growing import GrowingFile
from proxy.hashes import h1_of_zip, zh_hash
from proxy.log import note_cache
from proxy.memo import MEMO_ENTRIES
from proxy.metrics import Metrics
from proxy.offered import RecheckGate, list_ttl, listed, missing_platforms, no_package_message
from proxy.passthrough import PassThrough
from proxy.records import ArchiveRecord, SumsRecord
from proxy.security import security_event
from proxy.storage import ArchiveStore, DiskSpace, PendingArchive, SpaceReport, StoredArchive, is_disk_full
from proxy.upstream import providers
from proxy.upstream.providers import DownloadInfo, VersionInfo
from proxy.ziphash import StreamedZipMismatch, ZipStreamHasher, h1_of_streamed_zip

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class PlatformArchive:
    """One entry of a network mirror `:version.json`."""

    platform: Platform
    filename: str
    hashes: tuple[str, ...]


@dataclass(frozen=True)
class LockHashes:
    """Per requested platform its `h1:` (directory form) and `zh:`; `signed`: every zh of SHA256SUMS."""

    h1: dict[str, str]
    zh: dict[str, str]
    signed: list[str]

    @property
    def all(self) -> list[str]:
        return sorted(set(self.h1.values()) | set(self.zh.values()) | set(self.signed))


@dataclass(frozen=True)
class _FreshVersions:
    """A provider's parsed version list, fresh from `since` until `until` (`DocumentCache.clock` times)."""

    since: float
    until: float
    versions: dict[Version, VersionInfo]


@dataclass(frozen=True)
class _ArchiveList:
    """A version's archive list and what it was made from: the version list's entry, and the stored
    values under `keys` as they were before it was made."""

    info: VersionInfo
    keys: list[str]
    values: list[bytes | None]
    archives: list[PlatformArchive]


class Mirror:
    """The provider service behind the registry, network mirror and lock file handlers."""

    def __init__(
        self,
        settings: Settings,
        documents: DocumentCache,
        downloader: Downloader,
        flights: Flights,
        keyring: Keyring,
        *,
        cache: MetadataStore,
        store: ArchiveStore,
        space: DiskSpace,
        metrics: Metrics,
    ) -> None:
        self._settings = settings
        self._documents = documents
        self._downloader = downloader
        self._flights = flights
        self._keyring = keyring
        self._cache = cache
        self._store = store
        self._space = space
        self._metrics = metrics
        self._rechecks = RecheckGate(settings.freshness.negative)
        self._private_hosts = settings.upstream_credentials.private_hosts
        self._archive_lists: dict[tuple[ProviderAddr, Version], _ArchiveList] = {}
        self._fresh_versions: dict[ProviderAddr, _FreshVersions] = {}

    # ---- public API -------------------------------------------------------------------

    async def provider_versions(self, addr: ProviderAddr, max_age: float | None = None) -> dict[Version, VersionInfo]:
        """The upstream's version list for a provider (cached for the versions TTL, or `max_age` if shorter).

        While the list and the discovery document it was found through are fresh, the list is answered
        from this process's memory without reading the store (the fresh-until shortcut); once either is
        stale, the document cache is asked again, which revalidates them with the upstream.
        """
        known = self._fresh_versions.get(addr)
        if known is not None and max_age is None and known.since <= self._documents.clock() < known.until:
            self._documents.count_hit()
            return known.versions
        self._documents.check_allowed(addr.hostname)
        base, discovery_until = await self._documents.service(addr.hostname, "providers.v1")
        key = keys.versions(addr)
        entry = await self._versions_entry(addr, base, key, max_age)
        versions = self._documents.parsed(key, entry, lambda e: providers.parse_versions(e.body, addr))
        until = min(discovery_until, self._documents.fresh_until(entry, self._settings.freshness.versions))
        if len(self._fresh_versions) >= MEMO_ENTRIES and addr not in self._fresh_versions:
            self._fresh_versions.pop(next(iter(self._fresh_versions)))
        self._fresh_versions[addr] = _FreshVersions(entry.fetched_at, until, versions)
        return versions

    async def versions_document(self, addr: ProviderAddr) -> bytes:
        """The upstream's `versions` answer, byte for byte (registry pass-through)."""
        self._documents.check_allowed(addr.hostname)
        base = await self._documents.service_url(addr.hostname, "providers.v1")
        return (await self._versions_entry(addr, base, keys.versions(addr))).body

    async def download_document(self, addr: ProviderAddr, version: Version, platform: Platform) -> dict[str, Any]:
        """The upstream's download metadata as it sent it, unknown fields included."""
        self._documents.check_allowed(addr.hostname)
        await self.offered(addr, version, [platform])
        d = await self._download_info(addr, version, platform)
        if d is None:
            raise NotFoundError(f"provider {addr} {version} has no package for {platform}")
        self._admit(addr, version, d)  # passed on as sent: without keys when the registry lists none
        return d.raw

    async def signed_sums(self, addr: ProviderAddr, version: Version, platform: Platform) -> tuple[bytes, bytes]:
        """SHA256SUMS and its signature, byte-identical to upstream, only once the signature verified."""
        self._documents.check_allowed(addr.hostname)
        await self.offered(addr, version, [platform])
        d = await self._download_info(addr, version, platform)
        if d is None:
            raise NotFoundError(f"provider {addr} {version} has no package for {platform}")
        record = await self._verified_sums_record(addr, version, d)
        return record.sums, record.signature

    async def lock_hashes(self, addr: ProviderAddr, version: Version, platforms: list[Platform]) -> LockHashes:
        """What `providers lock` would record: each platform's `h1:` and a `zh:` per signed SHA256SUMS line.

        Each requested platform's archive is fetched and verified if it is not cached yet; a platform
        the version does not offer fails the whole request before anything is fetched.
        """
        info = await self.offered(addr, version, platforms)
        try:
            results = await gather_bounded(
                (self.archive(addr, version, p) for p in platforms), self._settings.limits.upstream_concurrency
            )
        except DiskFullError as exc:
            raise DiskFullError(
                f"cannot compute the h1: hashes of {addr} {version}: they need the archives, "
                f"which the proxy cannot store now; free space on the proxy and retry ({exc.message})"
            ) from None
        h1 = {str(p): record.h1_dir for p, (_, record) in zip(platforms, results, strict=True)}
        zh = {str(p): zh_hash(record.sha256) for p, (_, record) in zip(platforms, results, strict=True)}
        signed: list[str] = []
        for platform in platforms or info.platforms[:1]:
            d = await self._download_info(addr, version, platform)
            if d is not None:
                sums = await self._verified_sums(addr, version, d)
                signed = sorted({zh_hash(digest) for digest in sums.values()} | set(signed))
        return LockHashes(h1, zh, signed)

    async def offered(self, addr: ProviderAddr, version: Version, platforms: list[Platform]) -> VersionInfo:
        """The version's entry in the provider's version list, which must offer every one of `platforms`.

        Checked before any per-version or per-platform upstream request, so made-up versions and
        platforms cost nothing upstream; a list missing them is refetched at most once per
        `--ttl-negative` (a version may have been published since the list was cached).
        """

        def lacks(versions: dict[Version, VersionInfo]) -> bool:
            info = versions.get(version)
            return info is None or bool(missing_platforms(info.platforms, platforms))

        versions = await listed(lambda max_age: self.provider_versions(addr, max_age), lacks, self._rechecks, addr)
        info = versions.get(version)
        if info is None:
            raise NotFoundError(f"provider {addr} has no version {version}")
        missing = missing_platforms(info.platforms, platforms)
        if missing:
            raise NotFoundError(no_package_message(f"provider {addr} {version}", missing, info.platforms))
        return info

    async def _versions_entry(
        self, addr: ProviderAddr, base: URL, key: str, max_age: float | None = None
    ) -> CacheEntry:
        url = providers.versions_url(base, addr)
        entry = await self._documents.document(
            key,
            url,
            ttl=list_ttl(self._settings.freshness.versions, max_age),
            validate=lambda e: providers.parse_versions(e.body, addr),
        )
        if entry.negative:
            raise NotFoundError(f"provider {addr} is not known to its registry")
        return entry

    async def version_archives(self, addr: ProviderAddr, version: Version) -> list[PlatformArchive]:
        """Every platform of a version with its `zh:` (signed SHA256SUMS) and known `h1:` hashes.

        The same list object as last time while nothing it was made from changed: the version's entry
        in the version list (the same object while the list is unchanged) and the stored download
        documents, SHA256SUMS records and archive records (compared in one store round trip).
        """
        info = await self.offered(addr, version, [])
        memo_key = (addr, version)
        known = self._archive_lists.get(memo_key)
        if known is not None and known.info is info and await self._documents.stored(known.keys) == known.values:
            return known.archives
        platform_keys = [
            k for p in info.platforms for k in (keys.download(addr, version, p), keys.archive(addr, version, p))
        ]
        before = await self._documents.stored(platform_keys)  # read first: a later change makes the memo miss
        downloads, archives = await self._platform_archives(addr, version, info)
        if len(downloads) == len(info.platforms):  # every platform known for good (no failure, no 404)
            sums_keys = sorted({self._sums_key(addr, d) for d in downloads})  # written once, present now
            self._remember_archive_list(
                memo_key,
                _ArchiveList(
                    info, platform_keys + sums_keys, before + await self._documents.stored(sums_keys), archives
                ),
            )
        return archives

    async def _platform_archives(
        self, addr: ProviderAddr, version: Version, info: VersionInfo
    ) -> tuple[list[DownloadInfo], list[PlatformArchive]]:
        async def facts(platform: Platform) -> tuple[DownloadInfo | UpstreamError | None, dict[str, str] | None]:
            # The release's SHA256SUMS is fetched and verified as soon as one platform's download document
            # names it, while the other platforms' documents are still on their way (one fetch: a flight).
            d = await self._cached_download_info(addr, version, platform)
            return d, (await self._verified_sums(addr, version, d) if isinstance(d, DownloadInfo) else None)

        found = await gather_bounded(
            (facts(platform) for platform in info.platforms), self._settings.limits.upstream_concurrency
        )
        downloads = [d for d, _ in found if isinstance(d, DownloadInfo)]
        failures = [d for d, _ in found if isinstance(d, UpstreamError)]
        if failures and not downloads:
            raise failures[0]
        sums_by_source = {keys.sums_source(d): sums for d, sums in found if isinstance(d, DownloadInfo)}
        records = await self._archive_records(addr, version, [d.platform for d in downloads])
        result = []
        for d, record in zip(downloads, records, strict=True):
            digest = verify.expected_digest(sums_by_source[keys.sums_source(d)], d.filename, d.shasum)
            hashes = {zh_hash(digest)}
            if record is not None and record.sha256 == digest:
                hashes.update((record.h1_dir, record.h1_zip))
            result.append(PlatformArchive(d.platform, d.filename, tuple(sorted(hashes))))
        return downloads, result

    def _remember_archive_list(self, key: tuple[ProviderAddr, Version], made: _ArchiveList) -> None:
        if len(self._archive_lists) >= MEMO_ENTRIES:
            self._archive_lists.pop(next(iter(self._archive_lists)))
        self._archive_lists[key] = made

    async def archive(
        self, addr: ProviderAddr, version: Version, platform: Platform
    ) -> tuple[StoredArchive, ArchiveRecord]:
        """A verified archive from the store, fetching it once (for everyone) when missing."""
        found = await self._archive(addr, version, platform, follow=False)
        assert not isinstance(found, GrowingFile)  # only given when following
        return found

    async def _archive(
        self, addr: ProviderAddr, version: Version, platform: Platform, *, follow: bool
    ) -> tuple[StoredArchive, ArchiveRecord] | GrowingFile:
        """`archive`; with `follow`, a cold archive's download (here or in another process) as soon as it
        is under way, instead of the archive once stored."""
        self._documents.check_allowed(addr.hostname)
        found = await self._stored_archive(addr, version, platform)
        if found is not None:
            note_cache("hit")
            return found
        await self.offered(addr, version, [platform])
        d, sums = await self._release_facts(addr, version, platform)  # waited for within the request deadline
        key = keys.archive(addr, version, platform)
        with deadline.unbounded():  # the download itself is bounded by the idle timeout and minimum rate
            flight = self._flights.once_for_the_fleet(
                key,
                lambda: self._stored_archive(addr, version, platform),
                lambda: self._fetch_archive(addr, version, platform, d, sums),
            )
            expected = _listed_digest(sums, d) if follow else None
            found_or_growing = await (
                flight if expected is None else self._downloader.growing.result_or_growing(key, expected, flight)
            )
        note_cache("miss")
        return found_or_growing

    async def archive_for_client(
        self, addr: ProviderAddr, version: Version, platform: Platform, *, follow: bool = False
    ) -> tuple[StoredArchive | PassThrough, str]:
        """The verified archive and its file name; while the disk is full, a verified relay of the upstream's.

        With `follow`, a cold archive whose download is under way is relayed as it is written, its
        last chunk held back until it is verified (`proxy.growing`), instead of waited for whole.
        """
        try:
            found = await self._archive(addr, version, platform, follow=follow)
            if isinstance(found, GrowingFile):
                d, _ = await self._release_facts(addr, version, platform)  # cached: the download needed them
                return found.relay(), d.filename
            stored, record = found
            return stored, record.filename
        except DiskFullError as exc:
            d, expected = await self._expected_digest(addr, version, platform)

            def check(actual: str) -> None:
                try:
                    verify.check_archive_digest(actual, expected, d.filename)
                except VerificationError as failure:
                    self._security_event("archive", addr, version, d, failure.message)
                    raise

            log.info(
                "archive.passthrough",
                provider=str(addr),
                version=str(version),
                platform=str(platform),
                reason=exc.message,
            )
            return self._downloader.pass_through(
                d.download_url,
                max_bytes=self._settings.limits.max_archive_bytes,
                algorithm="sha256",
                kind="provider",
                check=check,
                etag=expected,
            ), d.filename

    async def ready(self) -> dict[str, bool]:
        """Readiness of the metadata store, the data directory and its free space."""
        return {
            "metadata_store": await self._cache.ping(),
            "archive_store": await asyncio.to_thread(self._store.is_writable),
            "disk_space": (await self.disk_space()).ok,
        }

    async def metadata_store_up(self) -> bool:
        """Whether the metadata store answers now."""
        return await self._cache.ping()

    async def disk_space(self) -> SpaceReport:
        """Free space of the data directory against `--min-free-space` (measured at most once a second)."""
        return await self._space.report()

    def metadata_problem(self) -> str | None:
        """Why the metadata store is unusable now (for /readyz), or None."""
        return self._cache.problem

    # ---- discovery and metadata --------------------------------------------------------

    async def _cached_download_info(
        self, addr: ProviderAddr, version: Version, platform: Platform
    ) -> DownloadInfo | UpstreamError | None:
        """Download metadata for a version document; a platform that cannot be had now (offline and not
        cached, or the upstream failing for it alone) is left out rather than failing the whole document."""
        try:
            return await self._download_info(addr, version, platform)
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

    async def _download_info(self, addr: ProviderAddr, version: Version, platform: Platform) -> DownloadInfo | None:
        base = await self._documents.service_url(addr.hostname, "providers.v1")
        url = providers.download_url(base, addr, version, platform)
        parse = _download_parser(addr, version, platform)
        key = keys.download(addr, version, platform)
        entry = await self._documents.document(key, url, ttl=None, validate=parse)
        return None if entry.negative else self._documents.parsed(key, entry, parse)

    # ---- verification -------------------------------------------------------------------

    async def _verified_sums(self, addr: ProviderAddr, version: Version, d: DownloadInfo) -> dict[str, str]:
        """The parsed SHA256SUMS of a release after its signature verified."""
        return self._parsed_sums(addr, d, await self._verified_sums_record(addr, version, d))

    def _sums_key(self, addr: ProviderAddr, d: DownloadInfo) -> str:
        host = str(addr.hostname)
        return keys.sums(d, scope=host if host in self._private_hosts else "")

    def _parsed_sums(self, addr: ProviderAddr, d: DownloadInfo, record: SumsRecord) -> dict[str, str]:
        return self._documents.parsed(
            self._sums_key(addr, d), record, lambda r: verify.parse_signed_sums(r.sums, str(d.shasums_url))
        )

    async def _verified_sums_record(self, addr: ProviderAddr, version: Version, d: DownloadInfo) -> SumsRecord:
        """SHA256SUMS and signature as fetched, recorded (and so cached) only once verified."""
        self._admit(addr, version, d)
        key = self._sums_key(addr, d)

        async def recorded() -> SumsRecord | None:
            return await self._documents.record(key, SumsRecord)

        record = await recorded()
        if record is None:
            record = await self._flights.once_for_the_fleet(
                key,
                recorded,
                lambda: self._fetch_verified_sums(key, addr, version, d),
                str(d.shasums_url.with_query(None)),
            )
        return record

    async def _fetch_verified_sums(self, key: str, addr: ProviderAddr, version: Version, d: DownloadInfo) -> SumsRecord:
        limit = self._settings.limits.max_metadata_bytes
        # The keys are imported while the documents they verify arrive (a gpg process less to wait for).
        sums, signature, _ = await asyncio.gather(
            self._documents.blob(d.shasums_url, limit, "SHA256SUMS"),
            self._documents.blob(d.shasums_signature_url, limit, "SHA256SUMS signature"),
            asyncio.to_thread(self._keyring.import_quietly, list(d.signing_keys)),
        )
        if d.unsigned:  # admitted by --unsigned-providers; the signature is kept as sent, for the clients
            verify.parse_signed_sums(sums, str(d.shasums_url))
            record = SumsRecord(sums, signature, "", "", unsigned=True)
            await self._documents.put_record(key, record)
            log.info(
                "verify.signature_skipped",
                provider=str(addr),
                version=str(version),
                reason="the registry lists no signing keys",
                policy=str(self._settings.unsigned_providers),
            )
            return record
        try:
            result = await asyncio.to_thread(self._keyring.verify_detached, sums, signature, list(d.signing_keys))
        except SignatureError as exc:
            self._security_event("signature", addr, version, d, str(exc))
            raise VerificationError(f"SHA256SUMS of {addr} {version} failed verification: {exc}") from None
        except OSError as exc:  # gpg needs a little room in DATA_DIR/gnupg: a full disk is no forgery
            if not is_disk_full(exc):
                raise
            raise self._space.full(exc, f"verify the SHA256SUMS of {addr} {version}") from None
        verify.parse_signed_sums(sums, str(d.shasums_url))  # a malformed document is never cached
        record = SumsRecord(sums, signature, result.key_id, result.fingerprint)
        await self._documents.put_record(key, record)
        log.info("verify.signature_ok", provider=str(addr), version=str(version), key_id=result.key_id)
        return record

    def _admit(self, addr: ProviderAddr, version: Version, d: DownloadInfo) -> None:
        """Refuse a release whose registry lists no signing keys, unless `--unsigned-providers` admits its
        host and both its download answer and its SHA256SUMS came over TLS (verified, as every upstream
        connection is). A registry that lists keys always needs a valid signature (`_fetch_verified_sums`)."""
        if not d.unsigned:
            return
        policy = self._settings.unsigned_providers
        reason = None
        if not policy.allows(addr.hostname):
            reason = (
                f"the registry lists no signing keys for {addr} {version}: unsigned providers from "
                f"{addr.hostname} are refused (--unsigned-providers {policy})"
            )
        elif not all(url is not None and url.scheme == "https" for url in (d.document_url, d.shasums_url)):
            reason = (
                f"the registry lists no signing keys for {addr} {version}, and its download answer or "
                "SHA256SUMS did not come over https: without a signature, TLS is all that vouches for them"
            )
        if reason is not None:
            self._security_event("unsigned", addr, version, d, reason)
            raise VerificationError(reason)

    def _refuse_cached_unsigned(
        self, addr: ProviderAddr, version: Version, platform: Platform, record: ArchiveRecord
    ) -> None:
        """A stored unsigned archive whose host `--unsigned-providers` no longer admits is refused, not served."""
        policy = self._settings.unsigned_providers
        if record.unsigned and not policy.allows(addr.hostname):
            reason = (
                f"the stored archive {record.filename} of {addr} {version} is unsigned (its registry lists no "
                f"signing keys), and unsigned providers from {addr.hostname} are refused "
                f"(--unsigned-providers {policy})"
            )
            security_event(
                self._metrics,
                "unsigned",
                addr,
                version=str(version),
                platform=str(platform),
                filename=record.filename,
                reason=reason,
            )
            raise VerificationError(reason)

    def _security_event(self, check: str, addr: ProviderAddr, version: Version, d: DownloadInfo, reason: str) -> None:
        security_event(
            self._metrics,
            check,
            addr,
            version=str(version),
            platform=str(d.platform),
            filename=d.filename,
            reason=reason,
        )

    # ---- archives -------------------------------------------------------------------------

    async def _stored_archive(
        self, addr: ProviderAddr, version: Version, platform: Platform
    ) -> tuple[StoredArchive, ArchiveRecord] | None:
        """The archive if its verified record exists, agrees with the signed sums, and its file, of the
        recorded size, is in the store."""
        record = await self._archive_record(addr, version, platform)
        if record is not None:
            self._refuse_cached_unsigned(addr, version, platform, record)
        if record is not None and not await self._agrees_with_signed_sums(addr, version, platform, record):
            record = None
        return await self._downloader.stored(record)

    async def _agrees_with_signed_sums(
        self, addr: ProviderAddr, version: Version, platform: Platform, record: ArchiveRecord
    ) -> bool:
        """Defence in depth behind the sealed store: an archive record must name the file and digest that the
        release's verified SHA256SUMS lists for this platform's download. Only cached metadata is consulted
        (a hit never goes upstream); with nothing cached to compare, the sealed record stands."""
        key = keys.download(addr, version, platform)
        entry = await self._documents.cached(key)
        if entry is None or entry.negative:
            return True
        d = self._documents.parsed(key, entry, _download_parser(addr, version, platform))
        sums_record = await self._documents.record(self._sums_key(addr, d), SumsRecord)
        if sums_record is None:
            return True
        try:
            expected = verify.expected_digest(self._parsed_sums(addr, d, sums_record), d.filename, d.shasum)
        except VerificationError:
            expected = None
        if (expected, d.filename, d.unsigned) == (record.sha256, record.filename, record.unsigned):
            return True
        log.error(
            "security.metadata_poisoned",
            key=keys.archive(addr, version, platform),
            store="consistency",
            reason="the archive record disagrees with the signed SHA256SUMS of its download",
            effect="treated as a miss and fetched again; never served",
        )
        return False

    async def _archive_records(
        self, addr: ProviderAddr, version: Version, platforms: list[Platform]
    ) -> list[ArchiveRecord | None]:
        return await self._documents.records([keys.archive(addr, version, p) for p in platforms], ArchiveRecord)

    async def _archive_record(self, addr: ProviderAddr, version: Version, platform: Platform) -> ArchiveRecord | None:
        return await self._documents.record(keys.archive(addr, version, platform), ArchiveRecord)

    async def _release_facts(
        self, addr: ProviderAddr, version: Version, platform: Platform
    ) -> tuple[DownloadInfo, dict[str, str]]:
        """Download metadata and verified SHA256SUMS of an archive: what its download needs first."""
        d = await self._download_info(addr, version, platform)
        if d is None:
            raise NotFoundError(f"provider {addr} {version} has no package for {platform}")
        return d, await self._verified_sums(addr, version, d)

    def _expected(self, addr: ProviderAddr, version: Version, d: DownloadInfo, sums: dict[str, str]) -> str:
        """The SHA-256 the signed SHA256SUMS lists for the download (which must agree with its `shasum`)."""
        try:
            return verify.expected_digest(sums, d.filename, d.shasum)
        except VerificationError as exc:
            self._security_event("shasums_line", addr, version, d, exc.message)
            raise

    async def _expected_digest(
        self, addr: ProviderAddr, version: Version, platform: Platform
    ) -> tuple[DownloadInfo, str]:
        """The download metadata and the SHA-256 the signed SHA256SUMS lists for the archive."""
        d, sums = await self._release_facts(addr, version, platform)
        return d, self._expected(addr, version, d, sums)

    async def _fetch_archive(
        self, addr: ProviderAddr, version: Version, platform: Platform, d: DownloadInfo, sums: dict[str, str]
    ) -> tuple[StoredArchive, ArchiveRecord]:
        expected = self._expected(addr, version, d, sums)
        key = keys.archive(addr, version, platform)

        def record_of(stored: StoredArchive, hashes: tuple[str, str]) -> ArchiveRecord:
            return ArchiveRecord(expected, stored.size, d.filename, *hashes, unsigned=d.unsigned)

        async def record(stored: StoredArchive, hashes: tuple[str, str]) -> None:
            await self._documents.put_record(key, record_of(stored, hashes))
            log.info(
                "archive.stored",
                provider=str(addr),
                version=str(version),
                platform=str(platform),
                sha256=expected,
                bytes=stored.size,
            )
            if d.unsigned:
                self._metrics.unsigned_archives.labels(str(addr.hostname)).inc()
                log.warning(
                    "archive.unsigned_stored",
                    provider=str(addr),
                    version=str(version),
                    platform=str(platform),
                    sha256=expected,
                    host=str(addr.hostname),
                    policy=str(self._settings.unsigned_providers),
                    checked="SHA256SUMS (over verified TLS) and the registry's shasum; no signature: "
                    "the registry lists no signing keys",
                )

        # Another address or protocol (or this one, before the metadata was lost) may have stored the
        # same bytes already: adopted only if they hash to the address. Not with private hosts: a public
        # release whose signed SHA256SUMS lists a private archive's digest (lock files show digests) would
        # otherwise be served the private bytes without ever fetching them.
        stored = None if self._private_hosts else await self._downloader.adopt(expected)
        if stored is None:
            stored, hashes = await self._download_verified(addr, version, d, expected, record)
        else:
            hashes = await asyncio.to_thread(_h1_of_zip_file, stored.path)
            await record(stored, hashes)
        return stored, record_of(stored, hashes)

    async def _download_verified(
        self,
        addr: ProviderAddr,
        version: Version,
        d: DownloadInfo,
        expected: str,
        record: Callable[[StoredArchive, tuple[str, str]], Awaitable[None]],
    ) -> tuple[StoredArchive, tuple[str, str]]:
        # The members are hashed while the archive streams in; at the end only its central directory is read.
        streamed = ZipStreamHasher()

        async def check(pending: PendingArchive, actual: str) -> tuple[str, str]:
            try:
                verify.check_archive_digest(actual, expected, d.filename)
                return await asyncio.to_thread(_h1_of_downloaded_zip, streamed, pending.path)
            except VerificationError as exc:
                self._security_event("archive", addr, version, d, exc.message)
                raise

        return await self._downloader.download(
            d.download_url,
            self._settings.limits.max_archive_bytes,
            check,
            follow=(keys.archive(addr, version, d.platform), expected),
            then=record,
            tap=streamed.feed,
        )


def _download_parser(addr: ProviderAddr, version: Version, platform: Platform) -> Callable[[CacheEntry], DownloadInfo]:
    def parse(entry: CacheEntry) -> DownloadInfo:
        return providers.parse_download(entry.body, URL(entry.url), addr, version, platform)

    return parse


def _listed_digest(sums: dict[str, str], d: DownloadInfo) -> str | None:
    """The SHA-256 the signed sums list for the download; None if they disagree (the download says why)."""
    try:
        return verify.expected_digest(sums, d.filename, d.shasum)
    except VerificationError:
        return None


def _h1_of_downloaded_zip(streamed: ZipStreamHasher, path: Path) -> tuple[str, str]:
    """Both `h1:` forms of a downloaded zip: from its streamed digests once its central directory confirms
    them, else (any disagreement, anything not streamed) by reading the whole file again."""
    streamed.finish()
    try:
        with open(path, "rb") as handle:
            hashes = h1_of_streamed_zip(streamed, handle)
    except (StreamedZipMismatch, OSError) as exc:
        log.debug("archive.h1_not_streamed", file=path.name, reason=str(exc))
        return _h1_of_zip_file(path)
    log.debug("archive.h1_streamed", file=path.name, members=len(streamed.entries))
    return hashes


def _h1_of_zip_file(path: Path) -> tuple[str, str]:
    """Both `h1:` forms of a zip on disk; a file that is not a readable zip fails verification."""
    try:
        with open(path, "rb") as handle:
            return h1_of_zip(handle)
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
        raise VerificationError(f"archive is not a valid zip file: {exc}") from None
