"""Cold archives streamed while they download: followers read the temp file as it grows.

A download whose length is known up front (the upstream's Content-Length) is announced as a
`GrowingFile` under its flight key while the `Downloader` writes it into a temp file of the
store. Every request waiting for that archive in this process follows it (`GrowingFile.relay`):
it reads the bytes written so far from the temp file (through its own descriptor, which survives
the rename at publication) and passes them on, always `HOLD_BACK` bytes behind the end of the
archive, so the last chunk stays with the proxy until both

- the download's SHA-256 matched the signed sum and the file was published, and
- the follower's own SHA-256 of every byte it read matches the same sum.

On a failure (tampered bytes, an upstream error, shutdown) the follower raises with the last
chunk unsent: the web layer aborts the connection, so a client never holds an unverified
archive whole (`Content-Length` is the expected size, so the short body is detectable).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

from proxy.errors import ShuttingDownError, VerificationError
from proxy.passthrough import Begin, PassThrough, Send

HOLD_BACK = 1 << 18  # the bytes at the end of an archive sent only once it is verified
READ_CHUNK = 1 << 18
T = TypeVar("T")


class GrowingFile:
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
            self.error = error if isinstance(error, Exception) else ShuttingDownError(
                "the proxy is shutting down and stopped this download; retry")
        self._wake()

    def relay(self) -> PassThrough:
        """The archive for one client, sent as it is written, its end held back until verified."""
        return PassThrough(self.sha256, self._follow)

    async def _follow(self, begin: Begin, send: Send) -> None:
        await begin(self.size)
        descriptor = await self._open()
        try:
            digest, sent = hashlib.sha256(), 0
            while sent < self.size:
                moved = self._moved
                end = self.size if self.verified else max(min(self.written, self.size - HOLD_BACK), 0)
                if sent < end:
                    chunk = await asyncio.to_thread(os.pread, descriptor, min(end - sent, READ_CHUNK), sent)
                    if not chunk:
                        raise VerificationError("the archive being downloaded is shorter than announced")
                    digest.update(chunk)
                    if sent + len(chunk) == self.size and digest.hexdigest() != self.sha256:
                        raise VerificationError(f"the downloaded archive does not hash to {self.sha256}")
                    await send(chunk)
                    sent += len(chunk)
                elif self.error is not None:
                    raise self.error
                else:
                    await moved.wait()
        finally:
            os.close(descriptor)

    async def _open(self) -> int:
        """A descriptor of the file, wherever it is now (the temp file, or where it was published)."""
        while True:
            moved, path = self._moved, self.path
            try:
                return await asyncio.to_thread(os.open, path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                if self.error is not None:
                    raise self.error from None
                if self.verified and path == self.path:
                    raise VerificationError("the downloaded archive vanished from the store") from None
            if path == self.path:
                await moved.wait()  # renamed, and `publish` has not told us where to yet

    def _wake(self) -> None:
        moved, self._moved = self._moved, asyncio.Event()
        moved.set()


class GrowingDownloads:
    """The growing files of this process by flight key, and the requests waiting for one to start."""

    def __init__(self) -> None:
        self._growing: dict[str, GrowingFile] = {}
        self._waiting: dict[str, list[asyncio.Future[GrowingFile]]] = {}

    def announce(self, key: str, growing: GrowingFile) -> None:
        self._growing[key] = growing
        for waiter in self._waiting.pop(key, []):
            if not waiter.done():
                waiter.set_result(growing)

    def withdraw(self, key: str, growing: GrowingFile) -> None:
        if self._growing.get(key) is growing:
            del self._growing[key]

    async def started(self, key: str) -> GrowingFile:
        """The growing file of `key`, as soon as one is announced."""
        growing = self._growing.get(key)
        if growing is not None:
            return growing
        waiter: asyncio.Future[GrowingFile] = asyncio.get_running_loop().create_future()
        waiters = self._waiting.setdefault(key, [])
        waiters.append(waiter)
        try:
            return await waiter
        finally:
            if waiter in waiters:
                waiters.remove(waiter)
            if not waiters and self._waiting.get(key) is waiters:
                del self._waiting[key]

    async def result_or_growing(self, key: str, flight: Awaitable[T]) -> T | GrowingFile:
        """What `flight` returns, or the growing download of `key` if it starts first (the flight goes on)."""
        result = asyncio.ensure_future(flight)
        growing = asyncio.ensure_future(self.started(key))
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
