"""The embedded metadata store: one SQLite file in the data directory.

Built on aiohttp-client-cache's SQLite key-value class (aiosqlite underneath), so it
survives restarts: after one warm `init`, the same `init` works with the upstream down
even after the proxy restarted. Entries do not expire here; the freshness policy decides
what is served, and stale entries are kept for stale-if-error.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp_client_cache.backends.sqlite import SQLiteCache


class EmbeddedStore:
    """MetadataStore on a local SQLite file."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._cache = SQLiteCache(str(path), "metadata")

    async def get(self, key: str) -> bytes | None:
        value = await self._cache.read(key)
        return bytes(value) if value is not None else None

    async def get_many(self, keys: list[str]) -> list[bytes | None]:
        return [await self.get(key) for key in keys]

    async def set(self, key: str, value: bytes, ttl: float | None = None) -> None:
        await self._cache.write(key, value)

    async def delete(self, key: str) -> None:
        await self._cache.delete(key)

    async def keys(self, prefix: str = "") -> AsyncIterator[str]:
        async for key in self._cache.keys():
            if key.startswith(prefix):
                yield key

    async def ping(self) -> bool:
        try:
            await self._cache.contains("__ping__")
        except Exception:
            return False
        return True

    async def close(self) -> None:
        await self._cache.close()
