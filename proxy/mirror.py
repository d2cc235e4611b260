"""The orchestrator: cached upstream metadata, verified archives, one fetch per artifact.

Handlers call one method here. For metadata: fresh → serve; stale or missing → one
shared upstream fetch (ETag revalidation), and on upstream failure serve the stale
copy (stale-if-error); 404s are cached briefly. For archives: download metadata →
SHA256SUMS and signature (verified with the registry's keys) → download to a temp
file while hashing → compare → compute `h1:` → publish to the content-addressed store
→ record the hashes. Nothing unverified is stored or served.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import zipfile
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import structlog
from yarl import URL

from proxy import verify
from proxy.addrs import Hostname, Platform, ProviderAddr, Version
from proxy.cache import CacheEntry, Freshness, MetadataStore, decode_record, encode_record, freshness_of
from proxy.config import Settings
from proxy.errors import HostNotAllowedError, NotFoundError, UpstreamError, VerificationError
from proxy.gpg import Keyring, SignatureError
from proxy.hashes import h1_of_zip, zh_hash
from proxy.log import note_cache
from proxy.metrics import Metrics
from proxy.singleflight import FleetLocks, LocalLocks, SingleFlight
from proxy.store import ArchiveStore, PendingArchive, StoredArchive
from proxy.upstream import discovery, providers
from proxy.upstream.client import UpstreamClient
from proxy.upstream.providers import DownloadInfo, VersionInfo

log = structlog.get_logger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class PlatformArchive:
    """One entry of a network mirror `:version.json`."""

    platform: Platform
    filename: str
    hashes: tuple[str, ...]


@dataclass(frozen=True)
class ArchiveRecord:
    """The verified facts about a stored archive."""

    sha256: str
    size: int
    filename: str
    h1_zip: str
    h1_dir: str

    @property
    def hashes(self) -> tuple[str, ...]:
        return tuple(sorted({self.h1_dir, self.h1_zip, zh_hash(self.sha256)}))

    def to_dict(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "size": self.size, "filename": self.filename,
                "h1_zip": self.h1_zip, "h1_dir": self.h1_dir}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> ArchiveRecord | None:
        if data is None:
            return None
        try:
            return cls(str(data["sha256"]), int(data["size"]), str(data["filename"]),
                       str(data["h1_zip"]), str(data["h1_dir"]))
        except (KeyError, TypeError, ValueError):
            return None


class Mirror:
    """The service layer behind every HTTP handler."""

    def __init__(self, settings: Settings, upstream: UpstreamClient, cache: MetadataStore,
                 store: ArchiveStore, keyring: Keyring, metrics: Metrics,
                 *, locks: FleetLocks | None = None, clock: Callable[[], float] = time.time) -> None:
        self._settings = settings
        self._upstream = upstream
        self._cache = cache
        self._store = store
        self._keyring = keyring
        self._metrics = metrics
        self._clock = clock
        self._flights = SingleFlight()
        self._locks = locks or LocalLocks()
        self._upstream_slots = asyncio.Semaphore(settings.limits.upstream_concurrency)

    async def close(self) -> None:
        await self._flights.close()

    # ---- public API -------------------------------------------------------------------

    def check_allowed(self, hostname: Hostname) -> None:
        """Refuse registry hostnames outside the allowlist, before any network request."""
        if str(hostname) not in self._settings.all_allowed_hosts:
            raise HostNotAllowedError(
                f"registry host {hostname} is not allowed by this proxy "
                "(the operator can add it with --allow-host)")

    async def provider_versions(self, addr: ProviderAddr) -> dict[Version, VersionInfo]:
        """The upstream's version list for a provider (cached for the versions TTL)."""
        self.check_allowed(addr.hostname)
        base = await self._service_url(addr.hostname, "providers.v1")
        url = providers.versions_url(base, addr)
        entry = await self._document(f"versions:{addr}", url, ttl=self._settings.freshness.versions,
                                     validate=lambda e: providers.parse_versions(e.body, addr))
        if entry.negative:
            raise NotFoundError(f"provider {addr} is not known to its registry")
        return providers.parse_versions(entry.body, addr)

    async def version_archives(self, addr: ProviderAddr, version: Version) -> list[PlatformArchive]:
        """Every platform of a version with its `zh:` (signed SHA256SUMS) and known `h1:` hashes."""
        versions = await self.provider_versions(addr)
        info = versions.get(version)
        if info is None:
            raise NotFoundError(f"provider {addr} has no version {version}")
        found = await _gather_bounded(
            (self._download_info(addr, version, platform) for platform in info.platforms),
            self._settings.limits.upstream_concurrency)
        downloads = [d for d in found if d is not None]
        sums_by_source: dict[tuple, dict[str, str]] = {}
        for d in downloads:
            source = _sums_source(d)
            if source not in sums_by_source:
                sums_by_source[source] = await self._verified_sums(addr, version, d)
        records = await asyncio.gather(*(self._archive_record(addr, version, d.platform) for d in downloads))
        result = []
        for d, record in zip(downloads, records, strict=True):
            digest = verify.expected_digest(sums_by_source[_sums_source(d)], d.filename, d.shasum)
            hashes = {zh_hash(digest)}
            if record is not None and record.sha256 == digest:
                hashes.update((record.h1_dir, record.h1_zip))
            result.append(PlatformArchive(d.platform, d.filename, tuple(sorted(hashes))))
        return result

    async def archive(self, addr: ProviderAddr, version: Version,
                      platform: Platform) -> tuple[StoredArchive, ArchiveRecord]:
        """A verified archive from the store, fetching it once (for everyone) when missing."""
        self.check_allowed(addr.hostname)
        found = await self._stored_archive(addr, version, platform)
        if found is not None:
            note_cache("hit")
            return found
        key = f"archive:{addr}/{version}/{platform}"

        async def fetch_once_for_the_fleet() -> tuple[StoredArchive, ArchiveRecord]:
            async with self._locks.hold(key, lambda: self._stored_archive(addr, version, platform)) as done:
                return done if done is not None else await self._fetch_archive(addr, version, platform)

        found = await self._flights.run(key, fetch_once_for_the_fleet)
        note_cache("miss")
        return found

    async def ready(self) -> dict[str, bool]:
        """Readiness of the metadata store and the data directory."""
        return {"metadata_store": await self._cache.ping(),
                "archive_store": await asyncio.to_thread(self._store.is_writable)}

    # ---- discovery and metadata --------------------------------------------------------

    async def _service_url(self, hostname: Hostname, service: str) -> URL:
        url = discovery.discovery_url(hostname, self._settings.upstream_map)
        entry = await self._document(
            f"discovery:{hostname}", url, ttl=self._settings.freshness.discovery,
            max_bytes=self._settings.limits.max_discovery_bytes, max_redirects=discovery.MAX_REDIRECTS,
            validate=lambda e: discovery.parse_discovery(e.body, e.content_type, hostname))
        if entry.negative:
            raise NotFoundError(f"host {hostname} offers no registry services (discovery answered 404)")
        services = discovery.parse_discovery(entry.body, entry.content_type, hostname)
        return discovery.service_url(services, service, URL(entry.url), hostname)

    async def _download_info(self, addr: ProviderAddr, version: Version,
                             platform: Platform) -> DownloadInfo | None:
        base = await self._service_url(addr.hostname, "providers.v1")
        url = providers.download_url(base, addr, version, platform)

        def parse(entry: CacheEntry) -> DownloadInfo:
            return providers.parse_download(entry.body, URL(entry.url), addr, version, platform)

        entry = await self._document(f"download:{addr}/{version}/{platform}", url, ttl=None, validate=parse)
        return None if entry.negative else parse(entry)

    async def _document(self, key: str, url: URL, *, ttl: float | None,
                        validate: Callable[[CacheEntry], object],
                        max_bytes: int | None = None, max_redirects: int | None = None) -> CacheEntry:
        """A cached upstream document, refreshed through one shared fetch when not fresh."""
        cached = CacheEntry.decode(await self._cache.get(key))
        if cached is not None and freshness_of(cached, self._clock(), ttl,
                                               self._settings.freshness.negative) is Freshness.FRESH:
            self._count_cache("hit")
            return cached
        limit = max_bytes or self._settings.limits.max_metadata_bytes
        entry, outcome = await self._flights.run(
            f"doc:{key}", lambda: self._refresh(key, url, cached, limit, max_redirects, validate))
        self._count_cache(outcome)
        return entry

    async def _refresh(self, key: str, url: URL, cached: CacheEntry | None, max_bytes: int,
                       max_redirects: int | None,
                       validate: Callable[[CacheEntry], object]) -> tuple[CacheEntry, str]:
        now = self._clock()
        usable = cached if cached is not None and not cached.negative else None
        try:
            async with self._upstream_slots:
                response = await self._upstream.get(url, max_bytes=max_bytes, max_redirects=max_redirects,
                                                    etag=usable.etag if usable else None)
            if response.status == 304 and usable is not None:
                entry = replace(usable, fetched_at=now)
            elif response.status in (404, 410):
                entry = CacheEntry(404, b"", str(response.final_url), now)
            elif response.status == 200:
                entry = CacheEntry(200, response.body, str(response.final_url), now,
                                   response.etag, response.content_type)
                validate(entry)
            else:
                raise UpstreamError(f"upstream answered {response.status} for {url}")
        except UpstreamError as exc:
            self._metrics.upstream_fetches.labels("metadata", "error").inc()
            if usable is not None:
                log.warning("cache.serve_stale", key=key, error=exc.message,
                            age_seconds=round(now - usable.fetched_at))
                return usable, "stale"
            raise
        self._metrics.upstream_fetches.labels("metadata", str(response.status)).inc()
        await self._cache.set(key, entry.encode())
        return entry, "miss"

    def _count_cache(self, outcome: str) -> None:
        note_cache(outcome)
        self._metrics.cache.labels(outcome).inc()

    # ---- verification -------------------------------------------------------------------

    async def _verified_sums(self, addr: ProviderAddr, version: Version, d: DownloadInfo) -> dict[str, str]:
        """The SHA256SUMS of a release after its signature verified; cached only once verified."""
        key = "sums:" + hashlib.sha256("\n".join(map(str, _sums_source(d))).encode()).hexdigest()

        async def recorded() -> dict[str, Any] | None:
            return decode_record(await self._cache.get(key))

        async def fetch_once_for_the_fleet() -> dict[str, Any]:
            async with self._locks.hold(key, recorded) as done:
                return done if done is not None else await self._fetch_verified_sums(key, addr, version, d)

        record = await recorded()
        if record is None:
            record = await self._flights.run(key, fetch_once_for_the_fleet)
        return verify.parse_signed_sums(bytes.fromhex(record["sums"]), str(d.shasums_url))

    async def _fetch_verified_sums(self, key: str, addr: ProviderAddr, version: Version,
                                   d: DownloadInfo) -> dict[str, Any]:
        limit = self._settings.limits.max_metadata_bytes
        sums, signature = await asyncio.gather(self._fetch_blob(d.shasums_url, limit, "SHA256SUMS"),
                                               self._fetch_blob(d.shasums_signature_url, limit,
                                                                "SHA256SUMS signature"))
        try:
            result = await asyncio.to_thread(self._keyring.verify_detached, sums, signature,
                                             list(d.signing_keys))
        except SignatureError as exc:
            self._security_event("signature", addr, version, d, str(exc))
            raise VerificationError(f"SHA256SUMS of {addr} {version} failed verification: {exc}") from None
        verify.parse_signed_sums(sums, str(d.shasums_url))  # a malformed document is never cached
        record = {"sums": sums.hex(), "signature": signature.hex(), "key_id": result.key_id,
                  "fingerprint": result.fingerprint}
        await self._cache.set(key, encode_record(record))
        log.info("verify.signature_ok", provider=str(addr), version=str(version), key_id=result.key_id)
        return record

    async def _fetch_blob(self, url: URL, max_bytes: int, what: str) -> bytes:
        async with self._upstream_slots:
            response = await self._upstream.get(url, max_bytes=max_bytes, accept="*/*")
        if response.status != 200:
            raise UpstreamError(f"upstream answered {response.status} for the {what} at {url.with_query(None)}")
        self._metrics.upstream_fetches.labels("checksums", "200").inc()
        return response.body

    def _security_event(self, check: str, addr: ProviderAddr, version: Version, d: DownloadInfo,
                        reason: str) -> None:
        self._metrics.verification_failures.labels(check).inc()
        log.error("security.verification_failed", check=check, provider=str(addr), version=str(version),
                  platform=str(d.platform), filename=d.filename, reason=reason)

    # ---- archives -------------------------------------------------------------------------

    async def _stored_archive(self, addr: ProviderAddr, version: Version,
                              platform: Platform) -> tuple[StoredArchive, ArchiveRecord] | None:
        """The archive if its verified record exists and its file is in the store."""
        record = await self._archive_record(addr, version, platform)
        stored = self._store.get(record.sha256) if record is not None else None
        return (stored, record) if stored is not None and record is not None else None

    async def _archive_record(self, addr: ProviderAddr, version: Version,
                              platform: Platform) -> ArchiveRecord | None:
        raw = await self._cache.get(f"archive:{addr}/{version}/{platform}")
        return ArchiveRecord.from_dict(decode_record(raw))

    async def _fetch_archive(self, addr: ProviderAddr, version: Version,
                             platform: Platform) -> tuple[StoredArchive, ArchiveRecord]:
        d = await self._download_info(addr, version, platform)
        if d is None:
            raise NotFoundError(f"provider {addr} {version} has no package for {platform}")
        sums = await self._verified_sums(addr, version, d)
        try:
            expected = verify.expected_digest(sums, d.filename, d.shasum)
        except VerificationError as exc:
            self._security_event("shasums_line", addr, version, d, exc.message)
            raise
        stored = self._store.get(expected)
        if stored is None:  # another address or protocol may have stored the same bytes already
            stored, (h1_zip, h1_dir) = await self._download_verified(addr, version, d, expected)
        else:
            h1_zip, h1_dir = await asyncio.to_thread(_h1_of_zip_file, stored.path)
        record = ArchiveRecord(expected, stored.size, d.filename, h1_zip, h1_dir)
        await self._cache.set(f"archive:{addr}/{version}/{platform}", encode_record(record.to_dict()))
        log.info("archive.stored", provider=str(addr), version=str(version), platform=str(platform),
                 sha256=expected, bytes=stored.size)
        return stored, record

    async def _download_verified(self, addr: ProviderAddr, version: Version, d: DownloadInfo,
                                 expected: str) -> tuple[StoredArchive, tuple[str, str]]:
        pending: PendingArchive = await asyncio.to_thread(self._store.begin)
        try:
            async def sink(chunk: bytes) -> None:
                await asyncio.to_thread(pending.write, chunk)

            async with self._upstream_slots:
                await self._upstream.download(d.download_url, sink,
                                              max_bytes=self._settings.limits.max_archive_bytes)
            actual = await asyncio.to_thread(pending.finish)
            self._metrics.upstream_fetches.labels("archive", "200").inc()
            self._metrics.upstream_bytes.inc(pending.size)
            try:
                verify.check_archive_digest(actual, expected, d.filename)
                h1s = await asyncio.to_thread(_h1_of_zip_file, pending.path)
            except VerificationError as exc:
                self._security_event("archive", addr, version, d, exc.message)
                raise
            return await asyncio.to_thread(self._store.publish, pending, expected), h1s
        except BaseException:
            await asyncio.to_thread(pending.discard)
            raise


def _sums_source(d: DownloadInfo) -> tuple:
    return (str(d.shasums_url), str(d.shasums_signature_url), *sorted(d.signing_keys))


def _h1_of_zip_file(path: Path) -> tuple[str, str]:
    """Both `h1:` forms of a zip on disk; a file that is not a readable zip fails verification."""
    try:
        with open(path, "rb") as handle:
            return h1_of_zip(handle)
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
        raise VerificationError(f"archive is not a valid zip file: {exc}") from None


async def _gather_bounded(coros: Iterable[Awaitable[T]], limit: int) -> list[T]:
    slots = asyncio.Semaphore(limit)

    async def one(coro: Awaitable[T]) -> T:
        async with slots:
            return await coro

    return await asyncio.gather(*(one(c) for c in coros))
