"""Integrity of stored archives when they are looked up and served: never hand out a wrong archive whole.

- Every lookup compares the file's size with the verified record (`StoreGuard.lookup`).
- Every whole-file read hashes the very bytes it hands out and hands out the last chunk only
  once the file matched its content address (`StoreGuard.open`, `ArchiveReader.chunks`); a
  mismatch raises `StoreCorruptionError` before the body is complete, so the caller aborts the
  connection and the client sees a truncated body, which both CLIs reject. This holds on every
  serve, whatever was found before: a file changed in place while it is read (or rotted on the
  disk since it was last hashed) never goes out whole.
- A byte range cannot be checked on its own: the whole file is hashed first unless it is
  the very file (device, inode, size, mtime, ctime) last found intact (`StoreGuard.verify`).
- A file found at a content address without a record is hashed before it is adopted.

Whatever fails is moved to the quarantine, logged as `security.store_corruption` and
counted; its record still names the SHA-256, so the next lookup finds nothing and the
archive is fetched and verified from upstream again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import IO

import structlog

from proxy.errors import StoreCorruptionError
from proxy.metrics import Metrics
from proxy.singleflight import SingleFlight
from proxy.store import ArchiveStore, Identity, StoredArchive, identity

log = structlog.get_logger(__name__)


class StoreGuard:
    """Size checks, streaming hashes, whole-file verification and quarantine for one archive store."""

    local = True  # local files (followed across processes while they download)

    def __init__(self, store: ArchiveStore, metrics: Metrics) -> None:
        self.store = store
        self._metrics = metrics
        self._checks = SingleFlight()

    async def lookup(self, sha256: str, expected_size: int) -> StoredArchive | None:
        """The stored object if its size is the recorded one; a wrong size is quarantined (None)."""
        path = self.store.path_for(sha256)
        st = await asyncio.to_thread(_stat, path)
        if st is None:
            return None
        stored = StoredArchive(sha256, path, st.st_size)
        if st.st_size != expected_size:
            await self.corrupted(stored, "size", ident=identity(st), expected_size=expected_size)
            return None
        return stored

    async def adopt(self, sha256: str) -> StoredArchive | None:
        """A file already at `sha256`'s address (stored for another address, or before the metadata was
        lost), hashed before it is trusted; one that does not match is quarantined (None)."""
        result = await asyncio.to_thread(self.store.check, sha256)
        if result is None:
            return None
        if not result.intact:
            await self.corrupted(result.stored, "digest", ident=result.identity, actual=result.actual)
            return None
        return result.stored

    async def trusted(self, stored: StoredArchive) -> bool:
        """Whether the file is unchanged since it was last hashed and found intact."""
        return await asyncio.to_thread(self.store.is_verified, stored)

    async def verify(self, stored: StoredArchive) -> None:
        """Hash the whole file unless trusted (one hash per object at a time); raise if it is corrupt."""
        if await self.trusted(stored):
            return
        result = await self._checks.run(stored.sha256, lambda: asyncio.to_thread(self.store.check, stored.sha256))
        if result is not None and result.intact:
            return
        if result is not None:
            await self.corrupted(
                result.stored, "digest", ident=result.identity, actual=result.actual, expected_size=stored.size
            )
        raise _corrupt(stored)

    async def open(self, stored: StoredArchive, start: int, length: int) -> ArchiveReader:
        """A reader of `length` bytes from `start`, opened before the status line is sent: a file that is
        gone or has changed size since the lookup raises StoreCorruptionError (and can be looked up again)."""
        try:
            handle, st = await asyncio.to_thread(_open, stored.path)
        except FileNotFoundError:
            raise _corrupt(stored) from None
        if st.st_size != stored.size:
            handle.close()
            await self.corrupted(stored, "size", ident=identity(st), expected_size=stored.size)
            raise _corrupt(stored)
        whole = start == 0 and length == stored.size
        return ArchiveReader(self, stored, handle, identity(st), start, length, check=whole)

    async def corrupted(
        self,
        stored: StoredArchive,
        check: str,
        *,
        ident: Identity | None = None,
        actual: str | None = None,
        expected_size: int | None = None,
    ) -> None:
        """Quarantine a corrupt object, log `security.store_corruption` and count it.

        Nothing is logged when the file is gone already (another request quarantined it, or a
        fresh copy replaced it: `ident` names the corrupt file, so a fresh one is never moved).
        """
        try:
            moved = await asyncio.to_thread(self.store.quarantine, stored.sha256, ident)
            error = None
        except OSError as exc:
            moved, error = None, str(exc)
        if moved is None and error is None:
            return
        self._metrics.store_corruptions.labels(check).inc()
        size = ident[2] if ident is not None else stored.size
        log.error(
            "security.store_corruption",
            check=check,
            sha256=stored.sha256,
            path=str(stored.path),
            size=size,
            expected_size=stored.size if expected_size is None else expected_size,
            actual_sha256=actual,
            quarantined_to=str(moved) if moved else None,
            quarantine_error=error,
        )


class ArchiveReader:
    """Reads a span of a stored archive; with `check` (the whole file), it hashes every chunk it hands
    out and hands out the last one only once the whole file matched its SHA-256."""

    def __init__(
        self,
        guard: StoreGuard,
        stored: StoredArchive,
        handle: IO[bytes],
        ident: Identity,
        start: int,
        length: int,
        *,
        check: bool,
    ) -> None:
        self._guard = guard
        self._stored = stored
        self._handle = handle
        self._ident = ident
        self._start = start
        self._length = length
        self._check = check

    def chunks(self, size: int) -> AsyncGenerator[bytes, None]:
        """The span in chunks of at most `size` bytes; raises StoreCorruptionError on a mismatch."""
        return self._hashed_chunks(size) if self._check else self._plain_chunks(size)

    async def _hashed_chunks(self, size: int) -> AsyncGenerator[bytes, None]:
        """Chunks as `_plain_chunks` reads them, each hashed before it is handed out (in the event loop
        when it came from the page cache, in the reading thread otherwise): the digest covers exactly
        the bytes sent, whatever happens to the file meanwhile."""
        stored, digest, sent = self._stored, hashlib.sha256(), 0
        async with contextlib.aclosing(self._plain_chunks(size, digest)) as chunks:
            async for chunk in chunks:
                sent += len(chunk)
                if sent == self._length and digest.hexdigest() != stored.sha256:
                    await self._guard.corrupted(stored, "digest", ident=self._ident, actual=digest.hexdigest())
                    raise _corrupt(stored)
                yield chunk
        self._guard.store.remember_verified(stored.sha256, self._ident)

    async def _plain_chunks(self, size: int, digest: hashlib._Hash | None = None) -> AsyncGenerator[bytes, None]:
        """Chunks read one at a time (and added to `digest`, if given): straight from the page cache in
        the event loop when they are all there (`RWF_NOWAIT`), else in a worker thread. Either way the
        event loop runs between chunks: a client fast enough never to pause its writer must not keep
        the others waiting, and a connection lost in the meantime fails the next write."""
        fd, offset, end = self._handle.fileno(), self._start, self._start + self._length
        while offset < end:
            want = min(size, end - offset)
            chunk = _read_cached(fd, offset, want)
            if chunk is None:
                chunk = await _finish_in_thread(_read, fd, offset, want, digest)
            else:
                if digest is not None:
                    digest.update(chunk)  # hashlib releases the GIL: a worker thread would only add a hop
                await asyncio.sleep(0)
            if not chunk:
                raise await self._shrunk()
            offset += len(chunk)
            yield chunk

    async def _shrunk(self) -> StoreCorruptionError:
        stored = self._stored
        await self._guard.corrupted(stored, "size", ident=self._ident, expected_size=stored.size)
        return _corrupt(stored)

    def close(self) -> None:
        self._handle.close()


def _corrupt(stored: StoredArchive) -> StoreCorruptionError:
    return StoreCorruptionError(
        f"the stored copy of archive {stored.sha256} failed its integrity check and was quarantined; "
        "it is fetched and verified again on the next request"
    )


def _stat(path: Path) -> os.stat_result | None:
    try:
        return path.stat()
    except FileNotFoundError:
        return None


def _open(path: Path) -> tuple[IO[bytes], os.stat_result]:
    handle = open(path, "rb")  # noqa: SIM115 - closed by the caller
    return handle, os.fstat(handle.fileno())


async def _finish_in_thread(func: Callable[..., bytes], *args: object) -> bytes:
    """`func(*args)` in a worker thread; cancelled meanwhile, it waits for the call to return before it
    raises, so the caller never closes the file under a read still running in its thread."""
    running = asyncio.ensure_future(asyncio.to_thread(func, *args))
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        await asyncio.wait([running])
        raise


def _read(fd: int, offset: int, size: int, digest: hashlib._Hash | None) -> bytes:
    """One read, and the hash update of what was read (if any), in the same worker-thread hop."""
    chunk = os.pread(fd, size, offset)
    if digest is not None:
        digest.update(chunk)
    return chunk


def _read_cached(fd: int, offset: int, size: int) -> bytearray | None:
    """Up to `size` bytes at `offset` if the page cache has them (no disk wait), else None."""
    if _NOWAIT is None:
        return None
    buffer = bytearray(size)
    try:
        count = os.preadv(fd, [buffer], offset, _NOWAIT)
    except OSError:  # not all in the page cache (BlockingIOError), or no RWF_NOWAIT here: a thread reads
        return None
    if count <= 0:
        return None
    del buffer[count:]
    return buffer


_NOWAIT: int | None = getattr(os, "RWF_NOWAIT", None)  # Linux >= 4.14
