"""Single flight across the processes sharing one data dir: a lock file per key.

The worker processes of one `serve --workers N` (and any other process on the same data dir)
take `fcntl.flock` on `DATA_DIR/locks/<sha256 of the key>.lock` before fetching an artifact.
Like `proxy.metadata_store.redis.RedisFleetLocks`, a process that does not get the lock polls a
re-check (did the holder store the result?) and the lock, and takes over when it is free.
The lock is only ever tried without blocking, so the event loop never waits on it.

The kernel releases a crashed process's lock at once: no expiry, nothing to renew. The owner
removes the file before it releases the lock, so the directory holds only the locks in use;
a process that locked a file already removed (its path is gone or names a newer file) lets
it go and opens the path again.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


class FileLocks:
    """Fleet-wide single flight for the processes sharing a data dir (see module docstring)."""

    def __init__(self, directory: Path, *, poll: float = 0.05) -> None:
        self._directory = directory
        self._poll = poll

    def path(self, key: str) -> Path:
        """The lock file of `key`."""
        return self._directory / f"{hashlib.sha256(key.encode()).hexdigest()}.lock"

    @contextlib.asynccontextmanager
    async def hold(self, key: str, recheck: Callable[[], Awaitable[T | None]]) -> AsyncIterator[T | None]:
        """Yield an existing result found by `recheck`, or None when the caller must do the work
        (it owns the lock while the block runs)."""
        path = self.path(key)
        descriptor, existing = None, None
        try:
            while True:
                descriptor = descriptor if descriptor is not None else await asyncio.to_thread(_open, path)
                owned = _try_lock(descriptor)
                if owned and not _still_names(path, descriptor):  # removed by its last owner meanwhile
                    os.close(descriptor)
                    descriptor = None
                    continue
                existing = await recheck()
                if owned or existing is not None:
                    break
                await asyncio.sleep(self._poll)
            yield existing
        finally:
            if descriptor is not None:
                _release(path, descriptor)


def _open(path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


def _try_lock(descriptor: int) -> bool:
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _still_names(path: Path, descriptor: int) -> bool:
    """True while `path` is the file open as `descriptor` (not removed, not replaced)."""
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(descriptor)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def _release(path: Path, descriptor: int) -> None:
    """Remove the file if this process holds its lock, then unlock and close it."""
    try:
        if _try_lock(descriptor) and _still_names(path, descriptor):  # a held flock is re-taken at once
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
    finally:
        os.close(descriptor)  # closing the last descriptor releases the lock
