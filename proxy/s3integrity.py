"""Integrity of archives served from object storage: never hand out a wrong byte (`proxy.integrity` for S3).

- Every lookup compares the object's size (HEAD) with the verified record.
- Every whole-object read hashes what it streams and hands out the last chunk only once the
  object matched its content address; a mismatch raises `StoreCorruptionError` before the body
  is complete (the caller aborts the connection). This holds on every serve: an ETag found intact
  before says nothing about the bytes of this transfer (a faulty store or path can change them).
  Reads name the ETag of the object looked up (`If-Match`), so a replaced object is never read
  under it.
- A byte range is served only from an object found intact (hashed whole first unless its ETag
  was last found intact).
- A corrupt object is moved to `PREFIX/quarantine/` (copied, then deleted), logged as
  `security.store_corruption` and counted; its record still names the SHA-256, so the next
  lookup finds nothing and the archive is fetched and verified from upstream again.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncGenerator

import structlog

from proxy.errors import ProxyError, StoreCorruptionError, StoreUnavailableError
from proxy.metrics import Metrics
from proxy.s3store import RemoteArchive, S3ArchiveStore
from proxy.singleflight import SingleFlight

log = structlog.get_logger(__name__)


class S3Guard:
    """Size checks, streaming hashes, whole-object verification and quarantine for an S3 archive store."""

    local = False

    def __init__(self, store: S3ArchiveStore, metrics: Metrics) -> None:
        self.store = store
        self._metrics = metrics
        self._checks = SingleFlight()

    async def lookup(self, sha256: str, expected_size: int) -> RemoteArchive | None:
        """The stored object if its size is the recorded one; a wrong size is quarantined (None)."""
        stored = await self.store.head(sha256)
        if stored is None:
            return None
        if stored.size != expected_size:
            await self.corrupted(stored, "size", expected_size=expected_size)
            return None
        return stored

    async def adopt(self, sha256: str) -> None:
        """Objects without a record are not adopted from object storage: the archive is fetched again,
        verified, and its upload finds the same object there (nothing is uploaded twice)."""
        return None

    async def trusted(self, stored: RemoteArchive) -> bool:
        """Whether this very object (its ETag) was last hashed and found intact."""
        return self.store.is_verified(stored)

    async def verify(self, stored: RemoteArchive) -> None:
        """Hash the whole object unless trusted (one hash per object at a time); raise if it is corrupt."""
        if await self.trusted(stored):
            return
        result = await self._checks.run(stored.sha256, lambda: self.store.check_async(stored.sha256))
        if result is not None and result.intact and result.identity == stored.etag:
            return
        if result is not None and not result.intact:
            await self.corrupted(result.stored, "digest", actual=result.actual, expected_size=stored.size)
        raise _corrupt(stored)

    async def open(self, stored: RemoteArchive, start: int, length: int) -> RemoteReader:
        whole = start == 0 and length == stored.size
        return RemoteReader(self, stored, start, length, check=whole)

    async def presign(self, stored: RemoteArchive, expires: float) -> str:
        return await self.store.presign(stored, expires)

    async def present(self, stored: RemoteArchive) -> bool:
        """Whether the very object `stored` names (its ETag) is still at its address."""
        current = await self.store.head(stored.sha256)
        return current is not None and current.etag == stored.etag

    async def corrupted(
        self, stored: RemoteArchive, check: str, *, actual: str | None = None, expected_size: int | None = None
    ) -> None:
        """Quarantine a corrupt object (only the very object seen: its ETag), log `security.store_corruption`
        and count it; nothing is logged when it is gone already."""
        try:
            moved = await self.store.quarantine_async(stored.sha256, stored.etag)
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
            key=stored.key,
            size=stored.size,
            expected_size=stored.size if expected_size is None else expected_size,
            actual_sha256=actual,
            quarantined_to=moved,
            quarantine_error=error,
        )


class RemoteReader:
    """Streams a span of an object; with `check` (the whole object), it hashes every chunk and hands out
    the one that completes the object only once the whole object matched."""

    def __init__(self, guard: S3Guard, stored: RemoteArchive, start: int, length: int, *, check: bool) -> None:
        self._guard = guard
        self._stored = stored
        self._start = start
        self._length = length
        self._check = check

    async def chunks(self, size: int) -> AsyncGenerator[bytes, None]:
        """The span in chunks of at most `size` bytes; raises StoreCorruptionError on a mismatch."""
        stored, guard = self._stored, self._guard
        digest = hashlib.sha256() if self._check else None
        sent = 0
        stream = guard.store.stream(stored, self._start, self._length, size)
        try:
            async for chunk in _unavailable_on_failure(stream):
                chunk = chunk[: self._length - sent]
                sent += len(chunk)
                if digest is not None:
                    digest.update(chunk)  # hashlib releases the GIL on large chunks
                    if sent == self._length and digest.hexdigest() != stored.sha256:
                        await guard.corrupted(stored, "digest", actual=digest.hexdigest())
                        raise _corrupt(stored)
                if chunk:
                    yield chunk
                if sent == self._length:
                    break
        finally:
            await stream.aclose()
        if sent < self._length:
            await guard.corrupted(stored, "size", expected_size=stored.size)
            raise _corrupt(stored)
        if digest is not None:
            guard.store.remember_verified(stored.sha256, stored.etag)

    def close(self) -> None:
        """Nothing to release: the stream closes when its iteration ends."""


async def _unavailable_on_failure(chunks: AsyncGenerator[bytes, None]) -> AsyncGenerator[bytes, None]:
    """The chunks; a connection to the object store lost mid-body as StoreUnavailableError (the web layer
    then aborts the response: the body is never complete)."""
    try:
        async for chunk in chunks:
            yield chunk
    except ProxyError:
        raise
    except Exception as exc:
        raise StoreUnavailableError(f"reading from the archive store failed: {exc!r}") from exc


def _corrupt(stored: RemoteArchive) -> StoreCorruptionError:
    return StoreCorruptionError(
        f"the stored copy of archive {stored.sha256} failed its integrity check and was quarantined; "
        "it is fetched and verified again on the next request"
    )
