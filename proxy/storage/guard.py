"""Integrity of stored archives when they are looked up and served: never hand out a wrong archive whole.

One guard for every backend (docs/integrity.md#archive-stores):

- Every lookup compares the copy's size with the verified record (`ArchiveGuard.lookup`).
- Every whole read hashes the very bytes it hands out and hands out the last chunk only once
  the copy matched its content address (`ArchiveGuard.open`, `ArchiveReader.chunks`); a
  mismatch raises `StoreCorruptionError` before the body is complete, so the caller aborts the
  connection and the client sees a truncated body, which both CLIs reject. This holds on every
  serve, whatever was found before: a file changed in place while it is read, rotted since it
  was last hashed, or an object changed on its way from the object store never goes out whole.
  The first whole read of an archive in a process checks its SHA-256 and takes the BLAKE3 of the
  same bytes as the content's fingerprint; later reads check that fingerprint instead, the same
  proof (BLAKE3 is collision-resistant) for about a third of the CPU (`bench/serve_hash.py`).
- A byte range cannot be checked on its own: the whole copy is hashed first unless it is the
  very copy (its `version`: a file's identity, an object's ETag) last found intact in this
  process (`ArchiveGuard.verify`).
- A copy found at a content address without a record is hashed before it is adopted, where the
  backend adopts at all (`ArchiveGuard.adopt`).

Whatever fails is moved to the quarantine, logged as `security.store_corruption` and counted;
its record still names the SHA-256, so the next lookup finds nothing and the archive is fetched
and verified from upstream again.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncGenerator, Hashable, Mapping

import structlog
from blake3 import blake3

from proxy.domain.lru import Lru
from proxy.errors import StoreCorruptionError
from proxy.runtime.coalescing import SingleFlight
from proxy.runtime.metrics import Metrics
from proxy.storage.interface import ArchiveStore, ObjectReader
from proxy.storage.objects import StoredArchive

log = structlog.get_logger(__name__)
FOUND_INTACT = 100_000  # copies remembered as found intact, and contents' fingerprints (least recently remembered out)


class ArchiveGuard:
    """Size checks, hashes of what is served, whole-copy verification and quarantine for one archive store."""

    def __init__(self, store: ArchiveStore, metrics: Metrics) -> None:
        self.store = store
        self._metrics = metrics
        self._checks = SingleFlight()
        self._intact: Lru[str, Hashable] = Lru(FOUND_INTACT)  # a use: found intact (not a lookup)
        self._fingerprints: Lru[str, bytes] = Lru(FOUND_INTACT)

    async def lookup(self, sha256: str, expected_size: int) -> StoredArchive | None:
        """The stored copy if its size is the recorded one; a wrong size is quarantined (None)."""
        stored = await self.store.get(sha256)
        if stored is None:
            return None
        if stored.size != expected_size:
            await self.corrupted(stored, "size", expected_size=expected_size)
            return None
        return stored

    async def adopt(self, sha256: str) -> StoredArchive | None:
        """A copy already at `sha256`'s address (stored for another address, or before the metadata was
        lost), hashed before it is trusted; one that does not match is quarantined (None). A backend that
        adopts nothing answers None: the archive is fetched again."""
        if not self.store.adopts:
            return None
        result = await self.store.check(sha256)
        if result is None:
            return None
        if not result.intact:
            await self.corrupted(result.stored, "digest", actual=result.actual)
            return None
        self.remember_intact(result.stored)
        return result.stored

    def trusted(self, stored: StoredArchive) -> bool:
        """Whether this very copy (its version) was last hashed whole and found intact in this process."""
        return self._intact.get(stored.sha256) == stored.version

    async def verify(self, stored: StoredArchive) -> None:
        """Hash the whole copy unless trusted (one hash per object at a time); raise if it is corrupt, or if
        the copy changed since its lookup (looked up again)."""
        if self.trusted(stored):
            return
        result = await self._checks.run(stored.sha256, lambda: self.store.check(stored.sha256))
        if result is not None and result.intact:
            self.remember_intact(result.stored)
            if result.stored.version == stored.version:
                return
            raise StoreCorruptionError(
                f"archive {stored.sha256} changed in the store since its lookup; it is looked up again"
            )
        if result is not None:
            await self.corrupted(result.stored, "digest", actual=result.actual, expected_size=stored.size)
        raise _corrupt(stored)

    async def open(self, stored: StoredArchive, start: int, length: int) -> ArchiveReader:
        """A reader of `length` bytes from `start`, opened before the status line is sent: a copy that is
        gone, replaced or of another size since the lookup raises StoreCorruptionError (looked up again)."""
        reader = await self.store.open_reader(stored, start, length)
        if reader.size != stored.size:
            reader.close()
            opened = StoredArchive(stored.sha256, reader.size, reader.version, stored.location, stored.path)
            await self.corrupted(opened, "size", expected_size=stored.size)
            raise _corrupt(stored)
        whole = start == 0 and length == stored.size
        return ArchiveReader(self, stored, reader, length, check=whole)

    async def presign(self, stored: StoredArchive, expires: float) -> str | None:
        """A URL of the object for the client to fetch directly (`--archive-redirect`), or None if the
        backend has none."""
        return await self.store.presign(stored, expires)

    async def present(self, stored: StoredArchive) -> bool:
        """Whether the very copy `stored` names is still at its address."""
        current = await self.store.get(stored.sha256)
        return current is not None and current.version == stored.version

    async def corrupted(
        self, stored: StoredArchive, check: str, *, actual: str | None = None, expected_size: int | None = None
    ) -> None:
        """Quarantine a corrupt copy (only the very copy seen: its version), log `security.store_corruption`
        and count it.

        Nothing is logged when it is gone already (another request quarantined it, or a fresh copy
        replaced it, which is never moved)."""
        try:
            moved = await self.store.quarantine(stored.sha256, stored.version)
            error = None
        except Exception as exc:  # reported below; the request fails either way
            moved, error = None, str(exc)
        if moved is None and error is None:
            return
        self._metrics.store_corruptions.labels(check).inc()
        log.error(
            "security.store_corruption",
            check=check,
            sha256=stored.sha256,
            path=stored.location,
            size=stored.size,
            expected_size=stored.size if expected_size is None else expected_size,
            actual_sha256=actual,
            quarantined_to=moved,
            quarantine_error=error,
        )

    def remember_intact(self, stored: StoredArchive, fingerprint: bytes | None = None) -> None:
        """Note that this very copy was hashed whole and found intact (a range of it needs no hash first),
        and with `fingerprint` the BLAKE3 of the content that matched its SHA-256."""
        self._intact.put(stored.sha256, stored.version)
        if fingerprint is not None:
            self._fingerprints.put(stored.sha256, fingerprint)

    def body_check(self, sha256: str) -> BodyCheck:
        """What a whole body of `sha256` is checked with: its fingerprint once known (even if only while the
        body is sent), else its SHA-256."""
        return BodyCheck(sha256, self._fingerprints)


class ArchiveReader:
    """Reads a span of a stored copy; with `check` (the whole copy), it hashes every chunk it hands out
    and hands out the last one only once the whole copy matched its SHA-256."""

    def __init__(
        self, guard: ArchiveGuard, stored: StoredArchive, reader: ObjectReader, length: int, *, check: bool
    ) -> None:
        self._guard = guard
        self._stored = stored
        self._reader = reader
        self._length = length
        self._check = check

    async def chunks(self, size: int) -> AsyncGenerator[bytes | memoryview, None]:
        """The span in chunks of at most `size` bytes; raises StoreCorruptionError on a mismatch. A chunk
        dropped before the next is asked for lets the store's reader reuse its buffer (`ObjectReader`)."""
        stored, guard = self._stored, self._guard
        check = guard.body_check(stored.sha256) if self._check else None
        sent = 0
        async with contextlib.aclosing(self._reader.chunks(size)) as chunks:
            async for chunk in chunks:
                if len(chunk) > self._length - sent:  # (a slice copies: only when the reader gave more)
                    chunk = chunk[: self._length - sent]
                sent += len(chunk)
                if check is not None:
                    check.update(chunk)  # in the event loop: the hashes release the GIL, a thread would add a hop
                    if sent == self._length and not check.matches():
                        await guard.corrupted(self._opened(), "digest", actual=check.actual())
                        raise _corrupt(stored)
                if chunk:
                    yield chunk
                del chunk  # before the next read: the reader's buffer is reused only once no view of it is alive
                if sent == self._length:
                    break
        if sent < self._length:
            await guard.corrupted(self._opened(), "size", expected_size=stored.size)
            raise _corrupt(stored)
        if check is not None:
            guard.remember_intact(self._opened(), check.fingerprint())

    def _opened(self) -> StoredArchive:
        """The copy this reader opened (the one to quarantine, if it is corrupt)."""
        s = self._stored
        return StoredArchive(s.sha256, self._reader.size, self._reader.version, s.location, s.path)

    def close(self) -> None:
        self._reader.close()


class BodyCheck:
    """Hashes a whole body as it goes out: against its SHA-256, taking the BLAKE3 of the same bytes on the way
    (the content's fingerprint, once they matched); or, once this process knows the fingerprint, against it
    alone. A body that started out on its SHA-256 drops it as soon as another serve of the same content found
    the fingerprint (its BLAKE3 covers every byte from the first): serves that start while the first serve of
    an archive in this process is under way no longer take the SHA-256 to their end too."""

    def __init__(self, sha256: str, fingerprints: Mapping[str, bytes]) -> None:
        self._sha256 = sha256
        self._fingerprints = fingerprints
        self._fingerprint = fingerprints.get(sha256)
        self._digest = None if self._fingerprint is not None else hashlib.sha256()
        self._blake3 = blake3()

    def update(self, chunk: bytes | memoryview) -> None:
        if self._digest is not None:
            self._fingerprint = self._fingerprints.get(self._sha256)
            if self._fingerprint is None:
                self._digest.update(chunk)
            else:
                self._digest = None
        self._blake3.update(chunk)

    def matches(self) -> bool:
        if self._digest is None:
            return self._blake3.digest() == self._fingerprint
        return self._digest.hexdigest() == self._sha256

    def actual(self) -> str | None:
        """The SHA-256 of what was hashed, when it was taken (not when the fingerprint was checked instead)."""
        return None if self._digest is None else self._digest.hexdigest()

    def fingerprint(self) -> bytes:
        return self._blake3.digest()


def _corrupt(stored: StoredArchive) -> StoreCorruptionError:
    return StoreCorruptionError(
        f"the stored copy of archive {stored.sha256} failed its integrity check and was quarantined; "
        "it is fetched and verified again on the next request"
    )
