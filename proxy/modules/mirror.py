"""The module service: pass-through of `modules.v1` with module sources cached by the proxy.

The download answer points clients at the proxy's own archive URL (with any `//subdir`
kept). The archive is made on first request, once per fleet: an https archive is fetched
as it is; a git source is cloned at its ref and packed into a deterministic `.tar.gz`.
Either is checked (readable, nothing unpacks outside the module directory, within the size,
unpacked-size and entry limits) before it is stored, content-addressed, in the same store as provider archives.
Module sources carry no signature: integrity rests on TLS to the source host. While the
disk is full, only an https archive with a `?checksum=` pin can be served (relayed unstored,
its last chunk held back until the pin matched); any other answers 503.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog
from yarl import URL

from proxy.domain import module_sources
from proxy.domain.addresses import ModuleAddr, Version
from proxy.domain.module_sources import GitSource, HttpArchive, ModuleSource, Refused
from proxy.errors import (
    ChecksumMismatchError,
    DiskFullError,
    ModuleNotCachedError,
    ModuleSourceRefusedError,
    UpstreamTooLargeError,
    VerificationError,
    VersionNotFoundError,
)
from proxy.metadata_store import CacheEntry, keys
from proxy.metadata_store.records import ModuleRecord
from proxy.modules.git_sources import GitFetcher
from proxy.modules.metadata import module_versions
from proxy.modules.packing import ArchiveError, ArchiveTooLargeError, check_archive
from proxy.protocol import module_registry
from proxy.protocol.offers import RecheckGate, listed
from proxy.protocol.proxy_urls import module_archive_path
from proxy.runtime import deadline
from proxy.runtime.log import note_cache
from proxy.runtime.metrics import Metrics
from proxy.runtime.security_events import security_event
from proxy.services.documents import DocumentCache
from proxy.services.downloader import Downloader
from proxy.services.relay import UpstreamRelay
from proxy.services.shared_fetches import SharedFetches
from proxy.settings.config import Settings
from proxy.storage import ArchiveStore, DiskSpace, StoredArchive, file_digest, sha256_file

log = structlog.get_logger(__name__)


class ModuleMirror:
    """Module registry pass-through with cached module sources."""

    def __init__(
        self,
        settings: Settings,
        documents: DocumentCache,
        downloader: Downloader,
        shared_fetches: SharedFetches,
        git: GitFetcher,
        *,
        store: ArchiveStore,
        space: DiskSpace,
        metrics: Metrics,
    ) -> None:
        self._settings = settings
        self._documents = documents
        self._downloader = downloader
        self._shared_fetches = shared_fetches
        self._git = git
        self._store = store
        self._space = space
        self._metrics = metrics
        self._passthrough = settings.modules.module_passthrough
        self._max_bytes = settings.modules.max_module_bytes
        self._max_unpacked_bytes = settings.modules.max_module_unpacked_bytes
        self._max_entries = settings.modules.max_module_entries
        self._rechecks = RecheckGate(settings.freshness.negative)
        self.on_fetched: Callable[[ModuleAddr, Version, str | None], None] | None = None  # the audit trail

    async def versions(self, addr: ModuleAddr) -> frozenset[Version]:
        """The module's versions in its registry's list."""
        return (await self._versions_entry(addr))[1]

    async def versions_document(self, addr: ModuleAddr) -> bytes:
        """The upstream's `versions` answer, byte for byte."""
        return (await self._versions_entry(addr))[0].body

    async def _versions_entry(
        self, addr: ModuleAddr, max_age: float | None = None
    ) -> tuple[CacheEntry, frozenset[Version]]:
        return await module_versions(self._settings, self._documents, addr, max_age)

    async def _require_version(self, addr: ModuleAddr, version: Version) -> None:
        """404 unless the module's version list has `version`, before any per-version upstream request.

        A list missing it is refetched at most once per `--ttl-negative` (it may have been published since).
        """

        async def load(max_age: float | None) -> frozenset[Version]:
            return (await self._versions_entry(addr, max_age))[1]

        key = keys.module_versions(addr)
        if version not in await listed(load, lambda versions: version not in versions, self._rechecks, key):
            raise VersionNotFoundError(f"module {addr} has no version {version}")

    async def location(self, addr: ModuleAddr, version: Version) -> str:
        """What the client should download: the proxy's archive URL, or a passed-through source."""
        await self._require_version(addr, version)
        source = await self._source(addr, version)
        if isinstance(source, HttpArchive | GitSource):
            path = module_archive_path(addr, version, module_sources.FILE_EXTENSIONS[source.archive])
            return module_sources.proxied_location(path, source)
        if isinstance(source, Refused):
            log.warning("module.source_refused", module=str(addr), version=str(version), reason=source.reason)
            raise ModuleSourceRefusedError(f"module {addr} {version}: upstream source refused: {source.reason}")
        if self._passthrough == "deny":
            raise ModuleSourceRefusedError(
                f"module {addr} {version}: its source is a {source.kind} location, which this proxy does not "
                "cache, and --module-passthrough=deny forbids handing it out"
            )
        log.info("module.passthrough", module=str(addr), version=str(version), kind=source.kind)
        return source.location

    async def archive(self, addr: ModuleAddr, version: Version) -> tuple[StoredArchive | UpstreamRelay, ModuleRecord]:
        """The cached module archive, made once per fleet on first request (relayed if the disk is full)."""
        self._documents.check_allowed(addr.hostname)
        found = await self._stored(addr, version)
        if found is not None:
            note_cache("hit")
            return found
        await self._require_version(addr, version)
        await self._source(addr, version)  # the metadata step, waited for within the request deadline
        try:
            with deadline.unbounded():  # the download or clone is bounded by its own rate rules and timeouts
                found = await self._shared_fetches.once_for_the_fleet(
                    keys.module(addr, version), lambda: self._stored(addr, version), lambda: self._make(addr, version)
                )
        except DiskFullError as exc:
            return await self._pass_through(addr, version, exc)
        note_cache("miss")
        return found

    async def _pass_through(
        self, addr: ModuleAddr, version: Version, exc: DiskFullError
    ) -> tuple[UpstreamRelay, ModuleRecord]:
        """A pinned https archive relayed unstored; anything else cannot be verified without storing it."""
        source = await self._source(addr, version)
        if not isinstance(source, HttpArchive) or source.checksum is None:
            raise DiskFullError(
                f"module {addr} {version}: the proxy's disk is full, and this module's source is not "
                "an https archive with a ?checksum= pin, so it cannot be checked without storing it; "
                f"free space on the proxy and retry ({exc.message})"
            )
        algorithm, pin = source.checksum
        log.info("archive.passthrough", module=str(addr), version=str(version), reason=exc.message)
        relay = self._downloader.pass_through(
            URL(source.url, encoded=True),
            max_bytes=self._max_bytes,
            algorithm=algorithm,
            kind="module",
            check=lambda actual: self._compare_pin(actual, (algorithm, pin), addr),
            etag=pin if algorithm == "sha256" else None,
        )
        return relay, ModuleRecord(pin if algorithm == "sha256" else "", 0, source.archive, source.url)

    async def _source(self, addr: ModuleAddr, version: Version) -> ModuleSource:
        self._documents.check_allowed(addr.hostname)
        base = await self._documents.service_url(addr.hostname, "modules.v1")
        url = module_registry.download_url(base, addr, version)

        def parse(entry: CacheEntry) -> ModuleSource:
            return _classify(module_registry.parse_download(entry.status, entry.terraform_get, entry.body, addr), url)

        source = (await self._documents.document(keys.module_download(addr, version), url, ttl=None, parse=parse))[1]
        if source is None:
            raise VersionNotFoundError(f"module {addr} has no version {version}")
        return source

    async def _stored(self, addr: ModuleAddr, version: Version) -> tuple[StoredArchive, ModuleRecord] | None:
        return await self._downloader.stored(await self._documents.record(keys.module(addr, version), ModuleRecord))

    async def _make(self, addr: ModuleAddr, version: Version) -> tuple[StoredArchive, ModuleRecord]:
        source = await self._source(addr, version)
        if self.on_fetched is not None and isinstance(source, HttpArchive | GitSource):
            self.on_fetched(addr, version, None)
        if isinstance(source, HttpArchive):

            async def check(pending, sha: str) -> None:
                await self._check_checksum(pending.path, source, addr)
                await self._check(pending.path, source.archive, addr)

            stored, _ = await self._downloader.download(URL(source.url, encoded=True), self._max_bytes, check)
            record = ModuleRecord(stored.sha256, stored.size, source.archive, source.url)
        elif isinstance(source, GitSource):
            self._documents.require_online(f"module {addr} {version}")
            await self._space.require_room(f"module {addr} {version}")
            stored, commit = await self._pack_git(addr, source)
            record = ModuleRecord(stored.sha256, stored.size, "tar.gz", f"git::{source.url}?ref={source.ref}", commit)
        else:
            raise ModuleNotCachedError(
                f"module {addr} {version} is not served by this proxy (its source is not cached)"
            )
        await self._documents.put_record(keys.module(addr, version), record)
        log.info(
            "module.stored",
            module=str(addr),
            version=str(version),
            sha256=record.sha256,
            bytes=record.size,
            source=record.source,
            commit=record.commit or None,
        )
        return stored, record

    async def _pack_git(self, addr: ModuleAddr, source: GitSource) -> tuple[StoredArchive, str]:
        store = self._store
        path = await asyncio.to_thread(store.temp_path)
        try:
            packed = await self._git.pack(source.url, source.ref, path)
            await self._check(path, "tar.gz", addr)
            if (await asyncio.to_thread(path.stat)).st_size > self._max_bytes:
                raise UpstreamTooLargeError(
                    f"module {addr}: packed source is larger than the {self._max_bytes}-byte limit"
                )
            sha = await asyncio.to_thread(sha256_file, path)
            stored = await store.publish_path(path, sha)
            self._downloader.note_stored(stored)
            return stored, packed.commit
        except BaseException:
            await asyncio.to_thread(path.unlink, True)
            raise

    async def _check_checksum(self, path, source: HttpArchive, addr: ModuleAddr) -> None:
        """The digest pinned by the module's `?checksum=` must match, as go-getter would insist."""
        if source.checksum is None:
            return
        self._compare_pin(await asyncio.to_thread(file_digest, path, source.checksum[0]), source.checksum, addr)

    def _compare_pin(self, actual: str, checksum: tuple[str, str], addr: ModuleAddr) -> None:
        """Refuse (a security event) an archive whose digest is not the `?checksum=` pin."""
        algorithm, expected = checksum
        if actual != expected:
            security_event(self._metrics, "module_checksum", addr, expected=expected, actual=actual)
            raise ChecksumMismatchError(
                f"module {addr}: archive has {algorithm} {actual}, but its source pins {expected}"
            )

    async def _check(self, path, kind: str, addr: ModuleAddr) -> None:
        try:
            await asyncio.to_thread(check_archive, path, kind, self._max_entries, self._max_unpacked_bytes)
        except ArchiveError as exc:
            security_event(self._metrics, "module_archive", addr, reason=str(exc))
            refused = UpstreamTooLargeError if isinstance(exc, ArchiveTooLargeError) else VerificationError
            raise refused(f"module {addr}: archive refused: {exc}") from None


def _classify(location: str, download: URL) -> ModuleSource:
    if location.startswith(("/", "./", "../")):
        package, subdir = module_sources.split_subdir(location)
        location = module_sources.join_subdir(module_registry.resolve_relative(package, download), subdir)
    return module_sources.classify(location)
