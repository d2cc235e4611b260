"""A metadata store wrapper for a full disk: failed writes are skipped, not request failures.

A write that fails because the disk is full (ENOSPC, SQLite's "database or disk is full")
is logged once per full-disk spell and skipped; the answer is still served (and the
in-memory front still remembers it). A read that fails for the same reason (a store that
could not even create its table) is a miss. Any other error propagates unchanged.
"""

from __future__ import annotations

import structlog

from proxy.metadata_store import MetadataStore, StoreWrapper
from proxy.storage import is_disk_full

log = structlog.get_logger(__name__)


class SkipWritesWhenFull(StoreWrapper):
    """MetadataStore wrapper that survives a full disk."""

    def __init__(self, inner: MetadataStore) -> None:
        super().__init__(inner)
        self._full = False

    async def get(self, key: str) -> bytes | None:
        try:
            return await self.inner.get(key)
        except Exception as exc:
            if not is_disk_full(exc):
                raise
            self._note_full(exc, "read", key)
            return None

    async def get_many(self, keys: list[str]) -> list[bytes | None]:
        try:
            return await self.inner.get_many(keys)
        except Exception as exc:
            if not is_disk_full(exc):
                raise
            self._note_full(exc, "read", keys[0] if keys else "")
            return [None] * len(keys)

    async def set(self, key: str, value: bytes, ttl: float | None = None) -> None:
        try:
            await self.inner.set(key, value, ttl)
        except Exception as exc:
            if not is_disk_full(exc):
                raise
            self._note_full(exc, "write", key)
            return
        if self._full:
            self._full = False
            log.info("storage.metadata_writes_resumed", key=key)

    async def delete(self, key: str) -> None:
        try:
            await self.inner.delete(key)
        except Exception as exc:
            if not is_disk_full(exc):
                raise
            self._note_full(exc, "delete", key)

    def _note_full(self, exc: Exception, operation: str, key: str) -> None:
        """Log the first failure of a full-disk spell."""
        if not self._full:
            self._full = True
            log.warning(
                "storage.metadata_write_skipped",
                operation=operation,
                key=key,
                error=str(exc),
                hint="the disk is full: answers are served but not cached until space is freed",
            )
