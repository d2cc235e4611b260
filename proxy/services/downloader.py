"""Archives into the store: verified downloads, verified relays while the disk is full, and lookups.

`Downloader.download` streams a URL into a temp file of the archive store while hashing it,
lets the caller check it, and only then publishes it; when the disk is full (below the
`--min-free-space` floor, or a write fails for lack of space) it raises DiskFullError instead,
and `Downloader.pass_through` relays the archive to the client unstored, verified on the way.
`Downloader.stored` is the one "already stored and intact" check of providers and modules.
A download given `follow=(key, sha256)` whose length the upstream announced is readable while it
grows (`proxy.services.live_downloads`): `Downloader.live_downloads` finds it by `key` for the requests waiting for it.
Downloads have upstream slots of their own, shared fairly between hosts.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

import structlog
from yarl import URL

from proxy.runtime.metrics import Metrics
from proxy.runtime.upstream_slots import HostSlots
from proxy.services.documents import require_online
from proxy.services.download_notices import DownloadNotices
from proxy.services.live_downloads import LiveDownload, LiveDownloads
from proxy.services.relay import Begin, Send, UpstreamRelay
from proxy.settings.config import Settings
from proxy.storage import ArchiveGuard, ArchiveStore, DiskSpace, PendingArchive, StoredArchive, is_disk_full
from proxy.upstream.client import UpstreamClient

log = structlog.get_logger(__name__)
T = TypeVar("T")


class ArchiveFacts(Protocol):
    """What a record says about its archive file (`ArchiveRecord`, `ModuleRecord`)."""

    @property
    def sha256(self) -> str: ...

    @property
    def size(self) -> int: ...


F = TypeVar("F", bound=ArchiveFacts)


class Downloader:
    """Verified downloads into the archive store, and relays of what cannot be stored."""

    def __init__(
        self,
        settings: Settings,
        upstream: UpstreamClient,
        store: ArchiveStore,
        guard: ArchiveGuard,
        space: DiskSpace,
        metrics: Metrics,
    ) -> None:
        self._settings = settings
        self._upstream = upstream
        self._store = store
        self._guard = guard
        self._space = space
        self._metrics = metrics
        self._slots = HostSlots.for_upstream(settings.limits)
        self.on_stored: Callable[[StoredArchive], None] | None = None  # e.g. the store's size cap
        # Other processes follow a download through its temp file only where they would find the archive
        # published as a local file too (a shared directory); with object storage they wait for the upload.
        self.live_downloads = (
            LiveDownloads(DownloadNotices(store.root / "growing", store.temp_root), store.path_for)
            if store.local
            else LiveDownloads()
        )

    async def close(self) -> None:
        """Stop following other processes' downloads."""
        await self.live_downloads.close()

    async def stored(self, record: F | None) -> tuple[StoredArchive, F] | None:
        """The archive a verified record names, if its file, of the recorded size, is in the store."""
        if record is None:
            return None
        stored = await self._guard.lookup(record.sha256, record.size)
        return None if stored is None else (stored, record)

    async def adopt(self, sha256: str) -> StoredArchive | None:
        """A file already at this content address (stored for another address or protocol, or before its
        metadata was lost), taken only if it hashes to the address."""
        return await self._guard.adopt(sha256)

    async def download(
        self,
        url: URL,
        max_bytes: int,
        check: Callable[[PendingArchive, str], Awaitable[T]],
        *,
        follow: tuple[str, asyncio.Future[str]] | None = None,
        then: Callable[[StoredArchive, T], Awaitable[None]] | None = None,
        tap: Callable[[bytes], None] | None = None,
    ) -> tuple[StoredArchive, T]:
        """Stream `url` into a temp file, run `check(pending, sha256)` (raise to refuse), publish, then
        run `then(stored, result)` (e.g. record it).

        `tap(chunk)` (blocking, e.g. a hash; it should not raise) sees every chunk in order, in a worker
        thread of its own pipelined with the writes, and has seen them all when `check` runs.

        With `follow=(key, expected sha256)` and a Content-Length from the upstream, the temp file is
        announced under `key` in `growing` once there is room for it, for requests to follow; they get
        the end of the archive once `then` is done. The expected sha256 is a future (the download may
        start before the signed sums are verified): the file is announced once it is known, if ever.

        Raises DiskFullError, leaving no temp file behind, when the disk is below the free-space
        floor (before or, by the upstream's Content-Length, during the download) or a write fails
        for lack of space."""
        what = str(url.with_query(None))
        require_online(self._settings, what)
        await self._space.require_room(what)
        try:
            return await self._download(url, what, max_bytes, check, follow, then, tap)
        except OSError as exc:
            error = self._disk_full_or(exc, what)
            if error is exc:
                raise
            raise error from None

    async def _download(
        self,
        url: URL,
        what: str,
        max_bytes: int,
        check: Callable[[PendingArchive, str], Awaitable[T]],
        follow: tuple[str, asyncio.Future[str]] | None,
        then: Callable[[StoredArchive, T], Awaitable[None]] | None,
        tap: Callable[[bytes], None] | None,
    ) -> tuple[StoredArchive, T]:
        pending: PendingArchive = await asyncio.to_thread(self._store.begin)
        growing: LiveDownload | None = None
        announcing: asyncio.Future[None] | None = None
        written = 0
        tapped = _Tap(tap) if tap is not None else None
        try:

            async def sink(chunk: bytes) -> None:
                nonlocal written
                await asyncio.to_thread(pending.write, chunk)
                written += len(chunk)
                if growing is not None:
                    growing.advance(len(chunk))
                if tapped is not None:
                    await tapped.put(chunk)

            async def announce_once_known(key: str, length: int, sha256: asyncio.Future[str]) -> None:
                nonlocal growing
                with contextlib.suppress(Exception):  # unknown for good: the check refuses the download
                    growing = LiveDownload(pending.path, length, await asyncio.shield(sha256))
                    growing.advance(written)
                    self.live_downloads.announce(key, growing)

            async def room(length: int | None) -> None:
                nonlocal announcing
                if length:
                    await self._space.require_room(what, length)
                if length and follow is not None:
                    key, sha256 = follow
                    announcing = asyncio.ensure_future(announce_once_known(key, length, sha256))

            async with self._slots.hold(url, self._settings.limits.download_slot_wait, str(url.with_query(None))):
                await self._upstream.download(url, sink, max_bytes=max_bytes, on_response=room)
            self._metrics.upstream_fetches.labels("archive", "200").inc()
            self._metrics.upstream_bytes.inc(pending.size)
            if announcing is not None:  # followers may join from here until it is published
                await announcing
            # The file is fsynced while the tap catches up and it is checked (e.g. its zip's central directory
            # read from the page cache), and published only once both are done.
            synced = asyncio.ensure_future(asyncio.to_thread(pending.finish))
            try:
                if tapped is not None:
                    await tapped.drain()
                result = await check(pending, pending.sha256())
            except BaseException:
                await asyncio.gather(synced, return_exceptions=True)
                raise
            actual = await synced
            stored = await self._store.publish(pending, actual)
            self.note_stored(stored)
            if then is not None:
                await then(stored, result)
            if growing is not None:
                growing.publish(stored.path or pending.path)  # in object storage: no local file
            return stored, result
        except BaseException as exc:
            error = self._disk_full_or(exc, what)
            try:
                await asyncio.to_thread(pending.discard)
            finally:  # followers learn of the failure once nothing of the download is left
                if growing is not None:
                    growing.fail(error)
            if error is not exc:
                raise error from None
            raise
        finally:
            if tapped is not None:
                tapped.cancel()
            if announcing is not None:
                announcing.cancel()
            if growing is not None and follow is not None:
                self.live_downloads.withdraw(follow[0], growing)

    def note_stored(self, stored: StoredArchive) -> None:
        """An archive was published (here, or by a producer writing its own file, e.g. a packed git module):
        tell `on_stored`, the store's size cap."""
        if self.on_stored is not None:
            self.on_stored(stored)

    def _disk_full_or(self, exc: BaseException, what: str) -> BaseException:
        """A write that failed for lack of space as the DiskFullError it means; any other error as it is."""
        return self._space.full(exc, f"store {what}") if isinstance(exc, OSError) and is_disk_full(exc) else exc

    def pass_through(
        self,
        url: URL,
        *,
        max_bytes: int,
        algorithm: str,
        kind: str,
        check: Callable[[str], None],
        etag: str | None,
        skip: tuple[int, Callable[[str], None]] | None = None,
    ) -> UpstreamRelay:
        """A relay of `url` that stores nothing; `check(hexdigest)` (raise to refuse) runs before the last chunk.

        With `skip=(length, check_sent)`, the first `length` bytes are not sent (a client has them already,
        e.g. from a download that failed midway): `check_sent(hexdigest of them)` runs before anything
        is (raise if they are not the ones sent)."""

        async def stream(begin: Begin, send: Send) -> None:
            await self._relay(url, max_bytes, algorithm, kind, check, skip or (0, _nothing_skipped), begin, send)

        return UpstreamRelay(etag, stream)

    async def _relay(
        self,
        url: URL,
        max_bytes: int,
        algorithm: str,
        kind: str,
        check: Callable[[str], None],
        skip: tuple[int, Callable[[str], None]],
        begin: Begin,
        send: Send,
    ) -> None:
        require_online(self._settings, str(url.with_query(None)))
        digest = hashlib.new(algorithm)
        skipped, check_skipped = skip
        sent_before = hashlib.new(algorithm)  # of the skipped bytes
        held = b""
        outcome = "error"
        size = 0

        async def sink(chunk: bytes) -> None:
            nonlocal held, size, outcome
            digest.update(chunk)
            start, size = size, size + len(chunk)
            if start < skipped:
                sent_before.update(chunk[: skipped - start])
                if size < skipped:
                    return
                outcome = "verification_failed"
                check_skipped(sent_before.hexdigest())
                outcome = "error"
                chunk = chunk[skipped - start :]
            if held:
                await send(held)
            held = chunk  # the newest chunk waits until the digest is known

        try:
            async with self._slots.hold(url, self._settings.limits.download_slot_wait, str(url.with_query(None))):
                await self._upstream.download(url, sink, max_bytes=max_bytes, on_response=begin)
            self._metrics.upstream_fetches.labels("archive", "200").inc()
            self._metrics.upstream_bytes.inc(size)
            outcome = "verification_failed"
            if size < skipped:
                check_skipped(sent_before.hexdigest())  # shorter than what was sent already: never a match
            check(digest.hexdigest())
            outcome = "error"
            if held:
                await send(held)
            outcome = "complete"
        finally:
            self._metrics.passthrough.labels(kind, outcome).inc()
            log.info("archive.passthrough_done", url=str(url.with_query(None)), kind=kind, outcome=outcome)


def _nothing_skipped(hexdigest: str) -> None:
    """`skip`'s check when no bytes are skipped."""


class _Tap:
    """Chunks handed to a blocking function in a worker thread, in order, a few chunks behind the writes."""

    def __init__(self, tap: Callable[[bytes], None], depth: int = 4) -> None:
        self._tap = tap
        self._chunks: asyncio.Queue[bytes | None] = asyncio.Queue(depth)
        self._worker = asyncio.ensure_future(self._run())

    async def put(self, chunk: bytes) -> None:
        """Queue a chunk; waits while `depth` chunks are queued (memory stays bounded)."""
        await self._chunks.put(chunk)

    async def drain(self) -> None:
        """Wait until the function has seen every chunk."""
        await self._chunks.put(None)
        await self._worker

    def cancel(self) -> None:
        self._worker.cancel()

    async def _run(self) -> None:
        failed = False
        while (chunk := await self._chunks.get()) is not None:
            if failed:
                continue  # still taken off the queue, so the download never waits for a dead tap
            try:
                await asyncio.to_thread(self._tap, chunk)
            except Exception as exc:  # the tap's user sees it incomplete (e.g. no streamed hash: hashed later)
                failed = True
                log.warning("archive.tap_failed", error=str(exc))
