"""A bounded in-process LRU in front of a persistent metadata store (write-through).

Warm requests then cost no thread hop or network round trip. Absences are remembered only
when `remember_absence` is set: right for the embedded store, which no other process
writes; wrong for Redis, where another replica may add a record at any moment.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncIterator

from proxy.cache import MetadataStore


class MemoryFront:
    """MetadataStore wrapper that remembers up to `max_entries` values."""

    def __init__(self, inner: MetadataStore, max_entries: int = 20_000, *, remember_absence: bool = False) -> None:
        self.inner = inner
        self._max = max_entries
        self._remember_absence = remember_absence
        self._values: OrderedDict[str, bytes | None] = OrderedDict()
        self._epoch = 0  # bumped by every set/delete, so a read that raced a write is not remembered

    async def get(self, key: str) -> bytes | None:
        if key in self._values:
            self._values.move_to_end(key)
            return self._values[key]
        seen = self._epoch
        value = await self.inner.get(key)
        if (value is not None or self._remember_absence) and self._epoch == seen:
            self._remember(key, value)
        return value

    async def get_many(self, keys: list[str]) -> list[bytes | None]:
        """Memory hits at once; every miss in one call to the inner store."""
        known = {key: self._values[key] for key in keys if key in self._values}
        for key in known:
            self._values.move_to_end(key)
        missing = [key for key in keys if key not in known]
        seen = self._epoch
        fetched = dict(zip(missing, await self.inner.get_many(missing), strict=True)) if missing else {}
        for key, value in fetched.items():
            if (value is not None or self._remember_absence) and self._epoch == seen:
                self._remember(key, value)
        return [known[key] if key in known else fetched[key] for key in keys]

    async def set(self, key: str, value: bytes, ttl: float | None = None) -> None:
        """Write through. `ttl` is passed to the inner store; the memory copy lives until evicted."""
        self._bump(key)
        await self.inner.set(key, value, ttl)
        self._bump(key)
        self._remember(key, value)

    async def delete(self, key: str) -> None:
        self._bump(key)
        self._values.pop(key, None)
        await self.inner.delete(key)
        self._bump(key)
        self._values.pop(key, None)

    def _bump(self, key: str) -> None:
        self._epoch += 1

    def keys(self, prefix: str = "") -> AsyncIterator[str]:
        return self.inner.keys(prefix)

    async def ping(self) -> bool:
        return await self.inner.ping()

    @property
    def problem(self) -> str | None:
        return self.inner.problem

    async def close(self) -> None:
        self._values.clear()
        await self.inner.close()

    def _remember(self, key: str, value: bytes | None) -> None:
        self._values[key] = value
        self._values.move_to_end(key)
        while len(self._values) > self._max:
            self._values.popitem(last=False)
