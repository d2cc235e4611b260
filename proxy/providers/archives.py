"""Verified provider archives: from the store while their record holds, else fetched once for the fleet.

A stored archive is served while its record is admitted (`VerificationChain.admit_stored`), agrees
with the release's signed SHA256SUMS (`VerificationChain.agrees`, defence in depth behind the sealed
metadata store) and its file, of the recorded size, is in the store. A missing one is fetched from
the upstream in one place (`ProviderArchives._fetch`), once for the whole fleet: given the package's
download document, the archive streams into a temp file while hashed (`proxy.services.downloader`) as the
release's SHA256SUMS is fetched and verified (`proxy.providers.release_sums`), and once both are done it is
checked by the chain, published to the content-addressed store and recorded. Nothing unverified is
stored or served whole: clients waiting for a cold archive follow its download
(`proxy.services.live_downloads`) once the signed sums are known, its last chunk held back until
verified; while the disk is full, an archive is relayed from the upstream unstored, its last chunk
held back until its SHA-256 matched the signed SHA256SUMS (`proxy.services.relay`); if the disk fills up
during a download, its followers get the rest that way.

A client given a package's download document (the registry protocol) asks for its SHA256SUMS, the
signature and then the archive: `fetch_early` starts the archive's download then, into a temp file only.
A download started early that no client asked for within `EARLY_ARCHIVE_WAIT` is stopped and its temp
file discarded (unless it ended, verified, before), and at most `EARLY_ARCHIVES` run at once.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from proxy.runtime.background import BackgroundTasks
from proxy.runtime.deadline import detached_context
from proxy.runtime.log import note_cache
from proxy.runtime.memo import Memo
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
EARLY_ARCHIVE_WAIT = 10.0  # seconds a download started early waits for a client to ask for its archive
EARLY_ARCHIVES = 4  # downloads started early at once in a process, at most (no more are started early)


class _EarlyDroppedError(Exception):
    """A download started early that no client asked for in time was stopped."""


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
        # archive key → set once a client asks for the archive whose download was started early, while it runs
        self._early: dict[str, asyncio.Event] = {}
        self._started_early: Memo[str, bool] = Memo()  # archive keys `fetch_early` was asked for
        self._early_tasks = BackgroundTasks("archive.early_failed")

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
        d = await self._metadata.download(addr, version, platform)  # waited for within the request deadline
        key = keys.archive(addr, version, platform)
        asked = self._early.get(key)
        if asked is not None:
            asked.set()
        try:
            found_or_growing = await self._fetched(addr, version, d, follow=follow)
        except _EarlyDroppedError:  # asked for just as it was stopped: fetched again
            found_or_growing = await self._fetched(addr, version, d, follow=follow)
        note_cache("miss")
        return found_or_growing

    async def _fetched(
        self, addr: ProviderAddr, version: Version, d: DownloadInfo, *, follow: bool
    ) -> Found | LiveDownload:
        """The archive once the fleet's one download stored it (started now if none runs), or with `follow` its
        download as soon as it grows; the release's SHA256SUMS verified meanwhile, within the request deadline."""
        key = keys.archive(addr, version, d.platform)
        with deadline.unbounded():  # the download itself is bounded by the idle timeout and minimum rate
            flight = asyncio.ensure_future(
                self._shared_fetches.once_for_the_fleet(
                    key, lambda: self._stored(addr, version, d.platform), lambda: self._fetch(addr, version, d)
                )
            )
        try:
            try:
                sums = await self._sums.verified(addr, version, d)  # while the download is under way
            except Exception:  # the download stops too: the error is told once nothing of it is left
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(deadline.remaining()):
                        await asyncio.wait({flight})
                raise
            listed = sums.listed(d) if follow else None
            with deadline.unbounded():
                live = self._downloader.live_downloads
                return await (flight if listed is None else live.result_or_growing(key, listed.sha256, flight))
        finally:
            if not flight.done():  # only this request's wait: the download goes on for the others
                flight.cancel()
            flight.add_done_callback(_retrieved)

    def fetch_early(self, addr: ProviderAddr, version: Version, d: DownloadInfo) -> None:
        """Start the download of a package's archive when a client was given its download document (it asks for
        the archive after the SHA256SUMS and signature), once per archive in this process; detached from the
        request. Stopped if no client asks for the archive within `EARLY_ARCHIVE_WAIT` (`_unless_unasked`)."""
        key = keys.archive(addr, version, d.platform)
        if self._started_early.get(key) or len(self._early) >= EARLY_ARCHIVES or self._settings.upstreams.offline:
            return
        if self._sums.dates_wanted():  # the SHA256SUMS's date may hold the release back: nothing before it
            return
        self._started_early.put(key, True)
        asked = self._early[key] = asyncio.Event()
        self._early_tasks.start(
            self._fetch_early(addr, version, d, asked),
            context=detached_context(),
            then=lambda _: self._early.pop(key, None),
        )

    async def _fetch_early(self, addr: ProviderAddr, version: Version, d: DownloadInfo, asked: asyncio.Event) -> None:
        if await self._stored(addr, version, d.platform) is not None:
            return
        await self._shared_fetches.once_for_the_fleet(
            keys.archive(addr, version, d.platform),
            lambda: self._stored(addr, version, d.platform),
            lambda: self._unless_unasked(addr, version, d, asked),
        )

    async def _unless_unasked(
        self, addr: ProviderAddr, version: Version, d: DownloadInfo, asked: asyncio.Event
    ) -> Found:
        """`_fetch`, stopped (its temp file discarded) if it still runs when no client asked for the archive
        within `EARLY_ARCHIVE_WAIT`."""
        fetch = asyncio.ensure_future(self._fetch(addr, version, d))
        waiting = asyncio.ensure_future(asked.wait())
        try:
            await asyncio.wait({fetch, waiting}, timeout=EARLY_ARCHIVE_WAIT, return_when=asyncio.FIRST_COMPLETED)
            if fetch.done() or asked.is_set():
                return await fetch
            fetch.cancel()
            await asyncio.gather(fetch, return_exceptions=True)
        finally:
            waiting.cancel()
            fetch.cancel()
        if asked.is_set():  # a client asked while it stopped
            return await self._fetch(addr, version, d)
        log.info(
            "archive.early_dropped",
            provider=str(addr),
            version=str(version),
            platform=str(d.platform),
            reason=f"no client asked for it within {EARLY_ARCHIVE_WAIT:g} s of its download document",
        )
        raise _EarlyDroppedError(keys.archive(addr, version, d.platform))

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
        to compare, the sealed record stands, but for a provider a pin selects: its release's signer cannot be
        checked against the pin, so the archive is fetched and verified again (a miss; fails closed)."""
        if PackageHashes.of_record(record) is None:
            reason = "the archive record's hashes do not parse"
        else:
            d = await self._metadata.cached_download(addr, version, platform)
            sums = None if d is None else await self._sums.recorded(addr, d, version)
            if d is None or sums is None:
                if not self._sums.pinned(addr):
                    return True
                log.info("archive.signer_unknown", artifact=f"{addr} {version} {platform}", effect="verified again")
                return False
            if self._chain.agrees(record, d, sums):
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
        """The package's download document and its release's verified SHA256SUMS."""
        d = await self._metadata.download(addr, version, platform)
        return d, await self._sums.verified(addr, version, d)

    async def _expected(self, addr: ProviderAddr, version: Version, platform: Platform) -> tuple[DownloadInfo, Hash]:
        """The package's download document and the hash the signed SHA256SUMS lists for its archive."""
        d, sums = await self._release(addr, version, platform)
        return d, self._chain.expected(addr, version, d, sums)

    async def _fetch(self, addr: ProviderAddr, version: Version, d: DownloadInfo) -> Found:
        """The one place where a provider archive is fetched from its upstream: verified, stored, recorded.

        Unless a copy is in the store already (`_adopted`), the download starts at once, while the release's
        SHA256SUMS are fetched and verified if they are not recorded yet, and is checked after both (stopped as
        soon as they fail). While a policy may hold a release back by their date, they come first."""
        self._chain.admit(addr, version, d)  # nothing is downloaded for a package the chain would refuse
        recorded = await self._sums.recorded(addr, d, version)
        if recorded is None and self._sums.dates_wanted():  # their date may hold the release back: them first
            recorded = await self._sums.verified(addr, version, d)
        stored = await self._adopted(addr, version, d, recorded)
        if stored is not None:
            return stored
        sums = asyncio.ensure_future(self._sums.verified(addr, version, d))
        try:
            return await self._download(addr, version, d, sums)
        finally:
            if not sums.done():  # only this wait: the SHA256SUMS go on being fetched for their own requests
                sums.cancel()
            sums.add_done_callback(_retrieved)

    async def _adopted(
        self, addr: ProviderAddr, version: Version, d: DownloadInfo, recorded: SignedSums | None
    ) -> Found | None:
        """Another address or protocol (or this one, before the metadata was lost) may have stored the same bytes
        already: adopted only if they hash to the address (the registry's shasum, which the signed SHA256SUMS
        must list: they are verified first if `recorded` is None). Not with private hosts: a public release
        whose signed SHA256SUMS lists a private archive's digest (lock files show digests) would otherwise be
        served the private bytes without ever fetching them."""
        stored = None if self._private_hosts else await self._downloader.adopt(d.shasum.sha256)
        if stored is None:
            return None
        expected = self._chain.expected(addr, version, d, recorded or await self._sums.verified(addr, version, d))
        hashes = await asyncio.to_thread(self._chain.archive_hashes, addr, version, d, stored.path, expected)
        return stored, await self._record(addr, version, d, stored, hashes)

    async def _download(
        self, addr: ProviderAddr, version: Version, d: DownloadInfo, sums: asyncio.Future[SignedSums]
    ) -> Found:
        """The archive streamed into a temp file while `sums` are verified; checked against them, stored, recorded."""
        # The members are hashed while the archive streams in; at the end only its central directory is read.
        streamed = ZipStreamHasher()

        async def expected() -> Hash:
            return self._chain.expected(addr, version, d, await sums)

        listed = asyncio.ensure_future(expected())
        sha256 = asyncio.ensure_future(_sha256_of(listed))

        async def check(pending: PendingArchive, sha256: str) -> PackageHashes:
            want = await listed  # raises what the SHA256SUMS's verification raised: the download is discarded
            self._chain.check_archive(addr, version, d, sha256, want)
            return await asyncio.to_thread(self._chain.archive_hashes, addr, version, d, pending.path, want, streamed)

        async def record(stored: StoredArchive, hashes: PackageHashes) -> None:
            await self._record(addr, version, d, stored, hashes)  # before the followers get the end

        if self.on_fetched is not None:
            self.on_fetched(addr, version, str(d.platform))
        download = asyncio.ensure_future(
            self._downloader.download(
                d.download_url,
                self._settings.limits.max_archive_bytes,
                check,
                follow=(keys.archive(addr, version, d.platform), sha256),
                then=record,
                tap=streamed.feed,
            )
        )
        try:
            await asyncio.wait({download, listed}, return_when=asyncio.FIRST_COMPLETED)
            if not download.done() and _failed(listed):  # it can never be verified: not downloaded further
                download.cancel()
                await asyncio.gather(download, return_exceptions=True)
                listed.result()
            stored, hashes = await download
        finally:
            for future in (download, sha256, listed):
                future.cancel()
                future.add_done_callback(_retrieved)
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


async def _sha256_of(listed: asyncio.Future[Hash]) -> str:
    return (await asyncio.shield(listed)).sha256


def _failed(future: asyncio.Future) -> bool:
    return future.done() and not future.cancelled() and future.exception() is not None


def _retrieved(future: asyncio.Future) -> None:
    """Mark a future's outcome as seen (its error is raised, or logged, where it matters)."""
    if not future.cancelled():
        future.exception()
