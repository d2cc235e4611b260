"""Content-addressed archive store on disk.

Layout: `ROOT/sha256/ab/cd/<sha256>`. Downloads are staged in this process's temp directory
(`proxy.storage.staging`), hashed while written, fsynced, and renamed into place only by `publish`
after the caller verified them: a partial or unverified file is never visible under its final name.
Files that fail verification after they were stored are moved to `ROOT/quarantine/<sha256>-<time>-<id>`.
A copy's `version` is its identity (device, inode, size, mtime, ctime): whatever writes or replaces
the file changes it. File I/O runs in worker threads; serving reads straight from the page cache in
the event loop when the pages are there.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Hashable
from pathlib import Path
from typing import IO

from proxy.errors import StoreCorruptionError
from proxy.storage.objects import (
    QUARANTINE,
    STRAY,
    Leftover,
    ObjectCheck,
    ObjectInfo,
    StoredArchive,
    checked_address,
    is_address,
    quarantine_name,
    quarantined_at,
)
from proxy.storage.read_buffer import ReadBuffer
from proxy.storage.staging import PendingArchive, Staged, Staging, fsync_path, hash_stream

Identity = tuple[int, int, int, int, int]
"""What changes whenever a file is written or replaced: (device, inode, size, mtime_ns, ctime_ns)."""


def identity(st: os.stat_result) -> Identity:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


class DiskStore(Staged):
    """Verified archives by SHA-256 in a directory."""

    local = True
    adopts = True

    def __init__(self, root: Path) -> None:
        self.root = root
        self.staging = Staging(root)
        self._objects = root / "sha256"
        self._quarantine = root / "quarantine"
        self._lock = threading.Lock()

    async def open(self, *, claim: bool = True) -> None:
        """Create the layout and claim this process's temp dir; without `claim` (a store only looked at: gc,
        verify), nothing: a directory needs no opening to be read."""
        if claim:
            await asyncio.to_thread(self._claim)

    def _claim(self) -> None:
        self._objects.mkdir(parents=True, exist_ok=True)
        self.staging.open()

    async def close(self) -> None:
        await asyncio.to_thread(self.staging.close)

    def path_for(self, sha256: str) -> Path:
        checked_address(sha256)
        return self._objects / sha256[:2] / sha256[2:4] / sha256

    # ---- objects --------------------------------------------------------------------------------

    async def get(self, sha256: str) -> StoredArchive | None:
        path = self.path_for(sha256)
        try:
            st = await asyncio.to_thread(path.stat)
        except FileNotFoundError:
            return None
        return _stored(sha256, path, st)

    async def publish(self, pending: PendingArchive, sha256: str) -> StoredArchive:
        return await self.publish_path(pending.path, sha256)

    async def publish_path(self, path: Path, sha256: str) -> StoredArchive:
        """Fsync and move a verified file from the temp directory to its content address (atomic rename)."""
        final = self.path_for(sha256)
        return await asyncio.to_thread(self._publish, path, sha256, final)

    @staticmethod
    def _publish(path: Path, sha256: str, final: Path) -> StoredArchive:
        with open(path, "rb+") as handle:
            os.fsync(handle.fileno())
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, final)
        fsync_path(final.parent)
        return _stored(sha256, final, final.stat())

    async def open_reader(self, stored: StoredArchive, start: int, length: int) -> FileReader:
        """The stored file, opened now; one removed (evicted, quarantined) or replaced by another file since its
        lookup is looked up again. A file changed in place is the same file: its reader has its size now."""
        path = self.path_for(stored.sha256)
        try:
            handle, st = await asyncio.to_thread(_open, path)
        except FileNotFoundError:
            raise _changed(stored, "left the store") from None
        if isinstance(stored.version, tuple) and (st.st_dev, st.st_ino) != stored.version[:2]:
            handle.close()
            raise _changed(stored, "was replaced in the store")
        return FileReader(handle, st, start, length)

    async def check(self, sha256: str, progress: Callable[[int], None] | None = None) -> ObjectCheck | None:
        return await asyncio.to_thread(self._check, sha256, progress)

    def _check(self, sha256: str, progress: Callable[[int], None] | None) -> ObjectCheck | None:
        path = self.path_for(sha256)
        try:
            handle, st = _open(path)
        except FileNotFoundError:
            return None
        with handle:
            actual = hash_stream(handle, progress)
        return ObjectCheck(_stored(sha256, path, st), actual)

    async def quarantine(self, sha256: str, version: Hashable | None = None) -> str | None:
        path = self.path_for(sha256)
        return await asyncio.to_thread(self._move_aside, path, sha256, version)

    def _move_aside(self, path: Path, sha256: str, version: Hashable | None) -> str | None:
        with self._lock:
            try:
                st = path.stat()
            except FileNotFoundError:
                return None
            if isinstance(version, tuple) and (st.st_dev, st.st_ino) != version[:2]:
                return None  # a fresh copy replaced the one found corrupt: it stays
            self._quarantine.mkdir(parents=True, exist_ok=True)
            target = self._quarantine / quarantine_name(sha256, uuid.uuid4().hex[:6])
            try:
                os.replace(path, target)
            except FileNotFoundError:
                return None
            fsync_path(path.parent)
            return str(target)

    async def quarantined(self) -> list[Leftover]:
        return await asyncio.to_thread(self._quarantined)

    def _quarantined(self) -> list[Leftover]:
        try:
            paths = sorted(p for p in self._quarantine.iterdir() if p.is_file())
        except FileNotFoundError:
            return []
        found = []
        for path in paths:
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            found.append(Leftover(QUARANTINE, str(path), st.st_size, quarantined_at(path.name, st.st_mtime)))
        return found

    def _files(self) -> list[Path]:
        """Every file under `ROOT/sha256/` (named by content or not), in a stable order."""
        return sorted(path for path in self._objects.rglob("*") if path.is_file())

    def _at_address(self, path: Path) -> bool:
        return is_address(path.name) and self.path_for(path.name) == path

    async def strays(self) -> list[str]:
        """Files under `ROOT/sha256/` that are not at their content address (never served)."""
        files = await asyncio.to_thread(self._files)
        return [str(path) for path in files if not self._at_address(path)]

    async def list_objects(self) -> list[ObjectInfo]:
        """Every object at its content address (files named otherwise are strays, not listed)."""
        return await asyncio.to_thread(self._list_objects)

    def _list_objects(self) -> list[ObjectInfo]:
        found = []
        for path in self._files():
            if not self._at_address(path):
                continue
            try:
                st = path.stat()
            except FileNotFoundError:
                continue  # removed meanwhile
            found.append(ObjectInfo(path.name, st.st_size, st.st_mtime))
        return found

    async def remove(self, sha256: str) -> int:
        """Delete the object at `sha256`'s address; the bytes freed (0 if there was none).

        A reader that opened the file before keeps reading it (POSIX); a later lookup finds nothing,
        so the archive is fetched and verified again."""
        return await asyncio.to_thread(self._remove, self.path_for(sha256))

    def _remove(self, path: Path) -> int:
        with self._lock:
            try:
                size = path.stat().st_size
                path.unlink()
            except FileNotFoundError:
                return 0
        fsync_path(path.parent)
        return size

    async def leftovers(self, before: float) -> list[Leftover]:
        """The temp dirs of dead processes (by their lock, whatever their age), files quarantined before
        `before`, and the strays (reported only)."""
        return await asyncio.to_thread(self._leftovers, before)

    def _leftovers(self, before: float) -> list[Leftover]:
        found = self.staging.leftovers()
        found += [item for item in self._quarantined() if item.since < before]
        for path in self._files():
            if self._at_address(path):
                continue
            with contextlib.suppress(FileNotFoundError):
                st = path.stat()
                found.append(Leftover(STRAY, str(path), st.st_size, st.st_mtime))
        return found

    async def remove_leftover(self, item: Leftover) -> bool:
        return await asyncio.to_thread(self._remove_leftover, item)

    def _remove_leftover(self, item: Leftover) -> bool:
        path = Path(item.name)
        if item.kind == QUARANTINE and path.parent == self._quarantine:
            path.unlink(missing_ok=True)
            return True
        return self.staging.remove_leftover(item)

    @contextlib.asynccontextmanager
    async def local_copy(self, sha256: str) -> AsyncIterator[Path | None]:
        stored = await self.get(sha256)
        yield None if stored is None else stored.path

    async def presign(self, stored: StoredArchive, expires: float) -> str | None:
        return None  # clients reach archives on disk through the proxy only


FAIR_SHARE = 1024 * 1024  # bytes one serve reads from the page cache before the event loop runs other work


class FileReader:
    """A span of an open stored file, read one chunk at a time: straight from the page cache in the event
    loop when the chunk is all there (`RWF_NOWAIT`), else in a worker thread. The event loop runs at least
    once per `FAIR_SHARE` bytes read: a client fast enough never to pause its writer must not keep the others
    waiting, and a connection lost in the meantime fails a write soon after. Not after every chunk: a turn of
    the loop per chunk (an `epoll_wait`, the whole stack of generators resumed) cost about 0.05 CPU s per GiB.

    Chunks are views of one buffer reused from chunk to chunk (`proxy.storage.read_buffer`): a chunk is
    read into it again only once no view of it is alive, so a caller that keeps a chunk keeps its bytes,
    and one that drops it before asking for the next reads without allocating."""

    def __init__(self, handle: IO[bytes], st: os.stat_result, start: int, length: int) -> None:
        self._handle = handle
        self.size = st.st_size
        self.version: Identity = identity(st)
        self._start = start
        self._length = length

    async def chunks(self, size: int) -> AsyncGenerator[memoryview, None]:
        fd, offset, end = self._handle.fileno(), self._start, self._start + self._length
        buffers = ReadBuffer(min(size, self._length))
        unshared = 0  # bytes read in the event loop since it last ran anything else
        while offset < end:
            want = min(size, end - offset)
            buffer = buffers.take()
            count = _read_cached(fd, buffer, want, offset)
            if count is None:
                count, unshared = await _finish_in_thread(_read_into, fd, buffer, want, offset), 0
            elif (unshared := unshared + count) >= FAIR_SHARE:
                await asyncio.sleep(0)
                unshared = 0
            if not count:
                return  # the file shrank: the caller sees fewer bytes than it asked for
            offset += count
            yield memoryview(buffer)[:count]  # no name keeps it here: once the caller drops it, the buffer is free

    def close(self) -> None:
        self._handle.close()


def _changed(stored: StoredArchive, what: str) -> StoreCorruptionError:
    return StoreCorruptionError(f"archive {stored.sha256} {what} since its lookup; it is looked up again")


def _stored(sha256: str, path: Path, st: os.stat_result) -> StoredArchive:
    return StoredArchive(sha256, st.st_size, identity(st), str(path), path)


def _open(path: Path) -> tuple[IO[bytes], os.stat_result]:
    handle = open(path, "rb")  # noqa: SIM115 - closed by the caller
    return handle, os.fstat(handle.fileno())


async def _finish_in_thread(func: Callable[..., int], *args: object) -> int:
    """`func(*args)` in a worker thread; cancelled meanwhile, it waits for the call to return before it
    raises, so the caller never closes the file (or reuses the buffer) under a read still running in its thread."""
    running = asyncio.ensure_future(asyncio.to_thread(func, *args))
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        await asyncio.wait([running])
        raise


def _read_into(fd: int, buffer: bytearray, size: int, offset: int, flags: int = 0) -> int:
    """Read up to `size` bytes at `offset` into the start of `buffer`; the count read (0 at the end)."""
    with memoryview(buffer) as view, view[:size] as target:
        return os.preadv(fd, [target], offset, flags)


def _read_cached(fd: int, buffer: bytearray, size: int, offset: int) -> int | None:
    """Up to `size` bytes at `offset` into `buffer` if the page cache has them (no disk wait): their count,
    else None."""
    if _NOWAIT is None:
        return None
    try:
        count = _read_into(fd, buffer, size, offset, _NOWAIT)
    except OSError:  # not all in the page cache (BlockingIOError), or no RWF_NOWAIT here: a thread reads
        return None
    return count if count > 0 else None


_NOWAIT: int | None = getattr(os, "RWF_NOWAIT", None)  # Linux >= 4.14
