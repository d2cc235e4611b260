"""The archive store interface: what serving, publishing, the commands and eviction need of a backend.

Two backends implement it: `DiskStore` (a content-addressed directory, the default) and `S3Store`
(S3-compatible object storage). Both stage downloads in a local per-process temp directory
(`Staging`) and make content visible at its address (its SHA-256) only whole and only once verified
(`publish`, `publish_path`). Everything that reaches the objects is a coroutine of the caller's event
loop (the server's, or a command's `asyncio.run`); the staging methods are local and blocking (call
them from a worker thread where it matters).

What gc needs is said once for both: `list_objects` (archives), `leftovers` (temp dirs of dead
processes, unfinished uploads, old quarantined objects to remove; strays to report) and
`remove_leftover`; `open(claim=False)` opens a store for looking at it without changing anything.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Hashable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Protocol

from proxy.storage.objects import Leftover, ObjectCheck, ObjectInfo, StoredArchive
from proxy.storage.staging import PendingArchive


class ObjectReader(Protocol):
    """The bytes of the very copy a lookup saw, opened before a response's status line goes out."""

    size: int  # of the copy opened (a file changed since the lookup may have another)
    version: Hashable  # of the copy opened

    def chunks(self, size: int) -> AsyncIterator[bytes | memoryview]:
        """The span asked for, in chunks of at most `size` bytes, as they are read; fewer bytes in all
        only if the copy shrank while it was read. The caller checks what they hash to. A chunk may be a
        view of a buffer the reader reuses once no view of it is alive: drop it before asking for the next
        one, and the reader allocates nothing (one kept stays valid)."""
        ...

    def close(self) -> None: ...


class ArchiveStore(Protocol):
    """Verified archives by SHA-256."""

    local: bool  # published archives are files on this host (other processes may follow a download's temp file)
    adopts: bool  # a copy found at an address without a record may be hashed and used (not fetched again)
    root: Path  # the local directory: staging, temp files, download notices
    temp_root: Path  # every process's temp directory is in it
    temp_dir: Path  # this process's own (removed at close, or at the next start after a crash)

    async def open(self, *, claim: bool = True) -> None:
        """Open the store; with `claim` (a store written to) also this process's temp dir (dead processes'
        reaped) and, in object storage, abort uploads abandoned a day ago. Without it nothing is changed."""
        ...

    async def close(self) -> None: ...

    # ---- staging: local and blocking --------------------------------------------------------------

    def begin(self) -> PendingArchive:
        """A temp file for a new download, in this process's own temp directory."""
        ...

    def temp_path(self) -> Path:
        """A fresh path in this process's temp directory, for producers that write files themselves."""
        ...

    def temp_dirs(self) -> list[Path]: ...

    def abandoned_temp_dirs(self) -> list[Path]: ...

    def remove_temp_dir(self, path: Path) -> None: ...

    def is_writable(self) -> bool:
        """Whether the staging area takes a file now (for readiness)."""
        ...

    def path_for(self, sha256: str) -> Path:
        """Where a published archive's local file is (a local store), or would be staged (object storage)."""
        ...

    # ---- objects at content addresses ---------------------------------------------------------------

    async def get(self, sha256: str) -> StoredArchive | None:
        """The object at `sha256`'s address as it is now (None if there is none); ValueError for anything
        but a SHA-256 in hex."""
        ...

    async def publish(self, pending: PendingArchive, sha256: str) -> StoredArchive:
        """Publish a finished, verified temp file at its content address."""
        ...

    async def publish_path(self, path: Path, sha256: str) -> StoredArchive:
        """Publish a verified file of the temp directory at its content address (it is moved or removed)."""
        ...

    async def open_reader(self, stored: StoredArchive, start: int, length: int) -> ObjectReader:
        """A reader of `length` bytes from `start` of the very copy `stored` names; StoreCorruptionError if it
        is gone or was replaced since (the caller looks it up again)."""
        ...

    async def check(self, sha256: str, progress: Callable[[int], None] | None = None) -> ObjectCheck | None:
        """Hash the object at `sha256`'s address whole (None if there is none); `progress(n)` per chunk."""
        ...

    async def quarantine(self, sha256: str, version: Hashable | None = None) -> str | None:
        """Move the object at `sha256`'s address to the quarantine; where it went, or None if it is gone.
        With `version`, only that very copy is moved: a fresh one published meanwhile stays."""
        ...

    async def quarantined(self) -> list[Leftover]:
        """Every quarantined copy, with its size and when it was moved."""
        ...

    async def strays(self) -> list[str]:
        """What is kept where objects are but is not at a content address (never served)."""
        ...

    async def list_objects(self) -> list[ObjectInfo]:
        """Every object at a content address."""
        ...

    async def remove(self, sha256: str) -> int:
        """Delete the object at `sha256`'s address; the bytes freed (0 if there was none)."""
        ...

    async def leftovers(self, before: float) -> list[Leftover]:
        """What gc may remove besides archives (temp dirs of dead processes, unfinished uploads and copies
        quarantined before `before`) and the strays, which it only reports."""
        ...

    async def remove_leftover(self, item: Leftover) -> bool:
        """Remove one of `leftovers` (a temp dir only while still abandoned); whether it is gone. Strays stay."""
        ...

    def local_copy(self, sha256: str) -> AbstractAsyncContextManager[Path | None]:
        """A local file with the object's bytes while the block runs (None if there is none): the stored file
        itself, or a temporary download of the object, removed afterwards."""
        ...

    async def presign(self, stored: StoredArchive, expires: float) -> str | None:
        """A URL the client may GET the object from directly for `expires` seconds, or None if the backend
        has none (a local directory)."""
        ...


class ServedTimes(Protocol):
    """When archives were last served, fleet-wide: the eviction bookkeeping, kept where the metadata's
    connection is (a Redis sorted set, a table of the embedded file), not in the metadata store itself."""

    async def note_served(self, times: Mapping[str, float]) -> None:
        """Record when archives (by SHA-256) were last served (epoch seconds); a later time is never
        replaced by an earlier one. Skipped while the store is down."""
        ...

    async def served_times(self) -> dict[str, float]:
        """Every recorded last-served time by SHA-256; raises if the store cannot be read."""
        ...

    async def forget_served(self, sha256s: Iterable[str]) -> None:
        """Drop the last-served times of archives no longer stored."""
        ...
