"""Cold archives streamed while they download: followers read the temp file as it grows.

A download whose length is known up front (the upstream's Content-Length) is announced as a
`LiveDownload` under its flight key while the `Downloader` writes it into a temp file of the
store. Every request waiting for that archive in this process follows it (`LiveDownload.relay`):
it reads the bytes written so far from the temp file (through its own descriptor, which survives
the rename at publication) and passes them on, always `HOLD_BACK` bytes behind the end of the
archive, so the last chunk stays with the proxy until both

- the download's SHA-256 matched the signed sum, the file was published and recorded, and
- the follower's own SHA-256 of every byte it read matches the same sum.

On a failure (tampered bytes, an upstream error, shutdown) the follower raises with the last
chunk unsent: the web layer aborts the connection, so a client never holds an unverified
archive whole (`Content-Length` is the expected size, so the short body is detectable).
A download that fails because the disk filled up is no reason to cut the followers short:
given a `rest` relay, a follower goes on with the upstream's bytes after those it sent, relayed
unstored and verified as a whole (the bytes sent must be the relay's first ones too). So does a
follower of another process's download that ended unverified (the reason stays in that process)
once it sent some of it; before that, the request looks the archive up again (`web/archive_responses.py`).

Other worker processes and replicas sharing the archive store follow the same temp file
through the notices of `proxy.services.download_notices` (`LiveDownloads`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import structlog

from proxy.errors import (
    ChecksumMismatchError,
    DiskFullError,
    FollowedDownloadLostError,
    ShuttingDownError,
    VerificationError,
)
from proxy.services.download_notices import DownloadNotices, Notice, owner_alive
from proxy.services.relay import Begin, Send, UpstreamRelay

Rest = Callable[[int, str], UpstreamRelay]  # (bytes sent so far, their SHA-256) → a relay of the bytes after them

HOLD_BACK = 1 << 20  # the end of an archive, sent only once it is verified: the upstream client's largest read
READ_CHUNK = 1 << 18
T = TypeVar("T")
log = structlog.get_logger(__name__)


class LiveDownload:
    """A temp file being downloaded: how much of it is written, and whether it was verified or failed."""

    def __init__(self, path: Path, size: int, sha256: str) -> None:
        self.path = path
        self.size = size
        self.sha256 = sha256
        self.written = 0
        self.verified = False
        self.error: Exception | None = None
        self._moved = asyncio.Event()

    @property
    def done(self) -> bool:
        return self.verified or self.error is not None

    def advance(self, length: int) -> None:
        """`length` more bytes are in the file (flushed)."""
        self.written += length
        self._wake()

    def publish(self, path: Path) -> None:
        """The download matched its signed sum and is published at `path`: followers may send the end."""
        self.path = path
        self.verified = True
        self._wake()

    def fail(self, error: BaseException) -> None:
        """The download failed: followers abort with the end unsent."""
        if not self.done:
            self.error = (
                error
                if isinstance(error, Exception)
                else ShuttingDownError("the proxy is shutting down and stopped this download; retry")
            )
        self._wake()

    def relay(self, rest: Rest | None = None) -> UpstreamRelay:
        """The archive for one client, sent as it is written, its end held back until verified; if the disk
        fills up, the bytes after those sent come from `rest` instead."""

        async def stream(begin: Begin, send: Send) -> None:
            await self._follow(begin, send, rest)

        return UpstreamRelay(self.sha256, stream, self.size, stored_as=self.sha256)

    async def _follow(self, begin: Begin, send: Send, rest: Rest | None) -> None:
        await begin(self.size)
        descriptor = await self._open()
        try:
            digest, sent = hashlib.sha256(), 0
            while sent < self.size:
                moved = self._moved
                end = self.size if self.verified else max(min(self.written, self.size - HOLD_BACK), 0)
                if sent < end:
                    chunk = await asyncio.to_thread(_read_hashed, descriptor, min(end - sent, READ_CHUNK), sent, digest)
                    if sent + len(chunk) == self.size and digest.hexdigest() != self.sha256:
                        raise ChecksumMismatchError(f"the downloaded archive does not hash to {self.sha256}")
                    await send(chunk)
                    sent += len(chunk)
                elif self.error is not None:
                    if rest is None or not _rest_relayed(self.error, sent):
                        raise self.error
                    log.info("archive.rest_relayed", sent_bytes=sent, size=self.size, reason=self.error.message)
                    await rest(sent, digest.hexdigest()).stream(_begun, send)
                    return
                else:
                    await moved.wait()
        finally:
            os.close(descriptor)

    async def _open(self) -> int:
        """A descriptor of the file, wherever it is now (the temp file, or where it was published)."""
        while True:
            moved, path = self._moved, self.path
            try:
                return await asyncio.to_thread(os.open, path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
            except FileNotFoundError:
                if self.error is not None:
                    raise self.error from None
                if self.verified and path == self.path:  # published elsewhere (object storage): look it up
                    raise FollowedDownloadLostError(
                        "the downloaded archive was published before this request opened it; retry"
                    ) from None
            if path == self.path:
                await moved.wait()  # renamed, and `publish` has not told us where to yet

    def _wake(self) -> None:
        moved, self._moved = self._moved, asyncio.Event()
        moved.set()


class LiveDownloads:
    """The growing files of this process by flight key, and the requests waiting for one to start.

    With `notices`, the downloads of this process are posted for the other processes sharing the
    archive store, and a waiting request also looks for theirs (every `poll` seconds): it follows
    the other process's temp file as its size grows, until the other process's notice lock goes
    away: with the archive at its content address (`published`), or failed.
    Notices are tiny files, posted and taken down inline, so a cancelled task cannot leave one behind.
    """

    def __init__(
        self, notices: DownloadNotices | None = None, published: Callable[[str], Path] | None = None, poll: float = 0.02
    ) -> None:
        self._growing: dict[str, LiveDownload] = {}
        self._waiting: dict[str, list[asyncio.Future[LiveDownload]]] = {}
        self._notices = notices
        self._published = published
        self._poll = poll
        self._posted: dict[str, tuple[LiveDownload, int]] = {}
        self._watchers: set[asyncio.Task[None]] = set()

    def announce(self, key: str, growing: LiveDownload) -> None:
        """`growing` is the download of `key`: wake the requests waiting for it, here and elsewhere."""
        self._announce_here(key, growing)
        if self._notices is None:
            return
        try:
            descriptor = self._notices.post(key, Notice(growing.path, growing.size, growing.sha256))
        except OSError as exc:  # other processes wait for the stored archive instead
            log.warning("archive.notice_failed", key=key, error=str(exc))
            return
        self._posted[key] = (growing, descriptor)

    def withdraw(self, key: str, growing: LiveDownload) -> None:
        """The download of `key` ended (after `publish` or `fail`)."""
        self._withdraw_here(key, growing)
        posted = self._posted.get(key)
        if posted is not None and posted[0] is growing and self._notices is not None:
            del self._posted[key]
            self._notices.take_down(key, posted[1])

    async def started(self, key: str, sha256: str) -> LiveDownload:
        """The growing file of `key`, as soon as one is announced here or posted by another process."""
        waiter: asyncio.Future[LiveDownload] = asyncio.get_running_loop().create_future()
        waiters = self._waiting.setdefault(key, [])
        waiters.append(waiter)
        try:
            while True:
                growing = self._growing.get(key) or self._follow_posted(key, sha256)
                if growing is not None:
                    return growing
                with contextlib.suppress(TimeoutError):
                    return await asyncio.wait_for(asyncio.shield(waiter), self._poll)
        finally:
            if waiter in waiters:
                waiters.remove(waiter)
            if not waiters and self._waiting.get(key) is waiters:
                del self._waiting[key]

    async def close(self) -> None:
        """Stop following other processes' downloads (their followers here abort)."""
        for watcher in self._watchers:
            watcher.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)

    def _announce_here(self, key: str, growing: LiveDownload) -> None:
        self._growing[key] = growing
        for waiter in self._waiting.pop(key, []):
            if not waiter.done():
                waiter.set_result(growing)

    def _withdraw_here(self, key: str, growing: LiveDownload) -> None:
        if self._growing.get(key) is growing:
            del self._growing[key]

    def _follow_posted(self, key: str, sha256: str) -> LiveDownload | None:
        """Another process's download of `key`, if it posted one for the archive expected here."""
        found = self._notices.read(key) if self._notices is not None and self._published is not None else None
        if found is None:
            return None
        notice, descriptor = found
        if notice.sha256 != sha256:
            os.close(descriptor)
            return None
        growing = LiveDownload(notice.path, notice.size, notice.sha256)
        self._announce_here(key, growing)
        log.info("archive.following_another_process", key=key, temp_file=notice.path.name)
        watcher = asyncio.get_running_loop().create_task(self._watch(key, growing, descriptor))
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)
        return growing

    async def _watch(self, key: str, growing: LiveDownload, descriptor: int) -> None:
        """Mirror another process's download into `growing`: its size, its publication or its end."""
        assert self._published is not None
        final = self._published(growing.sha256)
        try:
            while not growing.done:
                alive, published, size = await asyncio.to_thread(_probe, descriptor, growing.path, final, growing.size)
                if not alive and published:  # the owner recorded it before it let its notice go
                    growing.publish(final)
                elif not alive:
                    growing.fail(
                        FollowedDownloadLostError(
                            "the download this request followed ended without a "
                            "verified archive in another proxy process; retry"
                        )
                    )
                elif size > growing.written:
                    growing.advance(size - growing.written)
                else:
                    await asyncio.sleep(self._poll)
        except BaseException as exc:
            growing.fail(exc)
            raise
        finally:
            os.close(descriptor)
            self._withdraw_here(key, growing)

    async def result_or_growing(self, key: str, sha256: str, flight: Awaitable[T]) -> T | LiveDownload:
        """What `flight` returns, or the growing download of `key` (to hash to `sha256`) if it starts first;
        the flight goes on either way."""
        result = asyncio.ensure_future(flight)
        growing = asyncio.ensure_future(self.started(key, sha256))
        try:
            await asyncio.wait({result, growing}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (result, growing):
                if not task.done():
                    task.cancel()
        if result.done() and not result.cancelled():
            return result.result()
        if growing.done() and not growing.cancelled():
            return growing.result()
        return await result  # re-raises the cancellation


def _rest_relayed(error: Exception, sent: int) -> bool:
    """Whether a follower that sent `sent` bytes goes on with a relay after `error` ended the download."""
    return isinstance(error, DiskFullError) or (isinstance(error, FollowedDownloadLostError) and sent > 0)


async def _begun(length: int | None) -> None:
    """The answer's length was given already (the archive's, which the rest relay must complete)."""


def _read_hashed(descriptor: int, length: int, offset: int, digest: hashlib._Hash) -> bytes:
    """Up to `length` bytes at `offset`, added to `digest` (in a worker thread, like the read)."""
    chunk = os.pread(descriptor, length, offset)
    if not chunk:
        raise VerificationError("the archive being downloaded is shorter than announced")
    digest.update(chunk)
    return chunk


def _probe(descriptor: int, path: Path, final: Path, size: int) -> tuple[bool, bool, int]:
    """Another process's download: whether it is alive, whether it was published, and its size so far.

    Published is checked after alive: the owner publishes (and records) before it lets its notice go."""
    alive = owner_alive(descriptor)
    try:
        published = final.stat().st_size == size
    except FileNotFoundError:
        published = False
    try:
        written = path.stat().st_size
    except FileNotFoundError:
        written = 0
    return alive, published, min(written, size)
