"""Verified provider archives: from the store while their record holds, else fetched once for the fleet.

A stored archive is served while its record is admitted (`VerificationChain.admit_stored`), agrees
with the release's signed SHA256SUMS (`VerificationChain.agrees`, defence in depth behind the sealed
metadata store) and its file, of the recorded size, is in the store. A missing one is fetched from
the upstream in one place (`ProviderArchives._fetch`), once for the whole fleet: the release's facts
first (the package's download document, the verified SHA256SUMS: `proxy.providers.release_sums`), then the
archive streamed into a temp file while hashed (`proxy.services.downloader`), checked by the chain, published
to the content-addressed store and recorded. Nothing unverified is stored or served whole: clients
waiting for a cold archive follow its download (`proxy.services.live_downloads`), its last chunk held back until
verified; while the disk is full, an archive is relayed from the upstream unstored, its last chunk
held back until its SHA-256 matched the signed SHA256SUMS (`proxy.services.relay`); if the disk fills up
during a download, its followers get the rest that way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

from proxy.domain.addresses import Platform, ProviderAddr, Version
from proxy.domain.hashes import Hash
from proxy.domain.ziphash import ZipStreamHasher
from proxy.errors import DiskFullError
from proxy.metadata_store import keys
from proxy.metadata_store.records import ArchiveRecord
from proxy.protocol.provider_registry import DownloadInfo
from proxy.providers.metadata import ProviderMetadata
from proxy.providers.release_sums import ReleaseSums
from proxy.providers.verification import PackageHashes, SignedSums, VerificationChain
from proxy.runtime import deadline
from proxy.runtime.log import note_cache
from proxy.runtime.metrics import Metrics
from proxy.services.documents import DocumentCache
from proxy.services.downloader import Downloader
from proxy.services.live_downloads import LiveDownload
from proxy.services.relay import UpstreamRelay
from proxy.services.shared_fetches import SharedFetches
from proxy.settings.config import Settings
from proxy.storage import PendingArchive, StoredArchive

log = structlog.get_logger(__name__)
Found = tuple[StoredArchive, ArchiveRecord]


class ProviderArchives:
    """Provider archives, verified, from the store or fetched once for everyone."""

    def __init__(
        self,
        settings: Settings,
        documents: DocumentCache,
        downloader: Downloader,
        shared_fetches: SharedFetches,
        metadata: ProviderMetadata,
        sums: ReleaseSums,
        chain: VerificationChain,
        metrics: Metrics,
    ) -> None:
        self._settings = settings
        self._documents = documents
        self._downloader = downloader
        self._shared_fetches = shared_fetches
        self._metadata = metadata
        self._sums = sums
        self._chain = chain
        self._metrics = metrics
        self._private_hosts = settings.upstreams.upstream_credentials.private_hosts
        self.on_fetched: Callable[[ProviderAddr, Version, str | None], None] | None = None  # the audit trail

    async def records(
        self, addr: ProviderAddr, version: Version, platforms: list[Platform]
    ) -> list[ArchiveRecord | None]:
        """The archive records of several platforms of a version, in one store round trip."""
        return await self._documents.records([keys.archive(addr, version, p) for p in platforms], ArchiveRecord)

    async def archive(self, addr: ProviderAddr, version: Version, platform: Platform) -> Found:
        """A verified archive from the store, fetching it once (for everyone) when missing."""
        found = await self._archive(addr, version, platform, follow=False)
        assert not isinstance(found, LiveDownload)  # only given when following
        return found

    async def for_client(
        self, addr: ProviderAddr, version: Version, platform: Platform, *, follow: bool = False
    ) -> tuple[StoredArchive | UpstreamRelay, str]:
        """The verified archive and its file name; while the disk is full, a verified relay of the upstream's.

        With `follow`, a cold archive whose download is under way is relayed as it is written, its
        last chunk held back until it is verified (`proxy.services.live_downloads`), instead of waited for whole; if the
        disk fills up meanwhile, the rest is relayed from the upstream.
        """
        try:
            found = await self._archive(addr, version, platform, follow=follow)
            if isinstance(found, LiveDownload):
                d, expected = await self._expected(addr, version, platform)  # cached: the download needed them

                def rest(sent: int, sent_sha256: str) -> UpstreamRelay:
                    reason = "the disk filled up during the download"
                    return self._relay(addr, version, d, expected, reason, (sent, sent_sha256))

                return found.relay(rest), d.filename
            stored, record = found
            return stored, record.filename
        except DiskFullError as exc:
            d, expected = await self._expected(addr, version, platform)
            return self._relay(addr, version, d, expected, exc.message), d.filename

    async def _archive(
        self, addr: ProviderAddr, version: Version, platform: Platform, *, follow: bool
    ) -> Found | LiveDownload:
        """`archive`; with `follow`, a cold archive's download (here or in another process) as soon as it
        is under way, instead of the archive once stored."""
        self._documents.check_allowed(addr.hostname)
        found = await self._stored(addr, version, platform)
        if found is not None:
            note_cache("hit")
            return found
        await self._metadata.offered(addr, version, [platform])
        d, sums = await self._release(addr, version, platform)  # waited for within the request deadline
        key = keys.archive(addr, version, platform)
        with deadline.unbounded():  # the download itself is bounded by the idle timeout and minimum rate
            flight = self._shared_fetches.once_for_the_fleet(
                key, lambda: self._stored(addr, version, platform), lambda: self._fetch(addr, version, d, sums)
            )
            listed = sums.listed(d) if follow else None
            live = self._downloader.live_downloads
            found_or_growing = await (flight if listed is None else live.result_or_growing(key, listed.sha256, flight))
        note_cache("miss")
        return found_or_growing

    async def _stored(self, addr: ProviderAddr, version: Version, platform: Platform) -> Found | None:
        """The archive if its verified record exists, is admitted, agrees with the signed sums, and its file,
        of the recorded size, is in the store."""
        record = await self._documents.record(keys.archive(addr, version, platform), ArchiveRecord)
        if record is not None:
            self._chain.admit_stored(addr, version, platform, record)
        if record is not None and not await self._agrees(addr, version, platform, record):
            record = None
        return await self._downloader.stored(record)

    async def _agrees(self, addr: ProviderAddr, version: Version, platform: Platform, record: ArchiveRecord) -> bool:
        """`VerificationChain.agrees`, from cached metadata only (a hit never goes upstream); with nothing cached
        to compare, the sealed record stands."""
        if PackageHashes.of_record(record) is None:
            reason = "the archive record's hashes do not parse"
        else:
            d = await self._metadata.cached_download(addr, version, platform)
            sums = None if d is None else await self._sums.recorded(addr, d)
            if d is None or sums is None or self._chain.agrees(record, d, sums):
                return True
            reason = "the archive record disagrees with the signed SHA256SUMS of its download"
        log.error(
            "security.metadata_poisoned",
            key=keys.archive(addr, version, platform),
            store="consistency",
            reason=reason,
            effect="treated as a miss and fetched again; never served",
        )
        return False

    async def _release(
        self, addr: ProviderAddr, version: Version, platform: Platform
    ) -> tuple[DownloadInfo, SignedSums]:
        """The package's download document and its release's verified SHA256SUMS: what its download needs first."""
        d = await self._metadata.download(addr, version, platform)
        return d, await self._sums.verified(addr, version, d)

    async def _expected(self, addr: ProviderAddr, version: Version, platform: Platform) -> tuple[DownloadInfo, Hash]:
        """The package's download document and the hash the signed SHA256SUMS lists for its archive."""
        d, sums = await self._release(addr, version, platform)
        return d, self._chain.expected(addr, version, d, sums)

    async def _fetch(self, addr: ProviderAddr, version: Version, d: DownloadInfo, sums: SignedSums) -> Found:
        """The one place where a provider archive is fetched from its upstream: verified, stored, recorded."""
        expected = self._chain.expected(addr, version, d, sums)
        # Another address or protocol (or this one, before the metadata was lost) may have stored the
        # same bytes already: adopted only if they hash to the address. Not with private hosts: a public
        # release whose signed SHA256SUMS lists a private archive's digest (lock files show digests) would
        # otherwise be served the private bytes without ever fetching them.
        stored = None if self._private_hosts else await self._downloader.adopt(expected.sha256)
        if stored is not None:
            hashes = await asyncio.to_thread(self._chain.archive_hashes, addr, version, d, stored.path, expected)
            return stored, await self._record(addr, version, d, stored, hashes)
        # The members are hashed while the archive streams in; at the end only its central directory is read.
        streamed = ZipStreamHasher()

        async def check(pending: PendingArchive, sha256: str) -> PackageHashes:
            self._chain.check_archive(addr, version, d, sha256, expected)
            return await asyncio.to_thread(
                self._chain.archive_hashes, addr, version, d, pending.path, expected, streamed
            )

        async def record(stored: StoredArchive, hashes: PackageHashes) -> None:
            await self._record(addr, version, d, stored, hashes)  # before the followers get the end

        if self.on_fetched is not None:
            self.on_fetched(addr, version, str(d.platform))
        stored, hashes = await self._downloader.download(
            d.download_url,
            self._settings.limits.max_archive_bytes,
            check,
            follow=(keys.archive(addr, version, d.platform), expected.sha256),
            then=record,
            tap=streamed.feed,
        )
        return stored, hashes.record(stored.size, d.filename, unsigned=d.unsigned)

    async def _record(
        self, addr: ProviderAddr, version: Version, d: DownloadInfo, stored: StoredArchive, hashes: PackageHashes
    ) -> ArchiveRecord:
        record = hashes.record(stored.size, d.filename, unsigned=d.unsigned)
        await self._documents.put_record(keys.archive(addr, version, d.platform), record)
        log.info(
            "archive.stored",
            provider=str(addr),
            version=str(version),
            platform=str(d.platform),
            sha256=record.sha256,
            bytes=stored.size,
        )
        if d.unsigned:
            self._metrics.unsigned_archives.labels(str(addr.hostname)).inc()
            log.warning(
                "archive.unsigned_stored",
                provider=str(addr),
                version=str(version),
                platform=str(d.platform),
                sha256=record.sha256,
                host=str(addr.hostname),
                policy=str(self._chain.policy),
                checked="SHA256SUMS (over verified TLS) and the registry's shasum; no signature: "
                "the registry lists no signing keys",
            )
        return record

    def _relay(
        self,
        addr: ProviderAddr,
        version: Version,
        d: DownloadInfo,
        expected: Hash,
        reason: str,
        sent: tuple[int, str] = (0, ""),
    ) -> UpstreamRelay:
        """The archive relayed from the upstream unstored, verified on the way; with `sent=(length, sha256)`,
        only the bytes after the first `length`, which a client has already (their SHA-256 `sha256`)."""
        length, sent_sha256 = sent
        if self.on_fetched is not None:
            self.on_fetched(addr, version, str(d.platform))
        log.info(
            "archive.passthrough",
            provider=str(addr),
            version=str(version),
            platform=str(d.platform),
            reason=reason,
            already_sent=length,
        )
        return self._downloader.pass_through(
            d.download_url,
            max_bytes=self._settings.limits.max_archive_bytes,
            algorithm="sha256",
            kind="provider",
            check=lambda sha256: self._chain.check_archive(addr, version, d, sha256, expected),
            etag=expected.sha256,
            skip=(length, lambda sha256: self._chain.check_sent(addr, version, d, length, sha256, sent_sha256))
            if length
            else None,
        )
